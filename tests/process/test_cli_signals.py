"""Ctrl-C / SIGTERM on ``typedq worker``, as real processes and real signals.

The first signal shuts down gracefully and says so; the second names the jobs still
held and skips the grace; the third exits at once (status 130): never a silent hang.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import anyio
import pytest

from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, redis_process
from tests.shutdown_app import Nap, app, nap
from typedq import JobState

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.asyncio_only]


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    """A redis-server of this test alone: the third-signal test freezes it."""
    with redis_process(appendonly=True) as process:
        yield process


def worker(url: str, *extra: str) -> TypedqProcess:
    return TypedqProcess("worker", "tests.shutdown_app:app", "--broker", url, *extra)


async def enqueue_naps(url: str, count: int) -> list[str]:
    app.use_broker(url)
    async with app:
        return [(await nap.enqueue(Nap(seconds=600))).id for _ in range(count)]


async def wait_active(url: str, count: int) -> None:
    app.use_broker(url)
    async with app:
        with anyio.fail_after(30):
            while (await app.broker.counts("default"))[JobState.ACTIVE] < count:  # noqa: ASYNC110
                await anyio.sleep(0.05)


async def test_first_signal_says_graceful_and_the_grace(server: RedisProcess) -> None:
    process = worker(server.url, "--grace", "0.5")
    try:
        process.wait_for("started")
        process.proc.send_signal(signal.SIGINT)
        line = process.wait_for("SIGINT: shutting down gracefully")
        assert "0.5s" in line
        assert "second signal skips the grace" in line
        assert process.wait() == 0
    finally:
        process.close()


async def test_second_signal_names_the_jobs_and_third_exits_at_once(
    server: RedisProcess,
) -> None:
    ids = await enqueue_naps(server.url, 2)
    process = worker(server.url, "--grace", "600")
    try:
        await wait_active(server.url, 2)
        process.proc.send_signal(signal.SIGINT)
        first = process.wait_for("shutting down gracefully")
        assert "2 running jobs" in first
        # Freeze Redis: handing the jobs back now cannot finish, so the shutdown after
        # the second signal lasts (bounded) and the third signal finds it still running.
        assert server.proc is not None
        server.proc.send_signal(signal.SIGSTOP)
        process.proc.send_signal(signal.SIGINT)
        second = process.wait_for("second SIGINT")
        assert "skipping the grace" in second
        for job_id in ids:
            assert f"{job_id} (nap)" in second
        process.proc.send_signal(signal.SIGINT)
        third = process.wait_for("third SIGINT")
        assert process.wait(timeout=20) == 130
        assert "exiting now" in third
        assert "come back when their leases expire" in third
        for job_id in ids:
            assert f"{job_id} (nap)" in third
    finally:
        process.close()
        if server.proc is not None:
            server.proc.send_signal(signal.SIGCONT)


async def test_signal_while_waiting_for_the_broker_exits_at_once() -> None:
    from tests.redis_harness import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"
    process = worker(url)  # waits for the broker by default
    try:
        process.wait_for("waiting for the broker")
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 130
        assert "SIGTERM: stopped before the worker started" in process.text
        assert "Traceback" not in process.text
    finally:
        process.close()
