"""Model check of durable runs: random operation sequences on Redis and Cluster, step by
step against the embedded broker (typedq/broker/memory/runs.py, the reference).

Each seed drives a few hundred steps over a small pool of runs: create, compare-and-
append (the expected length right or wrong, taking a signal or not, waiting on steps, a
signal, a timer past or far ahead, or ending the run), signals, wakes, cancels, steps of
the runs enqueued on another queue (another slot on Cluster) and finished (completed or
failed), and turns claimed and completed. After every step both answers, every run's
record (times left out) and the state of every turn and step job must be equal.

Time is kept out: a timer is long past (it wakes at once) or decades ahead (a scheduled
turn that never comes due).
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from tests.redis_support import server_url
from tests.support import connected
from typedq.broker.base import Broker, Completion, Failure, JobMessage, JobState
from typedq.broker.runs import RunAppend, RunRecord, RunSignal, RunSpec, RunState
from typedq.errors import FailureReason, FailureRecord

pytestmark = pytest.mark.anyio

SEEDS = range(4)
STEPS = 200
RUNS = ["a", "b", "c", "d", "e", "f"]
SIGNALS = ["x", "y"]
STEPS_PER_RUN = 3
TURNS_SEEN = 40
RUN_QUEUE, STEP_QUEUE = "q", "s"
FAR = 4_000_000_000.0  # 2096: a timer that never comes due
FAILURE = FailureRecord(
    reason=FailureReason.ERROR, error_type="E", message="m", attempt=1, retryable=False
)


def spec(run_id: str) -> RunSpec:
    return RunSpec(
        id=run_id,
        name="f",
        queue=RUN_QUEUE,
        turn_task="typedq.run.f",
        turn_payload=b"\x90",
        input=run_id.encode(),
    )


def view(record: RunRecord | None) -> object:
    """What is compared of a run: all but its times (a timer: whether it has one)."""
    if record is None:
        return None
    failure = record.failure
    if failure is not None:
        failure = msgspec.structs.replace(failure, failed_at=0.0)
    return (
        record.spec,
        record.state,
        record.log,
        record.inbox,
        record.result,
        failure,
        record.wait_jobs,
        record.wait_signal,
        record.wake_at is None,
        record.outcomes,
    )


def job_ids() -> tuple[list[str], list[str]]:
    turns = [f"{r}:t{n}" for r in RUNS for n in range(1, TURNS_SEEN)]
    steps = [f"{r}:{i}" for r in RUNS for i in range(STEPS_PER_RUN)]
    return turns, steps


async def views(broker: Broker) -> object:
    turns, steps = job_ids()
    runs = [view(r) for r in await broker.get_runs(RUNS)]
    turn_states = [None if j is None else j.state for j in await broker.get(turns, queue="q")]
    step_states = [None if j is None else j.state for j in await broker.get(steps, queue="s")]
    return runs, turn_states, step_states


class Program:
    """Picks the next step from the reference's state (its runs' log lengths)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.lengths: dict[str, int] = {}
        #: Per running run, the steps whose outcomes it keeps (what a turn may record).
        self.kept: dict[str, list[str]] = {}

    def next(self) -> tuple[str, Any]:
        rng = self.rng
        run = rng.choice(RUNS)
        kind = rng.choices(
            ["create", "append", "signal", "wake", "cancel", "step", "finish", "turn"],
            weights=[2, 8, 3, 1, 0.3, 3, 3, 2],
        )[0]
        if kind == "create":
            return kind, run
        if kind == "signal":
            return kind, RunSignal(
                run_id=run, signal=rng.choice(SIGNALS), payload=bytes([rng.randrange(256)])
            )
        if kind == "wake":
            return kind, (run, rng.choice([0.0, FAR]))
        if kind == "cancel":
            return kind, run
        if kind == "step":
            # A step of a running run (a turn enqueues them): its end is the run's.
            if run not in self.kept:
                return "create", run
            return kind, f"{run}:{rng.randrange(STEPS_PER_RUN)}"
        if kind == "finish":
            return kind, rng.random() < 0.7
        if kind == "turn":
            return kind, None
        length = self.lengths.get(run, 0)
        expected = length if rng.random() < 0.8 else length + rng.choice([-1, 1])
        steps = [f"{run}:{i}" for i in range(STEPS_PER_RUN)]
        entries = tuple(bytes([rng.randrange(256)]) * 2 for _ in range(rng.randrange(3)))
        take = rng.choice(SIGNALS) if rng.random() < 0.3 else None
        # A turn records the outcomes it read: kept ones.
        kept = self.kept.get(run, [])
        recorded = tuple(rng.sample(kept, rng.randrange(min(2, len(kept)) + 1)))
        base = RunAppend(
            run_id=run, expected=expected, entries=entries, take_signal=take, recorded_jobs=recorded
        )
        how = rng.choices(
            ["jobs", "signal", "past", "future", "all", "none", "done", "failed"],
            weights=[4, 3, 1, 1, 2, 1, 0.5, 0.5],
        )[0]
        replace = msgspec.structs.replace
        if how == "jobs":
            return kind, replace(base, wait_jobs=tuple(rng.sample(steps, rng.randrange(1, 3))))
        if how == "signal":
            return kind, replace(base, wait_signal=rng.choice(SIGNALS))
        if how == "past":
            return kind, replace(base, wake_at=1.0)
        if how == "future":
            return kind, replace(base, wake_at=FAR)
        if how == "all":
            return kind, replace(
                base, wait_jobs=(steps[0],), wait_signal=rng.choice(SIGNALS), wake_at=FAR
            )
        if how == "done":
            return kind, replace(base, state=RunState.COMPLETED, result=b"r")
        if how == "failed":
            return kind, replace(base, state=RunState.FAILED, failure=FAILURE)
        return kind, base


