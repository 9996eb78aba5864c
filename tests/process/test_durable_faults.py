"""Durable runs on Redis with real worker processes SIGKILLed at every point of a run.

Workers run :mod:`tests.durable_app`: a run of five steps, with a ``do`` block, a
``run.sleep`` or a ``run.wait_for`` in the middle when its input asks. A worker started
with hold points stops there (when the test arms the point) and says so in the ledger
(database 1 of the same redis-server), so the test SIGKILLs it at a known point: inside a
step, in the turn that read a step's outcome before it was logged, between a turn's
enqueue of a step and the append that names it, after a step completed with no worker
left to run its turn, inside a ``do`` block, while the run sleeps or waits (every worker
killed), and while a signal is delivered. A fresh worker process then finishes the run,
and the test checks from outside: the right result, each step recorded once in the run's
log, each step run once (twice only the step the kill interrupted), nothing lost.
The kill points around steps and turns are here; gathers, ``do`` blocks, sleeps, signals
and a poison turn in test_durable_faults_more.py, the batch in test_durable_batch.py (one
file each, so the suite's processes share them: tests/durable_faults_support.py).
"""

from __future__ import annotations

import pytest

from tests.durable_app import TURNS, Plan, pipeline
from tests.durable_faults_support import (
    STEP_INDEXES,
    STEPS_WHERE,
    _check,
    _cluster,
    _has,
    _pg,
    _scene,
    _step_completed,
    _until,
    _until_true,
)
from tests.redis_harness import RedisCluster, RedisProcess
from typedq.durable import StepCompleted, StepScheduled
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.mark.parametrize("k", STEP_INDEXES)
async def test_sigkill_inside_a_step(redis_server: RedisProcess, k: int) -> None:
    """Killed while step K's handler runs: the step runs again (its job stalls, then a
    fresh worker takes it), and is recorded once."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[f"step:{k}"])
        await scene.arm(f"step:{k}")
        plan = Plan(n=k + 1)
        handle = await pipeline.start(plan, run_id=f"in-step-{k}")
        await scene.held(f"step:{k}", victim)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan, twice=[k])


@pytest.mark.parametrize(
    ("k", "where"),
    [
        *((k, "redis") for k in STEP_INDEXES),
        pytest.param(1, "postgres", marks=pytest.mark.postgres),
        pytest.param(4, "postgres", marks=pytest.mark.postgres),
    ],
)
async def test_sigkill_in_the_turn_that_read_a_step_outcome(
    redis_server: RedisProcess, request: pytest.FixtureRequest, k: int, where: str
) -> None:
    """Killed in the turn that has read step K's outcome (the function runs past it) and
    not appended it yet: the next turn records it. For K = 4 the turn is the one that
    would complete the run.

    On Redis that turn is run by step K's own worker as the step returns, before its job
    is completed (DurableTask.after_step: the run is paused there): the step's job is
    still active, so it runs again (at least once, as a step killed before its
    completion does) and its result is recorded once. On PostgreSQL (no fenced appends)
    the turn is a turn job: the broker keeps the step's outcome; no step runs again."""
    async with _scene(redis_server, pg=_pg(request, where)) as scene:
        victim = scene.spawn(holds=[f"after:{k}"])
        await scene.arm(f"after:{k}")
        plan = Plan(n=7)
        handle = await pipeline.start(plan, run_id=f"after-{k}")
        await scene.held(f"after:{k}", victim)
        record = await handle.record()
        job_id = f"{handle.run_id}:{k}"
        assert not _has(StepCompleted, k)(record)  # the outcome is not logged yet
        if where == "postgres":
            assert job_id in record.outcomes  # but the broker keeps it
        else:
            assert job_id not in record.outcomes
            assert not await _step_completed(job_id)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan, twice=[] if where == "postgres" else [k])


