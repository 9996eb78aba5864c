"""SIGTERM on a worker process: finish what fits in the grace period, hand back the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.shutdown_app import Nap, app, nap
from typedq import Job, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.redis]

ROOT = Path(__file__).resolve().parent.parent
GRACE = 1.5


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Redis client is asyncio-based


def start_worker(url: str, concurrency: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "typedq",
            "worker",
            "tests.shutdown_app:app",
            "--concurrency",
            str(concurrency),
            "--grace",
            str(GRACE),
            "--broker",
            url,
        ],
        cwd=ROOT,
        env={**os.environ, "TYPEDQ_BROKER": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def wait_for(state: JobState, count: int) -> None:
    with anyio.fail_after(20):
        while (await app.broker.counts("default"))[state] < count:  # noqa: ASYNC110
            await anyio.sleep(0.02)


async def test_sigterm_finishes_short_jobs_and_hands_back_long_ones(
    redis_server: RedisProcess,
) -> None:
    flushall(redis_server.port)
    app.use_broker(redis_server.url)
    async with app:
        short: list[Job[None]] = [await nap.enqueue(Nap(seconds=0.5)) for _ in range(5)]
        long: list[Job[None]] = [await nap.enqueue(Nap(seconds=60)) for _ in range(5)]
        worker = start_worker(redis_server.url, concurrency=10)
        try:
            await wait_for(JobState.ACTIVE, 10)
            signalled = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            exit_code = await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30))
            took = time.monotonic() - signalled
        finally:
            if worker.poll() is None:
                worker.kill()
        assert exit_code == 0
        # Bounded by the grace period plus process teardown, far from the 60 s jobs.
        assert took < GRACE + 10
        for job in short:
            assert await job.status() is JobState.COMPLETED
        for job in long:
            info = await job.info()
            assert info.status is JobState.WAITING  # handed back, claimable at once
            assert info.attempt == 0  # the interrupted attempt was not spent

        # A second worker picks the handed-back jobs up; SIGTERM twice skips the grace.
        worker = start_worker(redis_server.url, concurrency=10)
        try:
            await wait_for(JobState.ACTIVE, 5)
            worker.send_signal(signal.SIGTERM)
            await anyio.sleep(0.2)
            worker.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(lambda: worker.wait(timeout=30)) == 0
        finally:
            if worker.poll() is None:
                worker.kill()
        counts = await app.broker.counts("default")
        assert counts[JobState.WAITING] == 5
        assert counts[JobState.ACTIVE] == 0
