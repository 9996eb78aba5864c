"""``within=``: enqueue in the caller's database transaction; the job handle keeps its type."""

from __future__ import annotations

from typing import reveal_type

from snip import Receipt, SendInvoice, app

from typedq import Enqueuer


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


async def in_transaction(conn: object, producer: Enqueuer[SendInvoice, Receipt]) -> None:
    job = await send_invoice.enqueue(SendInvoice(customer_id=1, invoice_id=2), within=conn)
    reveal_type(job)  # R: typedq.job.Job[snip.Receipt]
    jobs = await send_invoice.enqueue_many(
        [SendInvoice(customer_id=1, invoice_id=3)], within=conn, priority=1
    )
    reveal_type(jobs)  # R: list[typedq.job.Job[snip.Receipt]]
    other = await producer.enqueue(SendInvoice(customer_id=1, invoice_id=4), within=conn)
    reveal_type(other)  # R: typedq.job.Job[snip.Receipt]
