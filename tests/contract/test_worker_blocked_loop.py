"""A handler that blocks the event loop past its lease (RELIABILITY D3, streaq#146).

The worker's own reaper must not recover, and run a second time, a job the worker is
itself still running; the loop-lag watchdog says what happened.
"""

from __future__ import annotations

import logging
import time

import anyio
import pytest

from tests.support import In, Out
from typedq import App, JobContext, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

# Short enough that the handler's block outlasts it three times over, long enough that a
# busy CI machine not scheduling the worker process for a moment does not (that would be
# a real lease expiry, which may run a job again by design).
LEASE = 0.6
#: The worker's reaper runs every half lease (``Worker.reaper_interval``).
REAPER_PERIOD = LEASE / 2


async def test_blocked_loop_runs_the_job_once_and_is_reported(
    app_name: str, broker_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(app_name, broker=broker_url, lease=LEASE)
    runs: list[int] = []

    @app.task
    async def hog(payload: In, ctx: JobContext) -> Out:
        runs.append(ctx.attempt)
        # A CPU-bound or blocking call inside async code: the loop stalls for 3 leases.
        time.sleep(3 * LEASE)  # noqa: ASYNC251 -- the fault under test
        return Out(n=payload.n)

    caplog.set_level(logging.WARNING, logger="typedq.worker")
    with anyio.fail_after(20):
        async with app, app.worker(concurrency=2) as worker:
            job = await hog.enqueue(In(n=7))
            assert await job.result(timeout=10) == Out(n=7)
            # Give the reaper two periods to (wrongly) recover the job, if it would: it
            # has then run at least once since the handler returned, whatever the phase
            # of its loop.
            await anyio.sleep(2 * REAPER_PERIOD)
            assert await job.status() is JobState.COMPLETED
    assert runs == [1]
    assert worker.stats.completed == 1
    assert worker.stats.finish_rejected == 0
    assert worker.stats.lease_lost == 0
    assert any("event loop blocked" in r.getMessage() for r in caplog.records)
