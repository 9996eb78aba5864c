"""Structured failures end to end, on every broker: what a producer learns from JobFailed.

Abort, declared and undeclared domain errors, ordinary exceptions, invalid payloads,
unknown tasks and invalid results each reach ``Job.result()`` as a typed ``JobFailed``
carrying a FailureRecord, and none of them crashes or stalls the worker.
"""

from __future__ import annotations

import time
from typing import cast

import anyio
import msgspec
import pytest

from tests.support import (
    TEST_DEADLINE,
    CardDeclined,
    In,
    Out,
    OutOfStock,
    PIn,
    POut,
    Undeclared,
)
from typedq import (
    Abort,
    App,
    Backoff,
    FailureReason,
    JobContext,
    JobFailed,
    JobState,
    Reject,
)
from typedq.broker.base import JobMessage
from typedq.names import new_job_id

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

NO_WAIT = Backoff(kind="fixed", base=0.0, jitter=0.0)


def raw(task: str, payload: bytes, *, queue: str = "default") -> JobMessage:
    """An envelope written by something other than a typed producer."""
    return JobMessage(id=new_job_id(), task=task, queue=queue, payload=payload)


async def test_abort_is_permanent(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls = 0

    @app.task(retries=3)
    async def charge(x: In) -> Out:
        nonlocal calls
        calls += 1
        raise Abort(f"card {x.n} is closed")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await charge.enqueue(In(4))
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=10)
            assert await job.status() is JobState.FAILED
    record = caught.value.record
    assert record.reason is FailureReason.ABORTED
    assert record.message == "card 4 is closed"
    assert record.attempt == 1
    assert record.retryable is False
    assert caught.value.error is None
    assert calls == 1


