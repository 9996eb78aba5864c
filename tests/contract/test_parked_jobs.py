"""Parked jobs (SPEC section 9, docs/deploys.md): a step of a workflow whose payload a
deploy left undecodable (``schema_mismatch``) fails without ending its flow; once the
app is fixed, an operator retry runs it and the flow goes on as if nothing happened. A
cancel still ends the flow; an ordinary failure still fails it; failed-job retention
deleting a parked job fails its flow, saying so (a member counted once). Runs on every
broker."""

from __future__ import annotations

import anyio
import pytest

from tests.stubfix import orders_v1, orders_v2
from tests.support import TEST_DEADLINE, In, Out
from typedq import (
    App,
    FailureReason,
    JobCancelled,
    JobFailed,
    JobState,
    Producer,
    Retention,
)
from typedq.broker.base import Broker, BrokerSettings, RetryOutcome
from typedq.broker.memory import MemoryBroker
from typedq.broker.records import parked_trimmed_message
from typedq.errors import FailureRecord

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

V1 = orders_v1.Order


@pytest.fixture
def shared(broker_url: str, app_name: str) -> str | Broker:
    """What both sides connect to: one MemoryBroker instance, or the Redis URL."""
    if broker_url.startswith("memory"):
        return MemoryBroker(BrokerSettings(namespace=app_name))
    return broker_url


def v2_app(
    name: str, broker: str | Broker, ran: list[str], retention: Retention | None = None
) -> App:
    """The deployed app: ``place`` takes the breaking v2 order, while ``make`` (not yet
    moved on) still makes v1 orders, which ``place`` cannot decode."""
    app = App(name, broker=broker, retention=retention)

    @app.task(queue="orders")
    async def make(x: In) -> orders_v1.Order:
        ran.append("make")
        return orders_v1.Order(x.n, x.n)

    @app.task(queue="orders")
    async def place(order: orders_v2.Order) -> orders_v1.Ack:
        ran.append("place")
        return orders_v1.Ack(order.order_id, note=str(order.amount_cents))

    @app.task(queue="orders")
    async def note(ack: orders_v1.Ack) -> Out:
        ran.append("note")
        return Out(int(ack.note or "0"))

    @app.task(queue="orders")
    async def total(acks: list[orders_v1.Ack]) -> Out:
        ran.append("total")
        return Out(sum(int(a.note or "0") for a in acks))

    return app


def fix(app: App, producer: Producer) -> None:
    """The fix: ``place`` upcasts the old producer's v1 orders."""
    v1 = producer.tasks["place"].input.fingerprint

    @app.tasks["place"].upcast(v1)
    def from_v1(order: orders_v1.Order) -> orders_v2.Order:
        return orders_v2.Order(order.order_id, order.amount * 100)


async def parked(app: App, job_id: str) -> FailureRecord:
    """Wait until job ``job_id`` failed with ``schema_mismatch``: its record."""
    with pytest.raises(JobFailed) as failed:
        await app.tasks["place"].job(job_id).result(timeout=10)
    assert failed.value.record.reason is FailureReason.SCHEMA_MISMATCH
    return failed.value.record


async def test_a_parked_chain_step_resumes_its_flow_after_a_retry(
    shared: str | Broker, app_name: str
) -> None:
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            step = f"{job.id}.1"
            await parked(app, step)
            state = await app.broker.flow_state(job.id)
            assert state is not None
            assert state.pending != -1  # the flow still runs
            assert await job.status() is JobState.SCHEDULED  # its last step never ran
            fix(app, old)
            assert await app.broker.retry([step]) == [RetryOutcome.RETRIED]
            assert await job.result(timeout=10) == Out(300)
            assert await job.status() is JobState.COMPLETED
    assert ran == ["make", "place", "note"]


