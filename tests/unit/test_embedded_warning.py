"""A script on the embedded broker by default is told, once, that its jobs run only
inside its own process when no worker of that process runs them (issue 29, item 5); a
process whose worker runs, or that chose memory:// itself, is not bothered."""

from __future__ import annotations

import logging

import pytest

from tests.support import In, Out
from typedq import App, client

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("TYPEDQ_BROKER", raising=False)
    monkeypatch.setattr(client, "_warned_unserved", False)
    caplog.set_level(logging.WARNING, logger="typedq.client")


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "typedq.client"]


async def test_enqueue_to_the_default_embedded_broker_without_a_worker_warns_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("script")

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    async with app:
        await double.enqueue(In(1))
        await double.enqueue_many([In(2), In(3)])
    async with app:
        await double.enqueue(In(4))
    (line,) = warnings(caplog)
    assert "\n" not in line
    assert "enqueued a job to memory://, the embedded broker" in line
    assert "jobs there run only inside this process" in line
    assert "TYPEDQ_BROKER=redis://HOST:PORT/DB" in line
    assert "app 'script'" in line


async def test_no_warning_when_a_worker_of_this_process_runs_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("script")

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    async with app, app.worker(concurrency=2):
        job = await double.enqueue(In(21))
        assert await job.result(timeout=10) == Out(42)
    assert app.client.workers == 0
    assert warnings(caplog) == []


@pytest.mark.parametrize("chosen", ["argument", "environment"])
async def test_no_warning_when_memory_was_chosen(
    chosen: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    if chosen == "environment":
        monkeypatch.setenv("TYPEDQ_BROKER", "memory://")
    app = App("script", broker="memory://" if chosen == "argument" else None)

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    async with app:
        await double.enqueue(In(1))
    assert warnings(caplog) == []
