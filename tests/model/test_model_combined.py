"""Combined model check: features that meet, on every broker, step by step (issue 24).

Random programs (one per seed) mix what the defects of issue 24 lived between: several
queues, a partitioned queue sharing ``max_queue_length``, concurrency limits with keys and
a rate limit, chains across queues (across slots on Redis Cluster) and fan-outs with a
callback or a collector, fair shares (keys with weights that change from job to job, one
fair task behind a keyed concurrency limit, a fan-out of fair members), schedules fired
tick by tick with the overlap policies (one on the partitioned queue; now and then
against a stale state), unique windows and debounce by key (a job holding its key
until purged, removed, cancelled or finished, a debounced one replaced), priorities,
delays, dedup by
id (a small pool of ids, reused after removal), claims, completions, failures (retried or
final), and the operators' cancel, retry, remove and purge. Each program runs in
lockstep on the embedded broker, the reference, and on the broker under test (a single
Redis, a local Redis Cluster, PostgreSQL: test_model_combined_pg.py); after every step the two answers must be equal, and so
must every job's state and attempt, every queue's counts and, page by page
(``page_jobs``), the ids in every state (which ids: their order is held by the claims'
answers). On Cluster the program leaves out what docs/brokers.md documents Cluster does
differently (for_cluster).

Time is kept out of the comparison: delays are an hour and leases ten minutes (nothing
comes due or expires during a run), and the rate limit allows two starts an hour (what
it refuses, it refuses for the rest of the run). On a mismatch the failure names the
seed, the step and a shrunk program (delta debugging, tests/model_combined_shrink.py).
``python -m tests.model.test_model_combined SEED [STEPS]`` prints a seed's program, and with
``--url URL [--cluster]`` replays it against a Redis (or Cluster) and shrinks a mismatch.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from tests.model_combined_shrink import shrink
from tests.redis_support import server_url
from tests.support import TEST_DEADLINE, connected
from typedq import JobState
from typedq.broker.base import (
    Broker,
    BrokerSettings,
    Completion,
    EnqueueControl,
    Failure,
    JobMessage,
    TickFiring,
)
from typedq.broker.capabilities import FlowControl
from typedq.broker.flow import FlowSpec, member_id, step_id
from typedq.broker.memory import MemoryBroker
from typedq.limits import LimitSpec
from typedq.names import partition_queue
from typedq.options import MAX_PRIORITY, MIN_PRIORITY

pytestmark = pytest.mark.anyio

SEEDS = range(16)
STEPS = 200
QUEUES = ("q", "r", "pq.p0", "pq.p1", "pq.p2")
PARTITIONS = {"pq": 3}
MAX_QUEUE_LENGTH = 6  # 2 per partition of pq
# Job ids are unique per queue on Redis and per app on the embedded broker (docs/brokers.md):
# each id belongs to one queue here (a pq id to one partition, as the id's hash would).
POOL = {
    "q": [f"qj{i}" for i in range(4)],
    "r": [f"rj{i}" for i in range(4)],
    "pq": [f"pj{i}" for i in range(4)],
    # Keyed jobs (capability FlowControl): unique ones on q, debounced ones on r.
    "u": [f"uj{i}" for i in range(3)],
    "d": [f"dj{i}" for i in range(3)],
}
# Flow control (typedq.flowcontrol): task "uq" on q unique by key for two hours (a
# finished job holds its key for the rest of the run), task "dr" on r debounced by key
# (due an hour after its key's last enqueue, at most two after its first: never during a
# run). Keys u0/u1 and d0/d1.
CONTROLLED = {"u": ("q", "uq"), "d": ("r", "dr")}
# A flow id is one definition (enqueued again, the same flow): f0 a chain q -> r -> q
# (across slots on Cluster), f1 a fan-out over q and r with a callback chain on r then q,
# f2 a bare fan-out (a collector) over r with its own job on q, f3 a fan-out of fair
# members (keys a and b) on q with a callback on q.
FLOWS = {
    "f0": ("chain", 0, ("q", "r", "q", "")),
    "f1": ("fanout", 3, ("q", "r", "q", "r")),
    "f2": ("collect", 2, ("r", "r", "", "q")),
    "f3": ("fairfan", 3, ("q", "q", "q", "q")),
}
# The range's edges too: an envelope at MIN/MAX_PRIORITY must sort alike everywhere.
PRIORITIES = (MIN_PRIORITY, -5, 0, 0, 5, MAX_PRIORITY)
LEASE = 600.0
#: A program's run in lockstep (200 steps, each compared over ~40 reads): a few seconds
#: on a quiet box, bounded well above what a loaded one takes.
MODEL_DEADLINE = TEST_DEADLINE * 4
DELAY = 3600.0
LIMITS = {
    "lim": LimitSpec(concurrency=1),
    "limr": LimitSpec(concurrency=2),
    "rl": LimitSpec(rate=2, per_us=3600 * 1_000_000),
    "limf": LimitSpec(concurrency=1),
}
# Fair tasks (typedq.fair): "fq" on q and "limf" on r (fair by key, and its keys gated by
# a concurrency limit: a gated key must not block the others). Keys a and b; a job's
# weight is drawn per job, so a key's weight changes between turns (the newest job's
# weight, from the key's next turn, on every broker).
FAIR_TASKS = ("fq", "limf")
FAIR_KEYS = ("a", "b")
FAIR_WEIGHTS = (1, 1, 2, 3)
# Schedules fired tick by tick (TickFiring, as typedq.schedule's Scheduler does): name ->
# (queue, overlap policy). s2's ticks go to one partition of pq, by the schedule's name.
SCHEDULES = {"s1": ("q", "skip"), "s2": ("pq", "queue"), "s3": ("r", "allow")}
DIGEST = "d1"
# A task's jobs go to its one queue, and a partitioned task may not declare limits
# (issue 24 defect 1): the limited tasks live on q and r, plain jobs everywhere.
TASKS_OF = {"q": ("t", "lim", "rl", "fq"), "r": ("t", "limr", "limf"), "pq": ("t",)}


@dataclass(frozen=True)
class Step:
    """One step of a program; its repr is a line of the trace printed on a mismatch."""

    kind: str
    jobs: tuple[
        tuple[str, str, str, int, bool, str, int], ...
    ] = ()  # id, queue, task, prio, delayed, key, fair weight (0: not fair)
    flow: tuple[str, str, int, tuple[str, ...]] = ("", "", 0, ())  # FLOWS' entry
    keyed: tuple[tuple[str, str, str], ...] = ()  # id, "u" or "d" (CONTROLLED), key
    ids: tuple[str, ...] = ()
    n: int = 0
    final: bool = False
    queue: str = ""
    states: tuple[JobState, ...] = ()

    def __repr__(self) -> str:
        if self.kind == "enqueue":
            jobs = (
                f"{i}:{q}/{t}@{p}{'+1h' if d else ''}{'[' + k + ']' if k else ''}"
                f"{'*' + str(w) if w else ''}"
                for i, q, t, p, d, k, w in self.jobs
            )
            return f"enqueue [{', '.join(jobs)}]"
        if self.kind == "flow":
            return f"flow {self.flow[0]} ({self.flow[1]})"
        if self.kind == "control":
            return f"control [{', '.join(f'{i}:{m}[{k}]' for i, m, k in self.keyed)}]"
        if self.kind == "claim":
            return f"claim {self.n} from {self.queue}"
        if self.kind in ("complete", "fail"):
            return f"{self.kind} {self.ids[0]}{' (final)' if self.final else ''}"
        if self.kind == "tick":
            return f"tick {self.n} of {self.ids[0]}{' (stale)' if self.final else ''}"
        if self.kind == "purge":
            return f"purge {self.queue} {'/'.join(s.value for s in self.states)}"
        return f"{self.kind} {' '.join(self.ids)}"


def program(seed: int, steps: int = STEPS) -> list[Step]:
    """The seed's program: what it does does not depend on any broker's answers (a
    finish names a job id; whoever holds no lease on it answers so)."""
    rnd = random.Random(seed)
    out: list[Step] = []
    known = known_ids()
    ticks: dict[str, int] = {}
    for _ in range(steps):
        roll = rnd.random()
        if roll < 0.04:
            keyed = []
            for _ in range(rnd.randint(1, 2)):
                mode = rnd.choice(list(CONTROLLED))
                keyed.append((rnd.choice(POOL[mode]), mode, f"{mode}{rnd.randint(0, 1)}"))
            out.append(Step("control", keyed=tuple(keyed)))
        elif roll < 0.22:
            jobs = []
            for _ in range(rnd.randint(1, 3)):
                base = rnd.choice(("q", "r", "pq"))
                job_id = rnd.choice(POOL[base])
                queue = f"pq.p{int(job_id[2:]) % 3}" if base == "pq" else base
                task = rnd.choice(TASKS_OF[base])
                fair = task in FAIR_TASKS
                if fair:
                    key = rnd.choice(FAIR_KEYS)
                else:
                    key = rnd.choice(("k0", "k1")) if task.startswith("lim") else ""
                weight = rnd.choice(FAIR_WEIGHTS) if fair else 0
                delayed = rnd.random() < 0.15
                jobs.append((job_id, queue, task, rnd.choice(PRIORITIES), delayed, key, weight))
            out.append(Step("enqueue", jobs=tuple(jobs)))
        elif roll < 0.32:
            fid = rnd.choice(list(FLOWS))
            out.append(Step("flow", flow=(fid, *FLOWS[fid])))
        elif roll < 0.55:
            out.append(Step("claim", n=rnd.randint(1, 3), queue=rnd.choice(QUEUES)))
        elif roll < 0.70:
            out.append(Step("complete", ids=(rnd.choice(known),)))
        elif roll < 0.80:
            out.append(Step("fail", ids=(rnd.choice(known),), final=rnd.random() < 0.5))
        elif roll < 0.85:
            out.append(Step("cancel", ids=(rnd.choice(known),)))
        elif roll < 0.91:
            out.append(Step("retry", ids=tuple(rnd.sample(known, 2))))
        elif roll < 0.95:
            out.append(Step("remove", ids=tuple(rnd.sample(known, 2))))
        elif roll < 0.97:
            states = tuple(rnd.sample(list(JobState), rnd.randint(1, 2)))
            out.append(Step("purge", queue=rnd.choice(QUEUES), states=states))
        else:
            # A tick of a schedule (its number: the tick job's id), now and then fired
            # against a state that moved on (a racing scheduler's view: stale).
            name = rnd.choice(list(SCHEDULES))
            ticks[name] = ticks.get(name, -1) + 1
            stale = rnd.random() < 0.15
            out.append(Step("tick", ids=(name,), n=ticks[name], final=stale))
    return out


# Steps of the flows across slots that a retry cannot resume on Redis Cluster: a step off
# the root's queue, or with a later step off it (docs/brokers.md, flows across slots).
UNRESUMABLE_ON_CLUSTER = {"f0.0", "f0.1", "f1.0"}


def for_cluster(steps: list[Step]) -> list[Step]:
    """The program within what Redis Cluster documents it does differently
    (docs/brokers.md): a retry leaves out the steps of flows across slots that Cluster
    cannot resume (it answers IN_FLOW where the others resume the flow)."""
    out: list[Step] = []
    for step in steps:
        if step.kind == "retry":
            ids = tuple(i for i in step.ids if i not in UNRESUMABLE_ON_CLUSTER)
            if ids:
                out.append(Step("retry", ids=ids))
            continue
        out.append(step)
    return out


def _message(
    job_id: str, queue: str, task: str, prio: int, delayed: bool, key: str, weight: int
) -> JobMessage:
    return JobMessage(
        id=job_id,
        task=task,
        queue=queue,
        payload=b"\xc0",
        priority=prio,
        delay=DELAY if delayed else 0.0,
        concurrency_key=key if task.startswith("lim") else "",
        rate_key=key if task == "rl" else "",
        fair_key=key if weight else "",
        fair_weight=weight,
    )


def controlled_job(job_id: str, mode: str, key: str) -> tuple[JobMessage, EnqueueControl]:
    """A keyed enqueue of CONTROLLED's ``mode``: unique for two hours or debounced."""
    queue, task = CONTROLLED[mode]
    message = JobMessage(id=job_id, task=task, queue=queue, payload=b"\xc0")
    if mode == "u":
        return message, EnqueueControl(key=key, unique_for=2 * DELAY)
    return message, EnqueueControl(key=key, wait=DELAY, max_wait=2 * DELAY)


