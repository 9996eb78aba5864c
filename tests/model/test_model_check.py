"""Model check: random operation sequences on Redis and Cluster, step by step against
the embedded broker, the reference statement of the rules.

Each seed drives a few hundred steps of enqueue (a small pool of ids, so ids are
deduplicated, repeated inside a batch and re-used after ``remove``; several priorities;
delays of 0 or an hour), claim (long or tiny leases), complete, fail (retry now, retry
later, final, cancelled), release, renew, cancel, retry, remove, lease expiry with
``recover_stalled``, and re-sends of finishes that already took effect (plus stale
tokens). Each step runs on the reference (the embedded broker) and on the broker under
test; after every step both answers, the state of every job of the pool, the queue's
counts and each state's ids (paged by cursor and by offset) must be equal. The program
picks its next step from the reference's state.

Time is kept out of the comparison. Delays are an hour, so they never come due during a
run. A tiny lease (1 ms) has run out on both brokers by the next ``expire`` step, which
waits until 30 ms have passed since the last claim with one; long leases (10 min) never
run out. So the answers never depend on timing. (The embedded broker itself is held to the contract suite, tests/contract.)
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import anyio
import msgspec
import pytest

from tests.redis_support import server_url
from tests.support import TEST_DEADLINE, connected, msg
from typedq import JobState, QueueFull
from typedq.broker.base import (
    Broker,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    Release,
)

pytestmark = pytest.mark.anyio

SEEDS = range(6)
FAIR_SEEDS = range(100, 112)
STEPS = 300
POOL = [f"j{i}" for i in range(10)]
PRIORITIES = [-5, 0, 0, 0, 5]
MAX_STALLS = 1
#: A seed's run (300 steps, each compared over every view): a few seconds on a quiet
#: box, bounded well above what a loaded one takes (PostgreSQL's took ~16 s there).
SEED_DEADLINE = TEST_DEADLINE * 4
MAX_QUEUE_LENGTH = 4
SHORT_LEASE = 0.001
LONG_LEASE = 600.0
DELAY = 3600.0
#: The fair runs (typedq.fair): the key of each pool id (None: a plain job), and the
#: weights a key's jobs take in turn, one per enqueued job of the key (the task's weights
#: changing while the key has jobs waiting: its newest job's applies from its next turn).
FAIR_KEYS = {"j0": "a", "j1": "a", "j2": "a", "j3": "a", "j4": "b", "j5": "b", "j6": "c"}
FAIR_WEIGHTS = {"a": (2, 2, 1, 3), "b": (1, 1, 2)}


#: What is compared of one job: state, attempt, stalls, cancel requested, priority.
Snapshot = tuple[JobState, int, int, bool, int] | None


@dataclass(frozen=True)
class Op:
    """One step; its repr is the trace printed when a run diverges.

    In the trace ``j3@-5+1h`` is job j3 at priority -5 delayed by an hour, and
    ``j3#7`` the lease of model handle 7 (the 7th claim of the run) on job j3.
    """

    kind: str
    batch: tuple[tuple[str, int, bool], ...] = ()
    ids: tuple[str, ...] = ()
    #: (job id, model handle) pairs: which lease a finish or renew speaks for.
    leases: tuple[tuple[str, int], ...] = ()
    limit: int = 0
    short: bool = False
    mode: str = ""
    states: frozenset[JobState] | None = None

    def __repr__(self) -> str:
        if self.kind == "enqueue":
            jobs = (f"{i}@{p}{'+1h' if d else ''}" for i, p, d in self.batch)
            return f"enqueue [{', '.join(jobs)}]"
        if self.kind == "claim":
            return f"claim {self.limit} ({'tiny' if self.short else 'long'} lease)"
        if self.leases:
            leases = ", ".join(f"{i}#{h}" for i, h in self.leases)
            return f"{self.kind} {leases}{' ' + self.mode if self.mode else ''}"
        if self.kind == "remove" and self.states is not None:
            wanted = ",".join(sorted(s.value for s in self.states))
            return f"remove {list(self.ids)} in {{{wanted}}}"
        return f"{self.kind} {list(self.ids)}" if self.ids else self.kind


class Generator:
    """Picks the next operation from the reference's state (seeded, so runs repeat)."""

    def __init__(self, seed: int, *, fair: bool = False) -> None:
        self.rng = random.Random(seed)
        #: Fair runs (typedq.fair) take every step the plain ones do: hand-backs
        #: (release, stall recovery) and retries (now, later, an operator's) of fair
        #: jobs keep their key's place, and plain jobs handed back among the keys'
        #: turns find theirs, the same on both brokers (docs/flow-control.md).
        self.fair = fair
        #: Every lease handed out: (job id, handle).
        self.leases: list[tuple[str, int]] = []
        #: Each job's latest lease: while the job is active, the one that holds it.
        self.latest: dict[str, int] = {}
        #: Finishes that took effect, for re-sending.
        self.applied: list[Op] = []
        #: The reference's job states as of the last step (None: no such job).
        self.states: dict[str, JobState | None] = dict.fromkeys(POOL)

    def record(self, op: Op, answer: object, handles: list[int]) -> None:
        """Remember the leases a claim handed out and the finishes that took effect."""
        if op.kind == "claim":
            assert isinstance(answer, list)
            for handle, (job_id, _, _) in zip(handles, answer, strict=False):
                self.leases.append((job_id, handle))
                self.latest[job_id] = handle
        elif op.kind in ("complete", "fail", "release") and answer == [FinishOutcome.OK]:
            self.applied.append(op)

    def _lease(self) -> tuple[str, int] | None:
        active = [
            (job_id, self.latest[job_id])
            for job_id, state in self.states.items()
            if state is JobState.ACTIVE and job_id in self.latest
        ]
        if active and self.rng.random() < 0.85:
            return self.rng.choice(active)
        return self.rng.choice(self.leases) if self.leases else None

    def _ids(self, most: int, prefer: tuple[JobState, ...] = ()) -> tuple[str, ...]:
        liked = [job_id for job_id, state in self.states.items() if state in prefer]
        n = self.rng.randint(1, most)
        if liked and self.rng.random() < 0.7:
            return tuple(self.rng.choice(liked) for _ in range(n))
        return tuple(self.rng.choice(POOL) for _ in range(n))

    def next(self) -> Op:
        rng = self.rng
        kinds = [
            "enqueue",
            "claim",
            "complete",
            "fail",
            "release",
            "renew",
            "cancel",
            "retry",
            "remove",
            "expire",
            "resend",
        ]
        weights = [22, 14, 10, 10, 4, 3, 6, 5, 9, 5, 6]
        kind = rng.choices(kinds, weights)[0]
        if kind == "enqueue":
            batch = tuple(
                (rng.choice(POOL), rng.choice(PRIORITIES), rng.random() < 0.15)
                for _ in range(rng.choice([1, 1, 2, 3, 4]))
            )
            return Op("enqueue", batch=batch)
        if kind == "claim":
            return Op("claim", limit=rng.randint(1, 3), short=rng.random() < 0.5)
        if kind in ("complete", "fail", "release"):
            lease = self._lease()
            if lease is None:
                return Op("claim", limit=1)
            mode = rng.choice(["retry", "retry", "retry-later", "final", "cancelled"])
            return Op(kind, leases=(lease,), mode=mode if kind == "fail" else "")
        if kind == "renew":
            got = [lease for _ in range(rng.randint(1, 2)) if (lease := self._lease())]
            return Op("renew", leases=tuple(got)) if got else Op("claim", limit=2)
        if kind == "cancel":
            return Op("cancel", ids=self._ids(1, (JobState.WAITING, JobState.ACTIVE)))
        if kind == "retry":
            return Op("retry", ids=self._ids(2, (JobState.FAILED, JobState.CANCELLED)))
        if kind == "remove":
            states = None
            if rng.random() < 0.5:
                states = frozenset(s for s in JobState if rng.random() < 0.5)
            return Op("remove", ids=self._ids(2, tuple(JobState)), states=states)
        if kind == "expire":
            return Op(kind)
        if self.applied:
            return rng.choice(self.applied)  # a re-send of a finish that took effect
        return Op("enqueue", batch=((rng.choice(POOL), 0, False),))


