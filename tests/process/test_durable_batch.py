"""A thousand durable runs of five steps on two worker processes, one SIGKILLed and
restarted three times during the batch: every run completes, each step recorded once
(see test_durable_faults.py for the scene and the checks)."""

from __future__ import annotations

import time
from functools import partial

import anyio
import pytest

from tests import durable_app
from tests.durable_app import STEPS, Plan, expected, pipeline
from tests.durable_faults_support import (
    WHERE,
    _check_log,
    _cluster,
    _pg,
    _scene,
    _until_true,
)
from tests.redis_harness import RedisProcess

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]


#: Runs of the batch test (5 steps each), and how often its victim is killed.
BATCH = 1000
KILLS = 3


# Not on PostgreSQL yet: there a step ran twice once in a few runs with no killed worker
# having started it (a live worker's 1 s lease lost under load is suspected, not
# confirmed), and 1,000 runs take over a minute there (~110 steps/s on the 2-core box).
# PostgreSQL's durable fault tests are in test_durable_faults*.py (issue 30).
@pytest.mark.parametrize("where", WHERE)
async def test_a_batch_of_runs_survives_repeated_sigkills(
    redis_server: RedisProcess, request: pytest.FixtureRequest, where: str
) -> None:
    """BATCH runs of five steps on two worker processes, one SIGKILLed and restarted
    KILLS times while they run: every run completes with its result, each step is
    recorded once in its run's log, and a step ran more than once only if a killed
    worker had started it."""
    async with _scene(redis_server, _cluster(request, where), pg=_pg(request, where)) as scene:
        scene.spawn(concurrency=16)
        victim = scene.spawn(concurrency=16)
        started = time.monotonic()
        plans = {f"b{i}": Plan(n=i) for i in range(BATCH)}
        for run_id, plan in plans.items():
            await pipeline.start(plan, run_id=run_id)
        total = BATCH * STEPS
        for kill in range(KILLS):
            # Kill at a quarter, a half, three quarters of the steps.
            mark = total * (kill + 1) // (KILLS + 1)

            async def past(mark: int = mark) -> bool:
                return int(await scene.ledger.hlen("runs")) >= mark

            await _until_true(f"{mark} steps run", past)
            # (and the victim has started steps: a restarted one is not killed at birth)
            await _until_true("the victim at work", partial(scene.started_any, victim))
            scene.kill(victim)
            victim = scene.spawn(concurrency=16)
        broker = durable_app.app.broker
        ids = list(plans)
        with anyio.fail_after(120):
            while True:
                records = await broker.get_runs(ids)
                if all(r is not None and r.state.is_final for r in records):
                    break
                await anyio.sleep(0.1)
        elapsed = time.monotonic() - started
        runs = await scene.runs()
        rerun_allowed = await scene.started_by(scene.killed)
        killed_starts = await scene.starts_by(scene.killed)
    step_ids: list[str] = []
    for run_id, record in zip(ids, records, strict=True):
        assert record is not None
        assert record.result is not None, (run_id, record.state, record.failure)
        assert pipeline.output.decode(record.result) == expected(plans[run_id])
        step_ids += [f"{run_id}:{p}" for p in _check_log(record, plans[run_id])]
    assert set(runs) == set(step_ids)  # every step ran; no other job ran as a step
    twice = {job_id for job_id, n in runs.items() if n > 1}
    # Only what a killed worker had started ran again.
    assert twice <= rerun_allowed, sorted(twice - rerun_allowed)
    # Each extra run is one start by a killed worker: a step started by the victim of one
    # kill may be recovered by the next victim and killed again (three kills).
    extra = {job_id: n - 1 for job_id, n in runs.items() if n - 1 > killed_starts[job_id]}
    assert extra == {}, extra
    print(f"{BATCH} runs x {STEPS} steps, {KILLS} kills: {elapsed:.1f}s, {len(twice)} reruns")