def flow_spec(fid: str, shape: str, members: int, queues: Sequence[str]) -> FlowSpec:
    """Flow ``fid`` as FLOWS defines it: members on queues[0..], steps as the shape says."""
    if shape == "fairfan":
        fan = tuple(
            JobMessage(
                id=member_id(fid, i),
                task="fq",
                queue=queues[0],
                payload=b"\xc0",
                fair_key=FAIR_KEYS[i % 2],
                fair_weight=1 + i,
            )
            for i in range(members)
        )
    else:
        fan = tuple(
            JobMessage(id=member_id(fid, i), task="t", queue=queues[i % 2], payload=b"\xc0")
            for i in range(members)
        )
    if shape == "chain":
        steps = tuple(
            JobMessage(
                id=step_id(fid, k, 3), task="t", queue=queues[k], payload=b"\xc0" if k == 0 else b""
            )
            for k in range(3)
        )
        return FlowSpec(id=fid, steps=steps)
    if shape == "collect":
        own = JobMessage(id=fid, task="t", queue=queues[3], payload=b"")
        return FlowSpec(id=fid, steps=(own,), members=fan, fan_out=True, collector=True)
    steps = tuple(
        JobMessage(id=step_id(fid, k, 2), task="t", queue=queues[2 + k], payload=b"")
        for k in range(2)
    )
    return FlowSpec(id=fid, steps=steps, members=fan, fan_out=True)