class Driver:
    """Applies operations to one broker; a claim's leases get the handles it is given."""

    def __init__(self, broker: Broker, *, fair: bool = False) -> None:
        self.broker = broker
        #: Fair runs: the pool's jobs carry FAIR_KEYS (waiting listings compare as sets:
        #: the brokers list a fair key's jobs in different places).
        self.fair = fair
        #: Model handle -> the broker's token for that claim.
        self.tokens: dict[int, str] = {}
        #: Fair runs: messages made per key so far (picks the key's next weight).
        self.made: dict[str, int] = {}

    def _message(self, job_id: str, priority: int, delayed: bool) -> JobMessage:
        m = msg(job_id=job_id, priority=priority, delay=DELAY if delayed else 0.0)
        key = FAIR_KEYS.get(job_id) if self.fair else None
        if key is None:
            return m
        weights = FAIR_WEIGHTS.get(key, (1,))
        made = self.made[key] = self.made.get(key, -1) + 1
        return msgspec.structs.replace(m, fair_key=key, fair_weight=weights[made % len(weights)])

    def _token(self, handle: int) -> str:
        return self.tokens.get(handle, f"never-issued-{handle}")

    async def apply(self, op: Op, handles: list[int]) -> object:
        broker = self.broker
        if op.kind == "enqueue":
            messages = [self._message(i, p, delayed) for i, p, delayed in op.batch]
            try:
                return [o.created for o in await broker.enqueue(messages)]
            except QueueFull:
                return "QueueFull"
        if op.kind == "claim":
            lease = SHORT_LEASE if op.short else LONG_LEASE
            claimed = await broker.claim(["q"], op.limit, worker_id="w", lease=lease)
            for handle, job in zip(handles, claimed, strict=False):
                self.tokens[handle] = job.token
            return [(c.message.id, c.attempt, c.stalls) for c in claimed]
        if op.kind in ("complete", "fail", "release"):
            ((job_id, handle),) = op.leases
            token = self._token(handle)
            if op.kind == "complete":
                return await broker.complete([Completion(job_id, token, b"\x01")])
            if op.kind == "release":
                return await broker.release([Release(job_id, token)])
            retry_delay = {"retry": 0.0, "retry-later": DELAY}.get(op.mode)
            failure = Failure(
                id=job_id,
                token=token,
                error=b"\x90",
                retry_delay=retry_delay,
                cancelled=op.mode == "cancelled",
            )
            return await broker.fail([failure])
        if op.kind == "renew":
            leases = [(i, self._token(h)) for i, h in op.leases]
            return await broker.renew(leases, LONG_LEASE)
        if op.kind == "cancel":
            return await broker.cancel(op.ids[0])
        if op.kind == "retry":
            return await broker.retry(list(op.ids))
        if op.kind == "remove":
            states = None if op.states is None else sorted(op.states)
            return await broker.remove(list(op.ids), states=states)
        assert op.kind == "expire"
        return await broker.recover_stalled()

    async def snapshots(self) -> dict[str, Snapshot]:
        records = await self.broker.get(POOL)
        return {
            job_id: None
            if r is None
            else (r.state, r.attempt, r.stalls, r.cancel_requested, r.message.priority)
            for job_id, r in zip(POOL, records, strict=True)
        }

    async def counts(self) -> dict[JobState, int]:
        counts = await self.broker.counts("q")
        return {state: counts.get(state, 0) for state in JobState}

    async def listing(self, state: JobState) -> list[str]:
        """Every id of ``state``, walked by ``page_jobs`` cursor 3 at a time (waiting in
        the order listed, the others sorted: their order is not part of the contract)."""
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.broker.page_jobs("q", state, cursor=cursor, limit=3)
            ids += page.ids
            if page.cursor is None:
                return ids if state is JobState.WAITING and not self.fair else sorted(ids)
            assert len(page.ids) == 3, "a short page before the end"
            cursor = page.cursor

    async def listing_by_offset(self, state: JobState) -> list[str]:
        """The same by ``list_jobs`` offsets, advancing by each page's length until an
        empty page (issue 24 defect 6: Redis's offsets counted stale entries)."""
        ids: list[str] = []
        while page := await self.broker.list_jobs("q", state, offset=len(ids), limit=3):
            ids += page
        return ids if state is JobState.WAITING and not self.fair else sorted(ids)