async def apply(broker: Broker, kind: str, arg: Any) -> object:
    """Run one step; its answer."""
    if kind == "create":
        [(created, record)] = await broker.create_runs([spec(arg)])
        return created, view(record)
    if kind == "append":
        return await broker.append_runs([arg])
    if kind == "signal":
        return await broker.signal_runs([arg])
    if kind == "wake":
        return await broker.wake_runs([arg])
    if kind == "cancel":
        return await broker.cancel_runs([arg])
    if kind == "step":
        message = JobMessage(
            id=arg, task="t", queue=STEP_QUEUE, payload=b"", max_retries=0, run_queue=RUN_QUEUE
        )
        return await broker.enqueue([message])
    if kind == "finish":
        claimed = await broker.claim([STEP_QUEUE], 1, worker_id="w", lease=600)
        for c in claimed:
            if arg:
                await broker.complete([Completion(c.message.id, c.token, b"out")])
            else:
                await broker.fail([Failure(id=c.message.id, token=c.token, error=b"err")])
        return [c.message.id for c in claimed]
    claimed = await broker.claim([RUN_QUEUE], 1, worker_id="w", lease=600)
    await broker.complete([Completion(c.message.id, c.token, b"") for c in claimed])
    return [c.message.id for c in claimed]


@pytest.mark.redis
@pytest.mark.asyncio_only
@pytest.mark.parametrize("backend", ["redis", "cluster"])
@pytest.mark.parametrize("seed", SEEDS)
async def test_runs_follow_the_reference(
    request: pytest.FixtureRequest, app_name: str, backend: str, seed: int
) -> None:
    url = server_url(request, backend)
    program = Program(seed)
    trace: list[str] = []
    seen: set[object] = set()  # what the steps exercised (checked at the end)
    async with (
        connected(f"{app_name}-ref", "memory://") as reference,
        connected(app_name, url) as tested,
    ):
        for step in range(STEPS):
            kind, arg = program.next()
            trace.append(f"{kind} {arg!r}")
            where = f"seed {seed}, step {step}:\n" + "\n".join(trace[-15:])
            expected = await apply(reference, kind, arg)
            actual = await apply(tested, kind, arg)
            assert actual == expected, f"answer differs at {where}"
            want = await views(reference)
            assert await views(tested) == want, f"state differs at {where}"
            if isinstance(expected, list):
                seen.update(a for a in expected if isinstance(a, str))
            runs = want[0] if isinstance(want, tuple) else []
            seen.update(("outcome", o.state) for r in runs if r for o in r[-1].values())
            seen.update(("run", r[1]) for r in runs if r)
            for run, record in zip(RUNS, await reference.get_runs(RUNS), strict=True):
                program.lengths[run] = 0 if record is None else len(record.log)
                if record is not None and record.state is RunState.RUNNING:
                    program.kept[run] = sorted(record.outcomes)
                else:
                    program.kept.pop(run, None)
    assert {"appended", "conflict", "delivered", ("outcome", JobState.COMPLETED)} <= seen
