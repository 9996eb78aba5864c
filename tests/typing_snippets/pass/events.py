"""app.events(task) is typed by the task: a completed event's result is its output type."""

from __future__ import annotations

from typing import reveal_type

from snip import Receipt, SendInvoice, app

from typedq import CompletedEvent, EventGap, FailedEvent


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


async def follow() -> None:
    events = app.events(send_invoice)
    reveal_type(events)  # R: typedq.events.EventStream[snip.Receipt]
    async for event in events:
        if isinstance(event, CompletedEvent):
            reveal_type(event.result)  # R: snip.Receipt
            total: int = event.result.total_cents
            print(total)
        elif isinstance(event, FailedEvent):
            if event.record is not None:
                reveal_type(event.record.error_type)  # R: str
        else:
            reveal_type(event)  # R: typedq.events.EventGap
            missed: int = event.missed
            print(missed)
    async with app.events(send_invoice, after=41, replay=False) as resumed:
        event = await anext(resumed)
        match event:
            case CompletedEvent(result=receipt):
                reveal_type(receipt)  # R: snip.Receipt
            case FailedEvent() | EventGap():
                pass