def tick_job(name: str, n: int) -> JobMessage:
    """Tick ``n``'s job of schedule ``name`` (its queue's partition by the schedule)."""
    job_id = f"schedule:{name}:{n}"
    base = SCHEDULES[name][0]
    queue = partition_queue(base, PARTITIONS[base], job_id) if base in PARTITIONS else base
    return JobMessage(id=job_id, task="t", queue=queue, payload=b"\xc0")


def tick_ids(steps: Sequence[Step]) -> list[str]:
    return [tick_job(s.ids[0], s.n).id for s in steps if s.kind == "tick"]


@dataclass
class Driver:
    """Runs steps on one broker; holds the lease tokens of its claims by job id, and the
    schedules' last tick as this broker's clock gave it."""

    broker: Broker
    tokens: dict[str, str] = field(default_factory=dict)
    last_tick: dict[str, int] = field(default_factory=dict)

    async def start_schedules(self) -> None:
        states = await self.broker.sync_schedules([(n, DIGEST) for n in SCHEDULES], prune=True)
        self.last_tick = {s.name: s.last_tick_us for s in states}

    async def apply(self, step: Step) -> Any:
        b = self.broker
        try:
            if step.kind == "enqueue":
                outcomes = await b.enqueue([_message(*job) for job in step.jobs])
                return [(o.id, o.created) for o in outcomes]
            if step.kind == "control":
                assert isinstance(b, FlowControl)
                controlled = await b.enqueue_controlled([controlled_job(*j) for j in step.keyed])
                return [(o.id, o.created) for o in controlled]
            if step.kind == "flow":
                (stored,) = await b.enqueue_flows([flow_spec(*step.flow)])
                if isinstance(stored, Exception):
                    return type(stored).__name__
                return (stored.id, stored.created)
            if step.kind == "claim":
                claimed = await b.claim([step.queue], step.n, worker_id="w", lease=LEASE)
                for c in claimed:
                    self.tokens[c.message.id] = c.token
                return sorted((c.message.id, c.attempt) for c in claimed)
            if step.kind in ("complete", "fail"):
                job_id = step.ids[0]
                token = self.tokens.pop(job_id, None)
                if token is None:
                    return "no lease"
                if step.kind == "complete":
                    (outcome,) = await b.complete([Completion(job_id, token, b"\xc0")])
                else:
                    delay = None if step.final else 0.0
                    failure = Failure(id=job_id, token=token, error=b"", retry_delay=delay)
                    (outcome,) = await b.fail([failure])
                return outcome.name
            if step.kind == "cancel":
                return (await b.cancel(step.ids[0])).value
            if step.kind == "retry":
                return [o.value for o in await b.retry(step.ids)]
            if step.kind == "remove":
                return await b.remove(step.ids)
            if step.kind == "purge":
                return await b.purge(step.queue, step.states)
            if step.kind == "tick":
                name = step.ids[0]
                last = self.last_tick[name]
                job = tick_job(name, step.n)
                firing = TickFiring(
                    name=name,
                    digest=DIGEST,
                    expected_last_us=last - 1 if step.final else last,
                    new_last_us=last + 1,  # the brokers' clocks are past it by now
                    messages=[job],
                    overlap=SCHEDULES[name][1],
                    queue=job.queue,
                )
                ((fired, state),) = await b.fire_schedules([firing])
                if state is None:
                    return fired.value
                self.last_tick[name] = state.last_tick_us
                return (fired.value, state.fired, state.skipped, state.last_job)
        except Exception as exc:  # an error is an answer to compare too
            return f"{type(exc).__name__}"
        raise AssertionError(f"unknown step {step!r}")

    async def view(self, ids: Sequence[str]) -> dict[str, Any]:
        """Every job's (state, attempt), every queue's counts and state pages.

        The reads run concurrently (the state is at rest between steps, so their order does
        not matter): on Redis a step's ~40 reads then cost a few round trips' wait, not 40.
        """
        b = self.broker
        got: dict[tuple[str, JobState], list[str]] = {}
        counted: dict[str, dict[str, int]] = {}

        async def listing(q: str, state: JobState) -> None:
            listed: list[str] = []
            cursor: str | None = None
            while True:
                page = await b.page_jobs(q, state, cursor=cursor, limit=3)
                listed += page.ids
                if page.cursor is None:
                    break
                cursor = page.cursor
            got[q, state] = listed

        async def count(q: str) -> None:
            counted[q] = {s.value: n for s, n in (await b.counts(q)).items() if n}

        async with anyio.create_task_group() as tg:
            for q in QUEUES:
                tg.start_soon(count, q)
                for state in JobState:
                    tg.start_soon(listing, q, state)
            records = await b.get(list(ids))
        jobs = {
            job_id: None if r is None else (r.state.value, r.attempt, r.message.queue)
            for job_id, r in zip(ids, records, strict=True)
        }
        counts = {q: counted[q] for q in QUEUES}
        pages: dict[str, list[str]] = {}
        for q in QUEUES:
            for state in JobState:
                listed = got[q, state]
                if listed:
                    # Which jobs, not their order: the claims' answers hold the brokers
                    # to one claim order; a listing's order is a time for the other
                    # states, which two clocks may tie differently (every held step of a
                    # flow is due at HELD_AT), and the jobs a limit parked are listed
                    # after the others on Redis, in place on the embedded broker.
                    pages[f"{q}/{state.value}"] = sorted(listed)
        return {"jobs": jobs, "counts": counts, "pages": pages}


