"""``within=`` checks the payload as ``enqueue`` does, and is a keyword only."""

from __future__ import annotations

from snip import Receipt, SendInvoice, app


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


RECEIPT = Receipt(receipt_id="r", total_cents=1)
INVOICE = SendInvoice(customer_id=1, invoice_id=2)


async def in_transaction(conn: object) -> None:
    # E: arg-type "Receipt"  # P: reportArgumentType "Receipt"
    await send_invoice.enqueue(RECEIPT, within=conn)
    # E: call-arg Too many positional  # P: reportCallIssue positional
    await send_invoice.enqueue(INVOICE, conn)
    # E: call-arg "job_id"  # P: reportCallIssue "job_id"
    await send_invoice.enqueue_many([INVOICE], within=conn, job_id="j")
