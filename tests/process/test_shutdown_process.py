"""SIGTERM on a worker process: finish what fits in the grace period, hand back the rest.

A sync handler that never returns cannot be handed back while its thread runs (that
would run the job twice): its lease is renewed for a bounded extra wait, then the
process exits anyway and the job comes back by lease expiry.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import BinaryIO

import anyio
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.shutdown_app import Hang, Nap, app, hang, nap
from tests.support import spawn_worker
from typedq import Job, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow, pytest.mark.asyncio_only]

GRACE = 1.5
#: The workers' lease in the hung-handler test: shorter than the grace, so the job
#: outliving a lease on the first worker proves its lease was renewed meanwhile.
HUNG_LEASE = 1.0


def start_worker(
    url: str, concurrency: int, log: BinaryIO | None = None, *, lease: float | None = None
) -> subprocess.Popen[bytes]:
    """A worker process of tests.shutdown_app (its lease: the app's 2 s unless given)."""
    env = {"TYPEDQ_TEST_LEASE": str(lease)} if lease is not None else None
    return spawn_worker(
        "tests.shutdown_app:app", url, concurrency=concurrency, grace=GRACE, env=env, output=log
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


async def started_runs(path: Path, count: int) -> list[tuple[int, float]]:
    """The (pid, start time) lines the hang handler wrote, once there are ``count``."""
    with anyio.fail_after(20):
        while True:
            file = anyio.Path(path)
            lines = (await file.read_text()).splitlines() if await file.exists() else []
            if len(lines) >= count:
                return [(int(pid), float(at)) for pid, at in (line.split() for line in lines)]
            await anyio.sleep(0.05)


async def exit_of(worker: subprocess.Popen[bytes]) -> tuple[int, float]:
    """The exit code and when it exited (wall clock)."""
    code = await anyio.to_thread.run_sync(lambda: worker.wait(timeout=40))
    return code, time.time()


async def test_two_sigterms_end_a_worker_whose_sync_handler_hangs(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    flushall(redis_server.port)
    app.use_broker(redis_server.url)
    runs, log = tmp_path / "runs", tmp_path / "worker.log"
    async with app:
        job = await hang.enqueue(Hang(path=str(runs)))
        with log.open("wb") as out:
            worker = start_worker(redis_server.url, concurrency=2, log=out)
        try:
            await started_runs(runs, 1)
            signalled = time.monotonic()
            worker.send_signal(signal.SIGTERM)
            await anyio.sleep(0.2)
            worker.send_signal(signal.SIGTERM)
            code, _ = await exit_of(worker)
            took = time.monotonic() - signalled
        finally:
            if worker.poll() is None:
                worker.kill()
        assert code == 0
        assert took < 15  # bounded although the thread never returns
        # Not handed back while its thread could still run: it comes back by lease.
        assert await job.status() is JobState.ACTIVE
    text = log.read_text()
    assert f"abandoned job {job.id} (hang)" in text
    assert "comes back when its lease expires" in text


async def test_sigterm_with_a_hung_sync_handler_exits_before_the_job_runs_again(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    """The job runs a second time only once the first process is gone, never alongside."""
    flushall(redis_server.port)
    app.use_broker(redis_server.url)
    runs, log = tmp_path / "runs", tmp_path / "worker.log"
    async with app:
        job = await hang.enqueue(Hang(path=str(runs)))
        workers = {}
        with log.open("wb") as out:
            for _ in range(2):
                # A 1 s lease: the test waits one lease of renewals, then one to expire.
                process = start_worker(redis_server.url, concurrency=1, log=out, lease=HUNG_LEASE)
                workers[process.pid] = process
        try:
            ((first_pid, _),) = await started_runs(runs, 1)
            first = workers.pop(first_pid)
            (other,) = workers.values()
            signalled = time.monotonic()
            first.send_signal(signal.SIGTERM)
            code, exited_at = await exit_of(first)
            took = time.monotonic() - signalled
            assert code == 0
            # Grace, then at most one lease of renewing the running thread's lease, then
            # the process ends although the thread never returns.
            assert took < GRACE + HUNG_LEASE + 15
            # Meanwhile the lease was renewed: the other worker could not take the job.
            # Once the process is gone, the lease expires and the job comes back.
            (_, (second_pid, second_start)) = await started_runs(runs, 2)
            assert second_pid == other.pid
            assert second_start > exited_at - 0.5
            other.send_signal(signal.SIGTERM)
            await anyio.sleep(0.2)
            other.send_signal(signal.SIGTERM)
            assert (await exit_of(other))[0] == 0
        finally:
            for process in (first, *workers.values()):
                if process.poll() is None:
                    process.kill()
    assert f"abandoned job {job.id} (hang)" in log.read_text()
