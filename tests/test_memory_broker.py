"""Embedded-broker specifics that the contract suite does not cover."""

from __future__ import annotations

import msgspec
import pytest

from typedq import App, Client, JobState
from typedq.broker.base import BrokerSettings, CancelOutcome, JobMessage
from typedq.broker.memory import MemoryBroker
from typedq.testing import FakeClock

pytestmark = pytest.mark.anyio


class Ping(msgspec.Struct):
    n: int


async def test_one_broker_shared_by_two_clients_in_any_order() -> None:
    broker = MemoryBroker(BrokerSettings(namespace="shared"))
    app = App("shared", broker=broker)

    @app.task
    async def double(ping: Ping) -> Ping:
        return Ping(n=ping.n * 2)

    producer = Client(broker, name="shared")
    # The worker's app connects first, then the producer: the second connect must not
    # replace the wake-up events the running worker waits on.
    async with app, app.worker(concurrency=2):
        async with producer:
            message = double.message(Ping(n=21))
            (outcome,) = await producer.enqueue_many([message])
            assert outcome.created
            result = await double.job(outcome.id).result(timeout=5)
            assert result == Ping(n=42)
        # The producer closed; the app's connection still works.
        job = await double.enqueue(Ping(n=1))
        assert await job.result(timeout=5) == Ping(n=2)


async def test_close_is_idempotent() -> None:
    broker = MemoryBroker()
    await broker.connect()
    await broker.close()
    await broker.close()  # a second close does nothing
    await broker.connect()
    assert await broker.get(["nope"]) == [None]
    await broker.close()


async def test_reused_scheduled_id_ignores_the_old_heap_entry() -> None:
    """Issue 7, defect 8: the old entry of a removed job must not make its successor due."""
    clock = FakeClock(start=1_000_000.0)
    broker = MemoryBroker(clock=clock)
    await broker.connect()
    try:
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=0.5)])
        assert await broker.remove(["s"]) == [True]
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=3600)])
        clock.advance(1)
        assert not broker.has_due_jobs()
        assert await broker.claim(["q"], 10, worker_id="w", lease=60) == []
        (record,) = await broker.get(["s"])
        assert record is not None
        assert record.state is JobState.SCHEDULED
        assert record.run_at == 1_000_000.0 + 3600
        clock.advance(3600)
        assert broker.has_due_jobs()
        (claimed,) = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert claimed.message.id == "s"
    finally:
        await broker.close()


async def test_entries_never_outlive_many_incarnations_of_an_id() -> None:
    """Remove and re-create one id many times: only the live job is ever claimable."""
    broker = MemoryBroker()
    await broker.connect()
    try:
        for n in range(50):
            message = JobMessage(id="x", task="t", queue="q", payload=bytes([n]), priority=n % 3)
            await broker.enqueue([message])
            if n % 2:
                assert await broker.cancel("x") is CancelOutcome.CANCELLED
            assert await broker.remove(["x"]) == [True]
        last = JobMessage(id="x", task="t", queue="q", payload=b"last", priority=-1)
        await broker.enqueue([last, JobMessage(id="y", task="t", queue="q", payload=b"")])
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert claimed[0].message.id == "y"
        assert [c.message.payload for c in claimed] == [b"", b"last"]
    finally:
        await broker.close()