async def test_a_parked_fan_out_member_fires_the_callback_once_after_a_retry(
    shared: str | Broker, app_name: str
) -> None:
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    total = old.task("total", list[orders_v1.Ack], Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await place.map(V1(i, i) for i in range(3)).then(total).enqueue()
            members = [f"{job.id}.m{i}" for i in range(3)]
            for member in members:
                await parked(app, member)
            assert await job.status() is JobState.SCHEDULED
            fix(app, old)
            assert await app.broker.retry(members) == [RetryOutcome.RETRIED] * 3
            assert await job.result(timeout=10) == Out(300)
    assert ran.count("total") == 1


async def test_cancelling_a_parked_flow_ends_it(shared: str | Broker, app_name: str) -> None:
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            await parked(app, f"{job.id}.1")
            assert await job.cancel()
            with pytest.raises(JobCancelled):
                await job.result(timeout=10)
    assert "note" not in ran


async def test_an_ordinary_failure_still_fails_its_flow(
    shared: str | Broker, app_name: str
) -> None:
    app = App(app_name, broker=shared)

    @app.task
    async def bad(x: In) -> In:
        raise ValueError("no")

    @app.task
    async def after(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await bad.then(after).enqueue(In(1))
            with pytest.raises(JobFailed):
                await job.result(timeout=10)


async def test_cancelling_the_parked_job_ends_its_flow(shared: str | Broker, app_name: str) -> None:
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            step = place.job(f"{job.id}.1")
            await parked(app, step.id)
            assert await step.cancel()
            assert await step.status() is JobState.CANCELLED
            with pytest.raises(JobCancelled):
                await job.result(timeout=10)
            state = await app.broker.flow_state(job.id)
            assert state is not None
            assert state.pending == -1  # ended
            assert await step.cancel() is False  # final now, like any cancelled job
    assert "note" not in ran


async def test_a_parked_step_of_a_flow_across_queues_resumes_it(
    shared: str | Broker, app_name: str
) -> None:
    """Steps on other queues (other slots on Redis Cluster: the flow settles through its
    outbox there): a park emits no flow failure, and the retry resumes the flow."""
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)

    @app.task(queue="notes")
    async def remark(ack: orders_v1.Ack) -> Out:
        ran.append("remark")
        return Out(int(ack.note or "0") + 1)

    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    last = old.task("remark", orders_v1.Ack, Out, queue="notes")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(last).enqueue(In(2))
            step = f"{job.id}.1"
            await parked(app, step)
            assert await job.status() is JobState.SCHEDULED
            fix(app, old)
            assert await app.broker.retry([step]) == [RetryOutcome.RETRIED]
            assert await job.result(timeout=10) == Out(201)
    assert ran == ["make", "place", "remark"]


async def test_a_parked_fan_in_callback_completes_its_flow_after_a_retry(
    shared: str | Broker, app_name: str
) -> None:
    """The callback itself is parked (its members' v1 results do not decode as the
    deployed v2 list); the fix is a release whose callback decodes them."""
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)

    @app.task(queue="orders")
    async def count(orders: list[orders_v2.Order]) -> Out:
        ran.append("count v2")
        return Out(len(orders))

    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    count_v1 = old.task("count", list[V1], Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old:
            async with app, app.worker(concurrency=2):
                job = await make.map(In(i) for i in range(3)).then(count_v1).enqueue()
                await parked_callback(app, job.id)
                state = await app.broker.flow_state(job.id)
                assert state is not None
                assert state.pending != -1  # the flow still runs
            fixed = App(app_name, broker=shared)

            @fixed.task(queue="orders")
            async def count(orders: list[orders_v1.Order]) -> Out:
                ran.append("count v1")
                return Out(sum(o.amount for o in orders))

            async with fixed, fixed.worker(concurrency=2):
                assert await fixed.broker.retry([job.id]) == [RetryOutcome.RETRIED]
                assert await fixed.tasks["count"].job(job.id).result(timeout=10) == Out(3)
    assert ran.count("count v1") == 1


async def parked_callback(app: App, job_id: str) -> None:
    """Wait until the callback ``job_id`` failed with ``schema_mismatch``."""
    with pytest.raises(JobFailed) as failed:
        await app.tasks["count"].job(job_id).result(timeout=10)
    assert failed.value.record.reason is FailureReason.SCHEMA_MISMATCH


def kept_failed(broker_url: str, app_name: str, failed_max: int) -> tuple[str | Broker, Retention]:
    """What both sides connect to, keeping at most ``failed_max`` failed jobs a queue."""
    retention = Retention(failed_max=failed_max)
    if broker_url.startswith("memory"):
        return MemoryBroker(BrokerSettings(namespace=app_name, retention=retention)), retention
    return broker_url, retention


def with_failing(app: App, ran: list[str]) -> None:
    """``fail``: an ordinary failure on the flows' queue, to push retention."""

    @app.task(queue="orders")
    async def fail(x: In) -> Out:
        ran.append("fail")
        raise ValueError("no")


async def test_retention_deleting_a_parked_step_fails_its_flow_saying_so(
    broker_url: str, app_name: str
) -> None:
    """A parked step is failed like any other, so failed-job retention deletes it in
    time; its flow then fails (never waits forever for a job that is gone), with reason
    schema_mismatch and a message naming the job and retention."""
    ran: list[str] = []
    shared, retention = kept_failed(broker_url, app_name, failed_max=1)
    app = v2_app(app_name, shared, ran, retention)
    with_failing(app, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            step = f"{job.id}.1"
            own = await parked(app, step)
            await app.tasks["fail"].enqueue(In(1))  # the failed bound (1) deletes the step
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=10)
            record = failed.value.record
            assert record.reason is FailureReason.SCHEMA_MISMATCH
            assert record.error_type == own.error_type
            # The same text on every broker (the Lua spells it: records.py's docstring).
            assert record.message == parked_trimmed_message(step, own.message)
            assert "was deleted by failed-job retention" in record.message
            assert await app.broker.get([step]) == [None]
            state = await app.broker.flow_state(job.id)
            assert state is not None
            assert state.pending == -1  # ended
            assert await app.broker.retry([step]) == [RetryOutcome.NOT_FOUND]
    assert "note" not in ran


async def test_retention_deleting_a_parked_member_counts_it_failed_once(
    broker_url: str, app_name: str
) -> None:
    """A fan-out member deleted while parked settles as failed, once: the other parked
    members are retried and complete, and the callback then fails with its record."""
    ran: list[str] = []
    shared, retention = kept_failed(broker_url, app_name, failed_max=4)
    app = v2_app(app_name, shared, ran, retention)
    with_failing(app, ran)
    old = Producer(app_name, broker=shared)
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    total = old.task("total", list[orders_v1.Ack], Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await place.map(V1(i, i) for i in range(4)).then(total).enqueue()
            members = [f"{job.id}.m{i}" for i in range(4)]
            owns = {member: await parked(app, member) for member in members}
            bad = await app.tasks["fail"].enqueue(In(1))  # the fifth failed job: one goes
            with pytest.raises(JobFailed):
                await bad.result(timeout=10)
            records = await app.broker.get(members)
            gone = [m for m, r in zip(members, records, strict=True) if r is None]
            assert len(gone) == 1
            state = await app.broker.flow_state(job.id)
            assert state is not None
            assert (state.pending, state.failed) == (3, 1)  # settled as failed, once
            fix(app, old)
            rest = [m for m in members if m not in gone]
            assert await app.broker.retry(rest) == [RetryOutcome.RETRIED] * 3
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=10)
            record = failed.value.record
            assert record.reason is FailureReason.SCHEMA_MISMATCH
            assert record.message == parked_trimmed_message(gone[0], owns[gone[0]].message)
    assert ran.count("place") == 3
    assert "total" not in ran


async def test_removing_a_parked_step_fails_its_flow(shared: str | Broker, app_name: str) -> None:
    """An operator's remove of a parked step (inspect --remove, jobs --remove) ends its
    flow as a removed step does (flow_broken): the flow never waits for a deleted job."""
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            step = f"{job.id}.1"
            await parked(app, step)
            assert await app.broker.remove([step]) == [True]
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=10)
            assert failed.value.record.reason is FailureReason.FLOW_BROKEN
            state = await app.broker.flow_state(job.id)
            assert state is not None
            assert state.pending == -1
    assert "note" not in ran


async def test_purging_failed_jobs_takes_a_parked_step_and_what_its_flow_ends(
    shared: str | Broker, app_name: str
) -> None:
    """A purge of the failed state deletes a parked step; its flow then ends (as a
    removed step's does), failing the held step, which is in the purged state too: it
    goes as well, counted, on every broker (nothing failed is left)."""
    ran: list[str] = []
    app = v2_app(app_name, shared, ran)
    old = Producer(app_name, broker=shared)
    make = old.task("make", In, V1, queue="orders")
    place = old.task("place", V1, orders_v1.Ack, queue="orders")
    note = old.task("note", orders_v1.Ack, Out, queue="orders")
    with anyio.fail_after(TEST_DEADLINE):
        async with old, app, app.worker(concurrency=2):
            job = await make.then(place).then(note).enqueue(In(3))
            await parked(app, f"{job.id}.1")
            assert await app.broker.purge("orders", [JobState.FAILED]) == 2
            counts = await app.broker.counts("orders")
            assert counts.get(JobState.FAILED, 0) == 0
            assert await app.broker.get([job.id]) == [None]
            state = await app.broker.flow_state(job.id)
            assert state is None or state.pending == -1
    assert "note" not in ran
