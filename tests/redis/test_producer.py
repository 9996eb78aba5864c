"""Producers through stubs: a :class:`~typedq.Producer` and its TaskStubs against a real worker.

Runs on the embedded broker (one MemoryBroker instance shared by the producer's client
and the app's, in one process) and on Redis (two clients, one server). Covers the
verified-stubs contract (docs/producers.md): a stale producer whose payload no longer
validates fails with ``schema_mismatch`` naming the task and both fingerprints; a
compatible change runs and is counted and logged once per fingerprint.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from examples.billing.models import CardDeclined, Receipt, SendInvoice
from tests.stubfix import orders_v1, orders_v2, orders_v2_optional
from tests.support import TEST_DEADLINE
from typedq import App, FailureReason, JobFailed, JobState, Producer, TaskStub, Worker
from typedq.broker.base import Broker, BrokerSettings
from typedq.broker.memory import MemoryBroker
from typedq.task import Enqueuer, TIn, TOut

pytestmark = pytest.mark.anyio


@pytest.fixture
def shared(broker_url: str, app_name: str) -> str | Broker:
    """What both sides connect to: one MemoryBroker instance, or the Redis URL."""
    if broker_url.startswith("memory"):
        return MemoryBroker(BrokerSettings(namespace=app_name))
    return broker_url


@contextlib.asynccontextmanager
async def running(producer: Producer, app: App) -> AsyncIterator[Worker[Any, Any]]:
    """Connect the producer, then the app, and run a worker for the app.

    The producer connects first: on a shared MemoryBroker the second ``connect`` makes
    the wake-up events the worker then waits on.
    """
    with anyio.fail_after(TEST_DEADLINE):
        async with producer, app, app.worker(concurrency=4) as worker:
            yield worker


def billing_app(name: str, broker: str | Broker) -> App:
    """The billing example's handlers, registered on a fresh app (a test's namespace)."""
    from examples.billing import tasks

    app = App(name, broker=broker)
    for task in tasks.app.tasks.values():
        app.task(
            name=task.name,
            queue=task.queue,
            retries=task.options.retries,
            backoff=task.options.backoff,
            timeout=task.options.timeout,
            priority=task.options.priority,
            errors=task.options.errors,
            key=task.key,
        )(task.fn)
    return app


async def call(task: Enqueuer[TIn, TOut], payload: TIn) -> TOut:
    """A helper typed by the shared protocol: it takes a stub or a real task."""
    return await (await task.enqueue(payload)).result(timeout=10)


async def test_stub_enqueues_to_the_real_worker_and_gets_typed_results(
    shared: str | Broker, app_name: str
) -> None:
    import stubs.billing as stub

    app = billing_app(app_name, shared)
    producer = Producer(app_name, broker=shared)
    send = stub.send_invoice.bind(producer)
    assert isinstance(send, TaskStub)
    async with running(producer, app):
        receipt = await call(send, SendInvoice(customer_id=1, invoice_id=7))
        assert receipt == Receipt(receipt_id="R-1-7", total_cents=1007)
        # The same helper takes the real task.
        real = await call(app.tasks["send_invoice"], SendInvoice(customer_id=2, invoice_id=3))
        assert real.receipt_id == "R-2-3"

        declined = await send.enqueue(SendInvoice(customer_id=13, invoice_id=1))
        with pytest.raises(JobFailed) as failed:
            await declined.result(timeout=10)
        assert failed.value.reason is FailureReason.DOMAIN_ERROR
        assert failed.value.domain_error(CardDeclined) == CardDeclined(13, "insufficient_funds")

        jobs = await send.enqueue_many(SendInvoice(customer_id=3, invoice_id=i) for i in range(50))
        totals = [(await job.result(timeout=10)).total_cents for job in jobs]
        assert totals == [1000 + i for i in range(50)]


async def test_stub_messages_match_the_real_tasks(shared: str | Broker, app_name: str) -> None:
    import stubs.billing as stub

    app = billing_app(app_name, shared)
    for name, task in app.tasks.items():
        declared = stub.app.tasks[name]
        payload = {
            "send_invoice": SendInvoice(1, 2),
            "refund": stub.Refund(receipt_id="R", amount_cents=5),
            "render_statement": stub.StatementRequest(1, "2024-05"),
        }[name]
        ours, theirs = declared.message(payload, job_id="j1"), task.message(payload, job_id="j1")
        assert ours == theirs


async def test_producer_needs_only_a_broker_url(shared: str | Broker, app_name: str) -> None:
    producer = Producer(app_name, broker=shared, max_queue_length=3)
    ping = producer.task("ping", orders_v1.Order, orders_v1.Ack, queue="orders", priority=7)
    async with producer:
        jobs = await ping.enqueue_many(orders_v1.Order(i, i) for i in range(3))
        assert [await job.status() for job in jobs] == [JobState.WAITING] * 3
        info = await jobs[0].info()
        assert (info.queue, info.priority, info.task) == ("orders", 7, "ping")


async def test_outdated_stub_whose_payload_no_longer_validates_fails_with_schema_mismatch(
    shared: str | Broker, app_name: str
) -> None:
    app = App(app_name, broker=shared)

    @app.task(queue="orders")
    async def place(order: orders_v2.Order) -> orders_v1.Ack:
        return orders_v1.Ack(order.order_id)

    producer = Producer(app_name, broker=shared)
    outdated = producer.task("place", orders_v1.Order, orders_v1.Ack, queue="orders")
    assert outdated.input.fingerprint != place.input.fingerprint
    async with running(producer, app) as worker:
        job = await outdated.enqueue(orders_v1.Order(order_id=1, amount=5))
        with pytest.raises(JobFailed) as failed:
            await job.result(timeout=10)
        # Up to date, the same worker runs it.
        assert (await place.enqueue(orders_v2.Order(2, 500))).id
    record = failed.value.record
    assert record.reason is FailureReason.SCHEMA_MISMATCH
    assert not record.retryable
    assert "'place'" in record.message
    assert outdated.input.fingerprint in record.message
    assert place.input.fingerprint in record.message
    assert worker.stats.fingerprint_mismatches == {}  # counted only when it runs


async def test_compatible_change_runs_and_is_counted_and_logged_once_per_fingerprint(
    shared: str | Broker, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = App(app_name, broker=shared)
    seen: list[orders_v2_optional.Order] = []

    @app.task(queue="orders")
    async def place(order: orders_v2_optional.Order) -> orders_v1.Ack:
        seen.append(order)
        return orders_v1.Ack(order.order_id, order.note)

    producer = Producer(app_name, broker=shared)
    old = producer.task("place", orders_v1.Order, orders_v1.Ack, queue="orders")
    assert old.input.fingerprint != place.input.fingerprint
    caplog.set_level(logging.WARNING, logger="typedq.worker")
    async with running(producer, app) as worker:
        jobs = await old.enqueue_many(orders_v1.Order(i, i * 10) for i in range(5))
        acks = [await job.result(timeout=10) for job in jobs]
        current = await (await place.enqueue(orders_v2_optional.Order(9, 1, "new"))).result(10)
    assert acks == [orders_v1.Ack(i) for i in range(5)]
    assert current == orders_v1.Ack(9, "new")
    assert sorted(o.order_id for o in seen) == [0, 1, 2, 3, 4, 9]
    assert worker.stats.fingerprint_mismatches == {("place", old.input.fingerprint): 5}
    logged = [r for r in caplog.records if old.input.fingerprint in r.getMessage()]
    assert len(logged) == 1
    assert place.input.fingerprint in logged[0].getMessage()


def test_stale_stub_warns_at_import_time(caplog: pytest.LogCaptureFixture) -> None:
    producer = Producer("stale")
    with caplog.at_level(logging.WARNING, logger="typedq.producer"):
        fresh = producer.task("a", orders_v1.Order, orders_v1.Ack)
        stale = producer.task("b", orders_v1.Order, orders_v1.Ack, fingerprint="0000000000000000")
    assert not fresh.stale
    assert stale.stale
    (record,) = caplog.records
    assert "stub of task 'b' was generated for input schema 0000000000000000" in record.message
    assert "regenerate the stub" in record.message


async def test_optional_output_round_trips_none_and_a_model(
    shared: str | Broker, app_name: str
) -> None:
    app = App(app_name, broker=shared)

    @app.task(queue="orders")
    async def lookup(order: orders_v1.Order) -> orders_v1.Ack | None:
        return orders_v1.Ack(order.order_id) if order.amount else None

    producer = Producer(app_name, broker=shared)
    stub = producer.task(
        "lookup", orders_v1.Order, orders_v1.Ack, optional_output=True, queue="orders"
    )
    assert stub.output.type == lookup.output.type
    async with running(producer, app):
        assert await call(stub, orders_v1.Order(1, 0)) is None
        assert await call(stub, orders_v1.Order(2, 5)) == orders_v1.Ack(2)


def test_producer_refuses_a_task_declared_twice_and_non_models() -> None:
    producer = Producer("twice")
    producer.task("a", orders_v1.Order, type(None))
    with pytest.raises(ValueError, match="already declares a task named 'a'"):
        producer.task("a", orders_v1.Order, type(None))
    with pytest.raises(ValueError, match="invalid task name"):
        producer.task("a:b", orders_v1.Order, type(None))
    with pytest.raises(ValueError, match="is not a model"):
        producer.task("c", int, type(None))  # type: ignore[type-var]