def known_ids() -> list[str]:
    """Every id a program uses: the pool's and every job of every flow."""
    ids = [job_id for pool in POOL.values() for job_id in pool]
    for fid, (shape, members, _) in FLOWS.items():
        steps = 3 if shape == "chain" else 2 if shape in ("fanout", "fairfan") else 1
        ids += [step_id(fid, k, steps) for k in range(steps)]
        ids += [member_id(fid, i) for i in range(members)]
    return ids


def _prepare(broker: Broker) -> None:
    broker.set_limits(LIMITS)
    broker.set_partitions(PARTITIONS)


async def run_lockstep(url: str, namespace: str, steps: Sequence[Step], backend: str) -> str | None:
    """Runs ``steps`` on a fresh embedded broker and on the broker at ``url`` under
    ``namespace``; the first mismatch's description, or None when they agree throughout."""
    ids = known_ids() + tick_ids(steps)
    reference = MemoryBroker(
        BrokerSettings(namespace=namespace, max_queue_length=MAX_QUEUE_LENGTH, max_stalls=3)
    )
    await reference.connect()
    try:
        async with connected(
            namespace, url, max_queue_length=MAX_QUEUE_LENGTH, deadline=MODEL_DEADLINE
        ) as broker:
            _prepare(reference)
            _prepare(broker)
            ref, other = Driver(reference), Driver(broker)
            await ref.start_schedules()
            await other.start_schedules()
            counts_before: dict[str, Any] = {}
            with anyio.fail_after(MODEL_DEADLINE):
                for n, step in enumerate(steps):
                    expected = await ref.apply(step)
                    actual = await other.apply(step)
                    where = f"{backend}, step {n}: {step!r}"
                    if actual != expected:
                        return (
                            f"answers differ at {where}\n{backend}: {actual!r}\n"
                            f"embedded: {expected!r}\ncounts before the step: {counts_before}"
                        )
                    want, got = await ref.view(ids), await other.view(ids)
                    counts_before = want["counts"]
                    for part in ("jobs", "counts", "pages"):
                        if got[part] != want[part]:
                            return (
                                f"{part} differ at {where}\n{backend}: {got[part]!r}\n"
                                f"embedded: {want[part]!r}"
                            )
    finally:
        await reference.close()
    return None