@pytest.mark.parametrize(("k", "where"), STEPS_WHERE)
async def test_sigkill_between_enqueueing_a_step_and_logging_it(
    redis_server: RedisProcess, request: pytest.FixtureRequest, k: int, where: str
) -> None:
    """Killed in the turn after it enqueued step K's job and before the append that
    records the step as scheduled; the step runs meanwhile (a steps-only worker) and
    completes while the log does not name it. The next turn schedules the same job id
    (no second job), finds the outcome kept and records it: the step ran once."""
    async with _scene(redis_server, _cluster(request, where)) as scene:
        victim = scene.spawn(holds=[f"enqueued:{k}"], queues=TURNS, concurrency=1)
        scene.spawn(queues=DEFAULT_QUEUE)
        await scene.arm(f"enqueued:{k}")
        plan = Plan(n=3)
        handle = await pipeline.start(plan, run_id=f"enq-{k}")
        await scene.held(f"enqueued:{k}", victim)
        job_id = f"{handle.run_id}:{k}"
        await _until_true(f"step {k} completed", lambda: _step_completed(job_id))
        record = await _until(handle, "the outcome kept", lambda r: job_id in r.outcomes)
        assert not _has(StepScheduled, k)(record)  # the log does not name the step
        scene.kill(victim)
        scene.spawn(queues=TURNS)
        await _check(scene, handle, plan)


@pytest.mark.parametrize(
    ("k", "where"),
    [
        *STEPS_WHERE,
        # On PostgreSQL the outcome and the next turn are written by a trigger in the
        # transaction that completed the step (migration 9).
        pytest.param(0, "postgres", marks=pytest.mark.postgres),
        pytest.param(4, "postgres", marks=pytest.mark.postgres),
    ],
)
async def test_sigkill_after_a_step_completed_with_no_turn_worker(
    redis_server: RedisProcess, request: pytest.FixtureRequest, k: int, where: str
) -> None:
    """The turns' worker is killed while step K runs; step K completes (its outcome and
    the run's next turn are written by the step's completion) and its worker is killed
    right after: no process is left that saw the outcome. A fresh worker finishes the
    run; the step is not run again."""
    async with _scene(redis_server, _cluster(request, where), pg=_pg(request, where)) as scene:
        turns = scene.spawn(queues=TURNS)
        steps = scene.spawn(holds=[f"step:{k}"], queues=DEFAULT_QUEUE)
        await scene.arm(f"step:{k}")
        plan = Plan(n=11)
        handle = await pipeline.start(plan, run_id=f"handoff-{k}")
        await scene.held(f"step:{k}", steps)
        scene.kill(turns)
        await scene.release(f"step:{k}")
        job_id = f"{handle.run_id}:{k}"
        await _until_true(f"step {k} completed", lambda: _step_completed(job_id))
        record = await _until(handle, "the outcome kept", lambda r: job_id in r.outcomes)
        assert not _has(StepCompleted, k)(record)
        scene.kill(steps)
        scene.spawn()
        await _check(scene, handle, plan)


@pytest.mark.cluster
@pytest.mark.parametrize("k", [0, 4])
async def test_sigkill_between_a_steps_completion_and_its_handoff_on_cluster(
    redis_server: RedisProcess, redis_cluster: RedisCluster, k: int
) -> None:
    """On Redis Cluster a run's turns (queue ``turns``) and its steps (``default``) are
    on two slots: step K's completion writes the run's hand-off to the outbox of the
    step's queue, and its worker applies it on the run's slot right after. The worker is
    killed in between: a live worker's reaper pass applies the hand-off (once it is
    HANDOFF_AGE old) and the run goes on; the step is not run again."""
    async with _scene(redis_server, redis_cluster) as scene:
        scene.spawn(queues=TURNS)
        steps = scene.spawn(holds=[f"step:{k}", "handoff"], queues=DEFAULT_QUEUE)
        await scene.arm(f"step:{k}")
        plan = Plan(n=13)
        handle = await pipeline.start(plan, run_id=f"outbox-{k}")
        await scene.held(f"step:{k}", steps)
        await scene.arm("handoff")
        await scene.release(f"step:{k}")
        await scene.held("handoff", steps)
        job_id = f"{handle.run_id}:{k}"
        assert await _step_completed(job_id)
        record = await handle.record()
        assert job_id not in record.outcomes  # the hand-off is not applied yet
        assert not _has(StepCompleted, k)(record)
        scene.kill(steps)
        scene.spawn(queues=DEFAULT_QUEUE)
        await _check(scene, handle, plan)