async def test_declared_domain_errors_reach_the_producer_typed(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    calls = 0

    @app.task(retries=3, errors=(CardDeclined, OutOfStock))
    async def buy(x: In) -> Out:
        nonlocal calls
        calls += 1
        if x.n == 1:
            raise Reject(CardDeclined(code="insufficient_funds"))
        raise Reject(OutOfStock(sku=f"sku-{x.n}"))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            declined = await buy.enqueue(In(1))
            missing = await buy.enqueue(In(2))
            with pytest.raises(JobFailed) as card:
                await declined.result(timeout=10)
            with pytest.raises(JobFailed) as stock:
                await missing.result(timeout=10)

    # msgspec model
    assert card.value.reason is FailureReason.DOMAIN_ERROR
    assert card.value.error == CardDeclined(code="insufficient_funds")
    typed = card.value.domain_error(CardDeclined)
    assert typed is not None
    assert typed.code == "insufficient_funds"
    assert card.value.domain_error(OutOfStock) is None
    assert card.value.record.error_type.endswith("CardDeclined")
    assert card.value.record.retryable is False
    assert card.value.record.attempt == 1
    # pydantic model
    assert stock.value.reason is FailureReason.DOMAIN_ERROR
    out_of_stock = stock.value.domain_error(OutOfStock)
    assert out_of_stock == OutOfStock(sku="sku-2")
    assert stock.value.domain_error(CardDeclined) is None
    assert calls == 2  # domain errors are permanent: no retries spent


async def test_undeclared_domain_error(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls = 0

    @app.task(retries=2, errors=(CardDeclined,))
    async def buy(x: In) -> Out:
        nonlocal calls
        calls += 1
        raise Reject(Undeclared(why="not listed"))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            with pytest.raises(JobFailed) as caught:
                await (await buy.enqueue(In(1))).result(timeout=10)
    record = caught.value.record
    assert record.reason is FailureReason.ERROR
    assert record.error_type == "UndeclaredDomainError"
    assert "Undeclared" in record.message
    assert "CardDeclined" in record.message  # says what is declared
    assert record.retryable is False
    assert caught.value.error is None
    assert caught.value.domain_error(CardDeclined) is None
    assert calls == 1


async def test_failure_record_fields(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    second_attempt = anyio.Event()
    go = anyio.Event()

    @app.task(retries=1, backoff=NO_WAIT)
    async def explode(x: In, ctx: JobContext) -> Out:
        if ctx.attempt == 2:
            second_attempt.set()
            await go.wait()
        raise ValueError(f"boom {ctx.attempt}")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker() as worker:
            before = time.time()
            job = await explode.enqueue(In(1))
            await second_attempt.wait()
            # While retrying, the job shows the failed attempt's record.
            info = await job.info()
            assert info.status is JobState.ACTIVE
            assert info.error is not None
            assert info.error.message == "boom 1"
            assert info.error.attempt == 1
            assert info.error.retryable is True
            go.set()
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=10)
            final_info = await job.info()
    record = caught.value.record
    assert record.reason is FailureReason.ERROR
    assert record.error_type == "ValueError"
    assert record.message == "boom 2"
    assert record.attempt == 2
    assert record.retryable is False
    assert record.worker_id == worker.id
    assert before <= record.failed_at <= time.time()
    assert record.traceback is not None
    assert "ValueError: boom 2" in record.traceback
    assert "explode" in record.traceback
    assert record.domain_type is None
    assert final_info.error == record
    assert final_info.status is JobState.FAILED
    assert final_info.attempt == 2
    assert caught.value.job_id == job.id
    assert caught.value.task == "explode"
    assert "boom 2" in str(caught.value)


async def test_invalid_payload_fails_at_once_and_worker_survives(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, max_payload_bytes=1000)
    handled: list[int] = []

    @app.task(retries=3)
    async def count_up(x: In) -> Out:
        handled.append(x.n)
        return Out(x.n + 1)

    @app.task(retries=3, queue="p")
    async def label(x: PIn) -> POut:
        return POut(label=f"{x.qty} x {x.name}")

    bad_type = raw("count_up", msgspec.msgpack.encode({"n": "seven"}))
    not_msgpack = raw("count_up", b"\xc1\xff garbage")
    too_big = raw("count_up", msgspec.msgpack.encode({"n": 1, "pad": "x" * 2000}))
    missing_field = raw("label", msgspec.msgpack.encode({"name": "bolt"}), queue="p")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            await app.broker.enqueue([bad_type, not_msgpack, too_big, missing_field])
            failures = {}
            for message in (bad_type, not_msgpack, too_big):
                with pytest.raises(JobFailed) as caught:
                    await count_up.job(message.id).result(timeout=10)
                failures[message.id] = caught.value.record
            with pytest.raises(JobFailed) as caught:
                await label.job(missing_field.id).result(timeout=10)
            failures[missing_field.id] = caught.value.record
            # Later jobs of both tasks still run.
            assert await (await count_up.enqueue(In(1))).result(timeout=10) == Out(2)
            good = await label.enqueue(PIn(name="bolt", qty=3))
            assert await good.result(timeout=10) == POut(label="3 x bolt")

    for record in failures.values():
        assert record.reason is FailureReason.INVALID_PAYLOAD
        assert record.attempt == 1  # no retries spent
        assert record.retryable is False
    assert "$.n" in failures[bad_type.id].message
    assert "count_up" in failures[bad_type.id].message
    assert "qty" in failures[missing_field.id].message
    assert "over the limit of 1000 bytes" in failures[too_big.id].message
    assert handled == [1]


async def test_unknown_task_lists_registered_names(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def alpha(x: In) -> Out:
        return Out(x.n)

    @app.task
    async def beta(x: In) -> Out:
        return Out(x.n)

    stray = raw("gamma", msgspec.msgpack.encode(In(1)))
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            await app.broker.enqueue([stray])
            with pytest.raises(JobFailed) as caught:
                await alpha.job(stray.id).result(timeout=10)
            assert await (await beta.enqueue(In(2))).result(timeout=10) == Out(2)
    record = caught.value.record
    assert record.reason is FailureReason.UNKNOWN_TASK
    assert "gamma" in record.message
    assert "alpha" in record.message
    assert "beta" in record.message
    assert record.retryable is False


async def test_wrong_result_type_is_invalid_result(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(retries=2)
    async def liar(x: In) -> Out:
        return cast(Out, In(x.n))  # the annotation says Out; the value is not

    @app.task(retries=2)
    def forgetful(x: In) -> Out:
        return cast(Out, None)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            for task in (liar, forgetful):
                with pytest.raises(JobFailed) as caught:
                    await (await task.enqueue(In(1))).result(timeout=10)
                record = caught.value.record
                assert record.reason is FailureReason.INVALID_RESULT
                assert record.attempt == 1
                assert record.retryable is False
                assert task.name in record.message
                assert "Out" in record.message


async def test_schema_fingerprint_mismatch(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def count_up(x: In) -> Out:
        return Out(x.n + 1)

    stale = "0123456789abcdef"
    compatible = JobMessage(
        id=new_job_id(),
        task="count_up",
        queue="default",
        payload=msgspec.msgpack.encode(In(1)),
        fingerprint=stale,
    )
    incompatible = JobMessage(
        id=new_job_id(),
        task="count_up",
        queue="default",
        payload=msgspec.msgpack.encode({"count": 1}),
        fingerprint=stale,
    )
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker() as worker:
            await app.broker.enqueue([compatible, incompatible])
            # A producer with another view of the schema: still runs while it validates ...
            assert await count_up.job(compatible.id).result(timeout=10) == Out(2)
            # ... and fails at once, saying why, when it does not.
            with pytest.raises(JobFailed) as caught:
                await count_up.job(incompatible.id).result(timeout=10)
    record = caught.value.record
    assert record.reason is FailureReason.SCHEMA_MISMATCH
    assert stale in record.message
    assert count_up.input.fingerprint in record.message
    assert "count_up" in record.message
    assert record.attempt == 1
    assert worker.stats.fingerprint_mismatches[("count_up", stale)] == 1