def _listing(steps: Sequence[Step]) -> str:
    return "\n".join(f"  {k:3d}: {s!r}" for k, s in enumerate(steps))


@pytest.mark.asyncio_only
@pytest.mark.redis
@pytest.mark.parametrize("seed", SEEDS)
async def test_brokers_agree_where_features_meet(
    request: pytest.FixtureRequest, app_name: str, seed: int
) -> None:
    # Cluster's run of the same seeds: tests/model/test_model_combined_cluster.py (a file
    # of its own, so that `--dist loadfile` runs the two halves on two processes).
    await check_seed(request, app_name, "redis", seed)


async def check_seed(
    request: pytest.FixtureRequest, app_name: str, backend: str, seed: int
) -> None:
    """Runs seed ``seed``'s program in lockstep on ``backend`` (``redis`` or ``cluster``)
    and the embedded broker; fails with the shrunk program on a mismatch."""
    url = server_url(request, backend)
    steps = program(seed)
    if backend == "cluster":
        steps = for_cluster(steps)
    failure = await run_lockstep(url, app_name, steps, backend)
    if failure is None:
        return
    # Shrink: steps removed while a mismatch persists, each try in a namespace of its own.
    tries = iter(range(10**6))

    async def fails(candidate: list[Step]) -> bool:
        return await run_lockstep(url, f"{app_name}-s{next(tries)}", candidate, backend) is not None

    shrunk = await shrink(steps, fails)
    pytest.fail(
        f"seed {seed}: {failure}\nshrunk program ({len(shrunk)} of {len(steps)} steps):\n"
        f"{_listing(shrunk)}\nfull program: python -m tests.model.test_model_combined {seed}"
    )


