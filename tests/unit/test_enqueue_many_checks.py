"""What ``enqueue_many`` checks before sending, exactly as docs/tasks.md says: the model
class, encoding and size (a bad payload enqueues nothing), but not field values, which the
worker validates (``invalid_payload``)."""

from __future__ import annotations

import msgspec
import pydantic
import pytest

from typedq import App, EncodeError, FailureReason, JobFailed, JobState, PayloadTooLarge
from typedq.testing import run_worker

pytestmark = pytest.mark.anyio


class Invoice(msgspec.Struct):
    invoice_id: int


class Padded(Invoice):
    """An Invoice (so it passes the class check) over the app's 64-byte limit."""

    padding: str = "x" * 100


class Note(pydantic.BaseModel):
    text: str


def make_app() -> App:
    app = App("enqueue-checks", max_payload_bytes=64)

    @app.task
    async def charge(invoice: Invoice) -> None:
        pass

    return app


async def test_a_payload_of_another_class_or_too_large_enqueues_nothing() -> None:
    app = make_app()
    charge = app.tasks["charge"]
    async with run_worker(app) as harness:
        with pytest.raises(EncodeError, match="expected an instance of Invoice, got Note"):
            await charge.enqueue_many([Invoice(invoice_id=1), Note(text="x")])
        with pytest.raises(PayloadTooLarge):
            await charge.enqueue_many([Invoice(invoice_id=1), Padded(invoice_id=2)])
        await harness.idle()
        assert sum((await harness.counts()).values()) == 0


async def test_field_values_are_validated_by_the_worker_not_by_enqueue_many() -> None:
    app = make_app()
    charge = app.tasks["charge"]
    async with run_worker(app) as harness:
        # msgspec constructors do not check types (mypy does): this is stored as it is.
        (job,) = await charge.enqueue_many([Invoice(invoice_id="7")])  # type: ignore[arg-type]
        await harness.idle()
        assert await job.status() is JobState.FAILED
        with pytest.raises(JobFailed) as caught:
            await job.result(timeout=5)
    record = caught.value.record
    assert record.reason is FailureReason.INVALID_PAYLOAD
    assert "Expected `int`, got `str` - at `$.invoice_id`" in record.message
