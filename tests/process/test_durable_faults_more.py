"""Durable runs on Redis, workers SIGKILLed inside a gather, a ``do`` block, a sleep, a
signal's delivery, and a turn that kills its worker every time (see
test_durable_faults.py for the scene and the checks)."""

from __future__ import annotations

import anyio
import pytest

from tests import durable_app
from tests.durable_app import Go, Plan, go, pipeline
from tests.durable_faults_support import (
    _check,
    _has,
    _pg,
    _scene,
    _step_completed,
    _until,
    _until_true,
)
from tests.redis_harness import RedisProcess
from typedq import JobFailed, JobState
from typedq.broker.runs import SignalOutcome
from typedq.durable import SignalReceived

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Redis, and PostgreSQL (its timers are scheduled turn jobs; a turn that failed for
#: good fails its run by a trigger, migration 9); the ledger stays on Redis.
_ON_PG = ["redis", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.mark.parametrize("point", ["step:3", "step:4", "gathered"])
async def test_sigkill_in_a_gather(redis_server: RedisProcess, point: str) -> None:
    """Steps 3 and 4 run at once (``run.gather``); the worker is killed inside one of
    them while the other completes, or in the turn that read both outcomes. The run
    waits for the one it still needs (the turn that logs the first outcome waits on the
    pending one), and records each once; only the interrupted step runs again (the
    turn that read both is run by the last step's worker before that step's completion,
    DurableTask.after_step: killed there, that step is the interrupted one)."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=[point])
        await scene.arm(point)
        plan = Plan(n=9, gather=True)
        handle = await pipeline.start(plan, run_id=f"gather-{point.replace(':', '-')}")
        await scene.held(point, victim)
        if point.startswith("step:"):
            other = 4 if point == "step:3" else 3
            # The other step completes while this one is held (positions are the indexes).
            job_id = f"{handle.run_id}:{other}"
            await _until_true(f"step {other} completed", lambda: _step_completed(job_id))
        if point.startswith("step:"):
            twice = [int(point[5:])]
        else:
            twice = [k for k in (3, 4) if not await _step_completed(f"{handle.run_id}:{k}")]
            assert len(twice) <= 1
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan, twice=twice)


async def test_sigkill_inside_a_do_block(redis_server: RedisProcess) -> None:
    """Killed inside the ``do`` block: it runs again (at-least-once) and its value is
    recorded once. The block runs in the turn after step 1, which step 1's worker runs
    before the step's completion (DurableTask.after_step): step 1 runs again too."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=["do"])
        await scene.arm("do")
        plan = Plan(n=5, do=True)
        handle = await pipeline.start(plan, run_id="do")
        await scene.held("do", victim)
        twice = [] if await _step_completed(f"{handle.run_id}:1") else [1]
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan, twice=twice)
        assert int(await scene.ledger.hget("do", handle.run_id) or 0) == 2


@pytest.mark.parametrize("where", _ON_PG)
async def test_every_worker_sigkilled_while_the_run_sleeps(
    redis_server: RedisProcess, request: pytest.FixtureRequest, where: str
) -> None:
    """Every worker is killed while the run sleeps; its sleep ends with no worker alive
    (nothing happens), and a fresh worker wakes it where it slept."""
    async with _scene(redis_server, pg=_pg(request, where)) as scene:
        workers = [scene.spawn(), scene.spawn()]
        plan = Plan(n=2, sleep=1.5)
        handle = await pipeline.start(plan, run_id="asleep")
        record = await _until(handle, "asleep", lambda r: r.wake_at is not None)
        until = record.wake_at
        assert until is not None
        scene.kill(*workers)
        broker = durable_app.app.broker

        async def woke() -> bool:
            return await broker.broker_time_us() / 1e6 > until + 0.2

        await _until_true("the sleep's end", woke)
        assert (await handle.record()).log == record.log  # nobody ran its turn
        scene.spawn()
        await _check(scene, handle, plan)


async def test_sigkill_in_the_turn_a_sleep_woke(redis_server: RedisProcess) -> None:
    """Killed in the turn that the sleep's timer started, after the sleep returned and
    before anything was appended: the timer's turn job stalls and comes back; the run
    goes on from its sleep, no step runs again."""
    async with _scene(redis_server) as scene:
        victim = scene.spawn(holds=["woke"])
        await scene.arm("woke")
        plan = Plan(n=8, sleep=0.5)
        handle = await pipeline.start(plan, run_id="woke")
        await scene.held("woke", victim)
        scene.kill(victim)
        scene.spawn()
        await _check(scene, handle, plan)


async def test_every_worker_sigkilled_while_the_run_waits_for_a_signal(
    redis_server: RedisProcess,
) -> None:
    """Every worker is killed while the run waits for ``go``; the signal is sent with no
    worker alive (kept in the inbox), and a fresh worker delivers it."""
    async with _scene(redis_server) as scene:
        workers = [scene.spawn(), scene.spawn()]
        plan = Plan(n=4, wait=True)
        handle = await pipeline.start(plan, run_id="waiting")
        await _until(handle, "waiting", lambda r: r.wait_signal == go.name)
        scene.kill(*workers)
        assert await handle.send(go, Go(bump=50)) is SignalOutcome.DELIVERED
        scene.spawn()
        await _check(scene, handle, plan, bump=50)


@pytest.mark.parametrize("point", ["signal", "signalled"])
async def test_sigkill_during_a_signal_delivery(redis_server: RedisProcess, point: str) -> None:
    """Killed in the turn the signal woke: before it took the signal (``signal``: the
    payload is still in the inbox) or after its append took it (``signalled``: the log
    holds it, the function has not gone on yet). The payload is delivered once.

    ``signalled``: the victim ran the run to its wait, so it has the run paused there
    and the signal's turn goes on from the pause. ``signal`` (a hold before the
    ``run.wait_for`` call, which only a replay from the top passes again): another worker
    ran the run to its wait and is gone, so the victim replays it from the top."""
    async with _scene(redis_server) as scene:
        plan = Plan(n=6, wait=True)
        if point == "signal":
            first = scene.spawn()
            handle = await pipeline.start(plan, run_id=f"deliver-{point}")
            await _until(handle, "waiting", lambda r: r.wait_signal == go.name)
            scene.kill(first)
            victim = scene.spawn(holds=[point])
        else:
            victim = scene.spawn(holds=[point])
            handle = await pipeline.start(plan, run_id=f"deliver-{point}")
            await _until(handle, "waiting", lambda r: r.wait_signal == go.name)
        await scene.arm(point)
        assert await handle.send(go, Go(bump=9)) is SignalOutcome.DELIVERED
        await scene.held(point, victim)
        record = await handle.record()
        taken = _has(SignalReceived)(record)
        assert taken == (point == "signalled")
        assert bool(record.inbox.get(go.name)) == (point == "signal")
        scene.kill(victim)
        scene.spawn()
        record = await _check(scene, handle, plan, bump=9)


@pytest.mark.parametrize("where", _ON_PG)
async def test_a_run_whose_turn_keeps_killing_its_worker_ends(
    redis_server: RedisProcess, request: pytest.FixtureRequest, where: str
) -> None:
    """A turn that kills its worker every time (a poison turn: the replay runs out of
    memory, say) fails its job once it has stalled past ``max_stalls``, as any job does.
    The run must not be lost with it: it should end (failed, with the stalled record),
    as a run whose step job stalled past ``max_stalls`` does (the step's failure is
    raised in the function): the broker fails a run whose turn job failed for good."""
    async with _scene(redis_server, pg=_pg(request, where)) as scene:
        await scene.arm("after:0")
        plan = Plan(n=1)
        handle = await pipeline.start(plan, run_id="poison")
        # max_stalls=1: the second stall fails the turn's job. On Redis the first kill is
        # in the turn step 0's worker runs before the step's completion (after_step):
        # step 0 stalls and runs again, and, recovered from a stall, leaves its next turn
        # to a turn job, which then stalls twice.
        for _ in range(2 if where == "postgres" else 3):
            victim = scene.spawn(holds=["after:0"], max_stalls=1)
            await scene.held("after:0", victim)
            scene.kill(victim)
        scene.spawn(max_stalls=1)
        # The turn that read step 0's outcome is the run's second (t1 started it).
        turn = f"{handle.run_id}:t2"

        async def turn_failed() -> bool:
            [job] = await durable_app.app.broker.get([turn])
            return job is not None and job.state is JobState.FAILED

        await _until_true("the turn's job failed", turn_failed)
        with anyio.fail_after(5), pytest.raises(JobFailed) as failed:
            await handle.result()
        assert failed.value.reason.value == "stalled"
