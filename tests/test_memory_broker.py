"""Embedded-broker specifics that the contract suite does not cover."""

from __future__ import annotations

import msgspec
import pytest

from typedq import App, Client
from typedq.broker.base import BrokerSettings
from typedq.broker.memory import MemoryBroker

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
