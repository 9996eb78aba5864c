"""A producer through generated stubs is typed exactly like one through the real task."""

from __future__ import annotations

from typing import reveal_type

from stubs.billing import (
    CardDeclined,
    Receipt,
    Refund,
    SendInvoice,
    Statement,
    StatementRequest,
    app,
    refund,
    render_statement,
    send_invoice,
)
from typedq import Enqueuer, Job, JobFailed, Producer, TaskStub
from typedq.task import TaskBase

INVOICE = SendInvoice(customer_id=1, invoice_id=7)


async def helper(task: Enqueuer[SendInvoice, Receipt]) -> Receipt:
    return await (await task.enqueue(INVOICE)).result()


def base(task: TaskBase[SendInvoice, Receipt]) -> str:
    return task.name


async def produce() -> None:
    reveal_type(app)  # R: typedq.producer.Producer
    # R: typedq.producer.TaskStub[examples.billing.models.SendInvoice, examples.billing.models.Receipt]
    reveal_type(send_invoice)
    reveal_type(refund)  # R: typedq.producer.TaskStub[examples.billing.models.Refund, None]
    app.use_broker("redis://localhost:6379/0")
    async with app:
        job = await send_invoice.enqueue(INVOICE, priority=3)
        reveal_type(job)  # R: typedq.job.Job[examples.billing.models.Receipt]
        receipt: Receipt = await job.result(timeout=10)
        requests = [StatementRequest(i, "2024-05") for i in range(3)]
        jobs: list[Job[Statement]] = await render_statement.enqueue_many(requests)
        done = await refund.enqueue(Refund(receipt_id="R", amount_cents=5), job_id="r-1")
        reveal_type(done)  # R: typedq.job.Job[None]
        await done.result()
        again: Receipt = await helper(send_invoice)
        name: str = base(send_invoice)
        try:
            await job.result()
        except JobFailed as exc:
            declined: CardDeclined | None = exc.domain_error(CardDeclined)
            print(declined)
    print(receipt, jobs, again, name)


def declare() -> TaskStub[SendInvoice, Receipt]:
    producer = Producer("billing", broker="memory://")
    task = producer.task("send_invoice", SendInvoice, Receipt, queue="billing")
    # R: typedq.producer.TaskStub[examples.billing.models.SendInvoice, examples.billing.models.Receipt]
    reveal_type(task)
    none_out = producer.task("refund", Refund, type(None))
    reveal_type(none_out)  # R: typedq.producer.TaskStub[examples.billing.models.Refund, None]
    maybe = producer.task("lookup", Refund, Receipt, optional_output=True)
    # R: typedq.producer.TaskStub[examples.billing.models.Refund, examples.billing.models.Receipt | None]
    reveal_type(maybe)
    return task.bind(producer)
