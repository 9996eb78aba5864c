"""Model check: random operation sequences on every broker, compared with a plain model.

Each seed drives a few hundred steps of enqueue (a small pool of ids, so ids are
deduplicated, repeated inside a batch and re-used after ``remove``; several priorities;
delays of 0 or an hour), claim (long or tiny leases), complete, fail (retry now, retry
later, final, cancelled), release, renew, cancel, retry, remove, lease expiry with
``recover_stalled``, and re-sends of finishes that already took effect (plus stale
tokens). After every step the broker's answer, the state of every job of the pool and
the queue's counts must equal those of :class:`tests.model.QueueModel`.

Time is kept out of the comparison. Delays are an hour: on Redis (a real clock) they
never come due during a run; the embedded broker runs on a FakeClock that ``advance``
steps move past every delay so far, so promotion is checked there too. A tiny lease
(1 ms) has always run out by the next ``expire`` step, which sleeps 30 ms first; long
leases (10 min) never run out. So the expected answers never depend on timing.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
import pytest

from tests.conftest import EACH_BROKER
from tests.model import QueueFullError, QueueModel, Snapshot
from tests.support import TEST_DEADLINE, connected, msg
from typedq import JobState, QueueFull
from typedq.broker.base import (
    Broker,
    BrokerSettings,
    Completion,
    Failure,
    FinishOutcome,
    Release,
    Retention,
)
from typedq.broker.memory import MemoryBroker
from typedq.testing import FakeClock

pytestmark = pytest.mark.anyio

SEEDS = range(6)
STEPS = 300
POOL = [f"j{i}" for i in range(10)]
PRIORITIES = [-5, 0, 0, 0, 5]
MAX_STALLS = 1
MAX_QUEUE_LENGTH = 4
SHORT_LEASE = 0.001
LONG_LEASE = 600.0
DELAY = 3600.0


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
    """Picks the next operation from the model's state (seeded, so runs repeat)."""

    def __init__(self, seed: int, model: QueueModel, *, timed: bool) -> None:
        self.rng = random.Random(seed)
        self.model = model
        #: Whether the broker's clock can be moved (the embedded one with a FakeClock).
        self.timed = timed
        #: Every lease handed out: (job id, handle).
        self.leases: list[tuple[str, int]] = []
        #: Finishes that took effect, for re-sending.
        self.applied: list[Op] = []

    def record(self, op: Op, answer: object, handles: list[int]) -> None:
        """Remember the leases a claim handed out and the finishes that took effect."""
        if op.kind == "claim":
            self.leases.extend(
                (j.id, j.token) for j in self.model.jobs.values() if j.token in handles
            )
        elif op.kind in ("complete", "fail", "release") and answer == [FinishOutcome.OK]:
            self.applied.append(op)

    def _lease(self) -> tuple[str, int] | None:
        active = [
            (j.id, j.token)
            for j in self.model.jobs.values()
            if j.state is JobState.ACTIVE and j.token is not None
        ]
        if active and self.rng.random() < 0.85:
            return self.rng.choice(active)
        return self.rng.choice(self.leases) if self.leases else None

    def _ids(self, most: int, prefer: tuple[JobState, ...] = ()) -> tuple[str, ...]:
        liked = [j.id for j in self.model.jobs.values() if j.state in prefer]
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
        if self.timed:
            kinds.append("advance")
            weights.append(3)
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
        if kind in ("expire", "advance"):
            return Op(kind)
        if self.applied:
            return rng.choice(self.applied)  # a re-send of a finish that took effect
        return Op("enqueue", batch=((rng.choice(POOL), 0, False),))


def model_answer(model: QueueModel, op: Op) -> object:
    """What the model says a broker must answer to ``op`` (and apply it to the model)."""
    if op.kind == "enqueue":
        try:
            return model.enqueue(list(op.batch))
        except QueueFullError:
            return "QueueFull"
    if op.kind == "claim":
        claimed = model.claim(op.limit, short_lease=op.short)
        return [(i, model.jobs[i].attempt, model.jobs[i].stalls) for i, _ in claimed]
    if op.kind == "complete":
        return [model.complete(*op.leases[0])]
    if op.kind == "fail":
        return [model.fail(*op.leases[0], op.mode)]
    if op.kind == "release":
        return [model.release(*op.leases[0])]
    if op.kind == "renew":
        return model.renew(list(op.leases))
    if op.kind == "cancel":
        return model.cancel(op.ids[0])
    if op.kind == "retry":
        return model.retry(list(op.ids))
    if op.kind == "remove":
        return model.remove(list(op.ids), op.states)
    if op.kind == "advance":
        model.advance()
        return None
    assert op.kind == "expire"
    return model.expire()


