"""A job that kills every worker that runs it fails as ``stalled``; the rest still run."""

from __future__ import annotations

import subprocess

import anyio
import pytest

from tests.poison_app import Pill, app, swallow
from tests.redis_harness import RedisProcess, flushall
from tests.support import spawn_worker
from typedq import FailureReason, JobFailed, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow, pytest.mark.asyncio_only]


def start_worker(url: str) -> subprocess.Popen[bytes]:
    # Concurrency 1: when the pill kills the process, no innocent job dies with it.
    return spawn_worker("tests.poison_app:app", url, concurrency=1)


async def test_poison_pill_fails_as_stalled_and_workers_do_not_crash_loop(
    redis_server: RedisProcess,
) -> None:
    flushall(redis_server.port)
    app.use_broker(redis_server.url)
    async with app:
        pill = await swallow.enqueue(Pill(n=0, lethal=True))
        others = await swallow.enqueue_many(Pill(n=i) for i in range(1, 51))
        crashes = 0
        worker = start_worker(redis_server.url)
        try:
            # A supervisor: restart the worker each time the pill kills it.
            with anyio.fail_after(60):
                while (await pill.status()) is not JobState.FAILED:
                    if worker.poll() is not None:
                        assert worker.returncode == 137
                        crashes += 1
                        worker = start_worker(redis_server.url)
                    await anyio.sleep(0.05)
                for job in others:
                    await job.result(timeout=30)
        finally:
            worker.kill()
            worker.wait()
        with pytest.raises(JobFailed) as failure:
            await pill.result(timeout=1)
        record = failure.value.record
        assert record.reason is FailureReason.STALLED
        assert record.error_type == "WorkerLost"
        assert "3 times" in record.message  # max_stalls=2 recoveries, the third loss fails it
        assert not record.retryable
        # It killed exactly as many workers as it was allowed to: no crash loop.
        assert crashes == 3
