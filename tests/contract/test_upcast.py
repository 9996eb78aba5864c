"""``@task.upcast(fingerprint)`` (typedq.upcast): a worker turns jobs of an old input
schema into the current model instead of failing them with ``schema_mismatch``; what it
refuses at registration; and ``typedq verify`` counting an upcast fingerprint as
compatible. Runs on every broker (producer and worker share one embedded broker, or
one Redis)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.stubfix import orders_v1, orders_v2
from tests.support import TEST_DEADLINE
from typedq import App, ConfigError, FailureReason, JobFailed, Producer
from typedq.broker.base import Broker, BrokerSettings
from typedq.broker.memory import MemoryBroker
from typedq.verify import verify

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

V1 = orders_v1.Order


@pytest.fixture
def shared(broker_url: str, app_name: str) -> str | Broker:
    """What both sides connect to: one MemoryBroker instance, or the Redis URL."""
    if broker_url.startswith("memory"):
        return MemoryBroker(BrokerSettings(namespace=app_name))
    return broker_url


def v2_app(name: str, broker: str | Broker, seen: list[orders_v2.Order]) -> App:
    app = App(name, broker=broker)

    @app.task(queue="orders")
    async def place(order: orders_v2.Order) -> orders_v1.Ack:
        seen.append(order)
        return orders_v1.Ack(order.order_id)

    return app


async def test_an_old_job_is_upcast_and_runs(shared: str | Broker, app_name: str) -> None:
    seen: list[orders_v2.Order] = []
    app = v2_app(app_name, shared, seen)
    place = app.tasks["place"]
    old = Producer(app_name, broker=shared)
    outdated = old.task("place", V1, orders_v1.Ack, queue="orders")
    v1 = outdated.input.fingerprint

    @place.upcast(v1)
    def from_v1(order: orders_v1.Order) -> orders_v2.Order:
        return orders_v2.Order(order_id=order.order_id, amount_cents=order.amount * 100)

    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2) as worker:
            job = await outdated.enqueue(V1(order_id=1, amount=5))
            assert await job.result(timeout=10) == orders_v1.Ack(1)
            current = await place.enqueue(orders_v2.Order(2, 700))
            assert await current.result(timeout=10) == orders_v1.Ack(2)
            report = await verify(app, app.broker)
    assert seen == [orders_v2.Order(1, 500), orders_v2.Order(2, 700)]
    assert worker.stats.fingerprint_mismatches[("place", v1)] == 1
    (row,) = [r for r in report.rows if r.fingerprint == v1]
    assert (row.verdict, row.reason) == ("compatible", "upcast by " + from_v1.__qualname__)
    assert report.exit_code == 0


async def test_a_dict_upcaster_and_its_failures_are_schema_mismatch(
    shared: str | Broker, app_name: str
) -> None:
    seen: list[orders_v2.Order] = []
    app = v2_app(app_name, shared, seen)
    place = app.tasks["place"]
    old = Producer(app_name, broker=shared)
    outdated = old.task("place", V1, orders_v1.Ack, queue="orders")

    @place.upcast(outdated.input.fingerprint)
    def from_raw(raw: dict[str, Any]) -> orders_v2.Order:
        if raw["amount"] < 0:
            raise ValueError("a negative amount")
        return orders_v2.Order(raw["order_id"], raw["amount"] * 100)

    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            ok = await outdated.enqueue(V1(order_id=1, amount=2))
            assert await ok.result(timeout=10) == orders_v1.Ack(1)
            bad = await outdated.enqueue(V1(order_id=2, amount=-1))
            with pytest.raises(JobFailed) as failed:
                await bad.result(timeout=10)
    assert seen == [orders_v2.Order(1, 200)]
    record = failed.value.record
    assert record.reason is FailureReason.SCHEMA_MISMATCH
    assert "upcast by" in record.message
    assert "from_raw raised ValueError: a negative amount" in record.message


def test_what_an_upcaster_must_be() -> None:
    app = App("upcasts")

    @app.task(queue="orders")
    async def place(order: orders_v2.Order) -> orders_v1.Ack:
        return orders_v1.Ack(order.order_id)

    v1 = Producer("upcasts").task("place", V1, orders_v1.Ack).input.fingerprint

    def wrong_model(order: orders_v2.Order) -> orders_v2.Order:
        return order

    def untyped(order: int) -> orders_v2.Order:
        return orders_v2.Order(order, 0)

    async def later(order: V1) -> orders_v2.Order:
        return orders_v2.Order(order.order_id, 0)

    def fine(order: V1) -> orders_v2.Order:
        return orders_v2.Order(order.order_id, order.amount)

    cases: list[tuple[str, Any, str]] = [
        ("v1", fine, "is not a schema fingerprint"),
        (place.input.fingerprint, fine, "is the task's current input schema"),
        (v1, wrong_model, "not " + v1),
        (v1, untyped, "must be annotated with the old model or dict"),
        (v1, later, "must be a plain def"),
    ]
    for fingerprint, fn, message in cases:
        with pytest.raises(ConfigError, match=message):
            place.upcast(fingerprint)(fn)
    place.upcast(v1)(fine)
    with pytest.raises(ConfigError, match="already upcasts from"):
        place.upcast(v1)(fine)