class Driver:
    """Applies operations to a real broker and answers in the model's terms."""

    def __init__(self, broker: Broker, clock: FakeClock | None) -> None:
        self.broker = broker
        self.clock = clock
        #: Model handle -> the broker's token for that claim.
        self.tokens: dict[int, str] = {}

    def _token(self, handle: int) -> str:
        return self.tokens.get(handle, f"never-issued-{handle}")

    async def apply(self, op: Op, handles: list[int]) -> object:
        broker = self.broker
        if op.kind == "enqueue":
            messages = [
                msg(job_id=i, priority=p, delay=DELAY if delayed else 0.0)
                for i, p, delayed in op.batch
            ]
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
        if op.kind == "advance":
            assert self.clock is not None
            self.clock.advance(DELAY + 1)
            return None
        assert op.kind == "expire"
        await anyio.sleep(0.03)  # every tiny lease (1 ms) has run out
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
        the order listed, the others sorted, as ``QueueModel.listing``)."""
        ids: list[str] = []
        cursor: str | None = None
        while True:
            page = await self.broker.page_jobs("q", state, cursor=cursor, limit=3)
            ids += page.ids
            if page.cursor is None:
                return ids if state is JobState.WAITING else sorted(ids)
            assert len(page.ids) == 3, "a short page before the end"
            cursor = page.cursor

    async def listing_by_offset(self, state: JobState) -> list[str]:
        """The same by ``list_jobs`` offsets, advancing by each page's length until an
        empty page (issue 24 defect 6: Redis's offsets counted stale entries)."""
        ids: list[str] = []
        while page := await self.broker.list_jobs("q", state, offset=len(ids), limit=3):
            ids += page
        return ids if state is JobState.WAITING else sorted(ids)


def _trace(ops: list[Op]) -> str:
    return "\n".join(f"  {n:3d}: {op!r}" for n, op in enumerate(ops))


@contextlib.asynccontextmanager
async def open_broker(
    app_name: str, broker_url: str
) -> AsyncIterator[tuple[Broker, FakeClock | None]]:
    """The broker under test; the embedded one runs on a fake clock the test moves."""
    if not broker_url.startswith("memory"):
        async with connected(
            app_name, broker_url, max_stalls=MAX_STALLS, max_queue_length=MAX_QUEUE_LENGTH
        ) as broker:
            yield broker, None
        return
    clock = FakeClock()
    forever = 100 * 365 * 24 * 3600.0  # no finished job expires however far time moves
    settings = BrokerSettings(
        namespace=app_name,
        max_stalls=MAX_STALLS,
        max_queue_length=MAX_QUEUE_LENGTH,
        retention=Retention(completed_ttl=forever, failed_ttl=forever),
    )
    memory = MemoryBroker(settings, clock=clock)
    await memory.connect()
    try:
        with anyio.fail_after(TEST_DEADLINE):
            yield memory, clock
    finally:
        await memory.close()


# The same seed drives the embedded broker (on a FakeClock) down the same path under trio
# as under asyncio: once per broker is enough.
@pytest.mark.parametrize("_broker_backend", EACH_BROKER, indirect=True)
@pytest.mark.parametrize("seed", SEEDS)
async def test_broker_follows_the_model(app_name: str, broker_url: str, seed: int) -> None:
    model = QueueModel(max_stalls=MAX_STALLS, max_queue_length=MAX_QUEUE_LENGTH)
    ops: list[Op] = []
    async with open_broker(app_name, broker_url) as (broker, clock):
        generator = Generator(seed, model, timed=clock is not None)
        driver = Driver(broker, clock)
        for step in range(STEPS):
            op = generator.next()
            ops.append(op)
            handles_before = model.handles
            expected = model_answer(model, op)
            handles = list(range(handles_before + 1, model.handles + 1))
            actual = await driver.apply(op, handles)
            where = f"seed {seed}, step {step}: {op!r}\ntrace:\n{_trace(ops)}"
            assert actual == expected, f"answer differs at {where}"
            generator.record(op, expected, handles)
            want = {job_id: model.snapshot(job_id) for job_id in POOL}
            assert await driver.snapshots() == want, f"job states differ at {where}"
            assert await driver.counts() == model.counts(), f"counts differ at {where}"
            for state in JobState:
                expected = model.listing(state)
                listed = await driver.listing(state)
                assert listed == expected, f"{state.value} pages differ at {where}"
                listed = await driver.listing_by_offset(state)
                assert listed == expected, f"{state.value} offset pages differ at {where}"