def _count_kinds(steps: Sequence[Step]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for s in steps:
        kinds[s.kind] = kinds.get(s.kind, 0) + 1
    return kinds


def test_shrink_keeps_only_the_steps_a_mismatch_needs() -> None:
    """The shrinker reduces a 60-step program failing when two steps are both present to
    those two steps, in their order."""
    runs: list[int] = []

    async def fails(candidate: list[int]) -> bool:
        runs.append(len(candidate))
        return 11 in candidate and 47 in candidate

    assert anyio.run(shrink, list(range(60)), fails) == [11, 47]
    assert len(runs) <= 60


def test_programs_combine_every_feature() -> None:
    """The seeds' programs do what the docstring says: every kind of step, every queue,
    every task, delays, flows of each shape."""
    steps = [s for seed in SEEDS for s in program(seed)]
    kinds = _count_kinds(steps)
    assert set(kinds) == {
        "control",
        "enqueue",
        "flow",
        "claim",
        "complete",
        "fail",
        "cancel",
        "retry",
        "remove",
        "purge",
        "tick",
    }
    jobs = [j for s in steps for j in s.jobs]
    assert {q for _, q, *_ in jobs} == set(QUEUES)
    assert {t for _, _, t, *_ in jobs} == {"t", "lim", "limr", "rl", "fq", "limf"}
    assert any(d for *_, d, _, _ in jobs)
    # Fair keys with every weight, so a key's weight changes between its turns.
    assert {(k, w) for *_, k, w in jobs if w} == {(k, w) for k in FAIR_KEYS for w in FAIR_WEIGHTS}
    keyed = [j for s in steps for j in s.keyed]
    assert {(m, k) for _, m, k in keyed} == {(m, f"{m}{n}") for m in CONTROLLED for n in (0, 1)}
    shapes = {s.flow[1] for s in steps if s.kind == "flow"}
    assert shapes == {"chain", "fanout", "collect", "fairfan"}


def main(argv: Sequence[str]) -> int:
    """``python -m tests.model.test_model_combined SEED [STEPS] [--url URL [--cluster]]``: prints
    the seed's program; with ``--url``, runs it in lockstep against the Redis (``--cluster``:
    the Redis Cluster) at URL and prints the first mismatch, shrunk."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.model.test_model_combined")
    parser.add_argument("seed", type=int)
    parser.add_argument("steps", type=int, nargs="?", default=STEPS)
    parser.add_argument("--url", help="a Redis (or Redis Cluster) URL to run the program on")
    parser.add_argument("--cluster", action="store_true", help="the URL is a Redis Cluster")
    args = parser.parse_args(argv)
    steps = program(args.seed, args.steps)
    backend = "cluster" if args.cluster else "redis"
    if args.cluster:
        steps = for_cluster(steps)
    if not args.url:
        print(_listing(steps))
        return 0
    url: str = args.url

    async def replay() -> int:
        namespace = f"model-replay-{args.seed}-{random.randrange(10**9)}"
        failure = await run_lockstep(url, namespace, steps, backend)
        if failure is None:
            print(
                f"seed {args.seed}, {len(steps)} steps: {backend} agrees with the embedded broker"
            )
            return 0
        tries = iter(range(10**6))

        async def fails(candidate: list[Step]) -> bool:
            ns = f"{namespace}-s{next(tries)}"
            return await run_lockstep(url, ns, candidate, backend) is not None

        shrunk = await shrink(steps, fails)
        print(f"seed {args.seed}: {failure}\nshrunk program:\n{_listing(shrunk)}")
        return 1

    return anyio.run(replay)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