def _trace(ops: list[Op]) -> str:
    return "\n".join(f"  {n:3d}: {op!r}" for n, op in enumerate(ops))


async def step_views(driver: Driver) -> tuple[object, ...]:
    """Everything compared after a step: job states, counts, and each state's ids paged
    by cursor and by offset.

    The reads run concurrently (the state is at rest between steps, so their order does
    not matter): on Redis a step's ~16 reads then cost a few round trips' wait, not 16.
    """
    by_cursor: dict[JobState, list[str]] = {}
    by_offset: dict[JobState, list[str]] = {}

    async def cursor_walk(state: JobState) -> None:
        by_cursor[state] = await driver.listing(state)

    async def offset_walk(state: JobState) -> None:
        by_offset[state] = await driver.listing_by_offset(state)

    async with anyio.create_task_group() as tg:
        for state in JobState:
            tg.start_soon(cursor_walk, state)
            tg.start_soon(offset_walk, state)
        snapshots = await driver.snapshots()
        counts = await driver.counts()
    listings = []
    for state in JobState:
        listings.append((state, by_cursor[state]))
        listings.append((state, by_offset[state]))
    return snapshots, counts, listings


@pytest.mark.redis
@pytest.mark.asyncio_only
@pytest.mark.parametrize("seed", SEEDS)
async def test_broker_follows_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    # Cluster's run of the same seeds: tests/model/test_model_check_cluster.py (a file of
    # its own, so that `--dist loadfile` runs the two halves on two processes).
    await check_seed(request, app_name, "redis", seed)


