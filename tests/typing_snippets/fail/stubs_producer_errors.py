"""What mypy rejects at a producer that enqueues through generated stubs."""

from __future__ import annotations

from stubs.billing import (
    Receipt,
    Refund,
    SendInvoice,
    Statement,
    StatementRequest,
    refund,
    render_statement,
    send_invoice,
)
from typedq import Enqueuer, Job, Producer

INVOICE = SendInvoice(customer_id=1, invoice_id=7)
REFUND = Refund(receipt_id="R", amount_cents=5)


async def helper(task: Enqueuer[SendInvoice, Receipt]) -> None:
    await task.enqueue(INVOICE)


async def produce() -> None:
    await send_invoice.enqueue(REFUND)  # E: arg-type "Refund"; expected "SendInvoice"
    await send_invoice.enqueue()  # E: call-arg Missing positional argument "payload"
    job = await send_invoice.enqueue(INVOICE)
    wrong: Statement = await job.result()  # E: assignment "Receipt", variable has type "Statement"
    print((await job.result()).url)  # E: attr-defined "Receipt" has no attribute "url"
    requests = [StatementRequest(1, "m")]
    jobs: list[Job[Receipt]] = await render_statement.enqueue_many(requests)  # E: assignment
    await render_statement.enqueue_many([INVOICE])  # E: list-item
    refunded = await refund.enqueue(REFUND)
    # E: func-returns-value  # E: assignment "None", variable has type "Receipt"
    value: Receipt = await refunded.result()
    await send_invoice.enqueue(INVOICE, priority="high")  # E: arg-type
    # E: arg-type "TaskStub[StatementRequest, Statement]"; expected "Enqueuer[SendInvoice, Receipt]"
    await helper(render_statement)
    print(wrong, jobs, value)


def declare() -> None:
    producer = Producer("billing")
    producer.task("x", int, Receipt)  # E: type-var
    producer.task("y", SendInvoice, str)  # E: type-var


async def optional_result() -> Receipt:
    maybe = Producer("billing").task("z", SendInvoice, Receipt, optional_output=True)
    return await maybe.job("j").result()  # E: return-value "Receipt | None", expected "Receipt"
