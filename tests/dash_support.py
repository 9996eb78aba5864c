"""Helpers of the dashboard tests: a ``typedq dashboard`` process, and seeding the
dashboard app's jobs in several states."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import msgspec
import pytest

from tests.cli_process import TypedqProcess
from tests.dash_app import Charge, Report, app, charge, report
from tests.redis_harness import free_port
from typedq import JobFailed


class Seeded(msgspec.Struct, frozen=True):
    """The ids of the seeded jobs."""

    failed: str
    completed: str
    waiting: str
    scheduled: str


def seed(broker_url: str, ticket: Path) -> Seeded:
    """A failed ``charge`` (its ticket is missing), a completed ``report``, a waiting and
    a scheduled one (no worker serves ``reports`` afterwards)."""

    async def run() -> Seeded:
        with app.using_broker(broker_url), anyio.fail_after(30):
            async with app:
                bad = await charge.enqueue(Charge(order=7, ticket=str(ticket)))
                good = await report.enqueue(Report(n=1))
                async with app.worker(concurrency=2, queues=["billing", "reports"]):
                    with pytest.raises(JobFailed):
                        await bad.result(timeout=10)
                    await good.result(timeout=10)
                waiting = await report.enqueue(Report(n=2))
                scheduled = await report.enqueue(Report(n=3), delay=3600)
                return Seeded(bad.id, good.id, waiting.id, scheduled.id)

    return anyio.run(run)


@contextlib.contextmanager
def dashboard_process(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """``typedq dashboard ARGS --port P`` running; yields its base URL once it answers."""
    port = free_port()
    proc = TypedqProcess("dashboard", *args, "--port", str(port), env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        proc.wait_for("dashboard of app")
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(base + "/", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or proc.proc.poll() is not None:
                raise AssertionError("the dashboard did not answer:\n" + proc.text)
            time.sleep(0.1)
        yield base
    finally:
        proc.close()
