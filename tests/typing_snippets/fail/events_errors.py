"""An event's result has the task's output type, and only completed events have one."""

from __future__ import annotations

from snip import Receipt, SendInvoice, Thumb, app

from typedq import CompletedEvent


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


async def follow() -> None:
    async for event in app.events(send_invoice):
        _ = event.result  # E: union-attr "FailedEvent"  # E: union-attr "EventGap"
        if isinstance(event, CompletedEvent):
            wrong: Thumb = event.result  # E: assignment "Receipt", variable has type "Thumb"
            print(wrong)
    app.events(send_invoice, after="last")  # E: arg-type "str"
    app.events(SendInvoice)  # E: arg-type