@pytest.mark.redis
@pytest.mark.asyncio_only
@pytest.mark.parametrize("seed", FAIR_SEEDS)
async def test_fair_shares_follow_the_reference(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    """The same with fair jobs (typedq.fair): keys a and b (their weights changing from
    one enqueued job to the next), c, and plain ones."""
    await check_seed(request, app_name, "redis", seed, fair=True)


async def check_seed(
    request: pytest.FixtureRequest, app_name: str, backend: str, seed: int, *, fair: bool = False
) -> None:
    """Runs seed ``seed``'s operations on ``backend`` (``redis`` or ``cluster``) and on the
    embedded broker step by step; fails at the first step whose answers or views differ."""
    url = server_url(request, backend)
    generator = Generator(seed, fair=fair)
    ops: list[Op] = []
    handles_issued = 0
    last_short_claim = -1.0
    async with (
        connected(
            f"{app_name}-ref",
            "memory://",
            max_stalls=MAX_STALLS,
            max_queue_length=MAX_QUEUE_LENGTH,
            deadline=SEED_DEADLINE,
        ) as reference_broker,
        connected(
            app_name,
            url,
            max_stalls=MAX_STALLS,
            max_queue_length=MAX_QUEUE_LENGTH,
            deadline=SEED_DEADLINE,
        ) as tested_broker,
    ):
        reference = Driver(reference_broker, fair=fair)
        tested = Driver(tested_broker, fair=fair)
        for step in range(STEPS):
            op = generator.next()
            ops.append(op)
            where = f"seed {seed}, step {step}: {op!r}\ntrace:\n{_trace(ops)}"
            if op.kind == "expire":
                # Every tiny lease (1 ms) has run out, by either broker's clock: 30 ms
                # since the last claim with one (often past already: steps take time).
                await anyio.sleep(max(0.0, last_short_claim + 0.03 - time.monotonic()))
            handles = list(range(handles_issued + 1, handles_issued + 1 + op.limit))
            expected = await reference.apply(op, handles)
            actual = await tested.apply(op, handles)
            if op.kind == "claim" and op.short:
                last_short_claim = time.monotonic()
            assert actual == expected, f"answer differs at {where}"
            if op.kind == "claim":
                assert isinstance(expected, list)
                handles_issued += len(expected)
            generator.record(op, expected, handles)
            want = await step_views(reference)
            assert await step_views(tested) == want, f"state differs at {where}"
            generator.states = {
                job_id: None if snap is None else snap[0]
                for job_id, snap in (await reference.snapshots()).items()
            }
