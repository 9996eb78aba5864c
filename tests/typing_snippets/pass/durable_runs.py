"""Durable runs on an app (issue 26): ``@app.durable`` gives a DurableTask typed by the
function's input and result; a RunHandle's ``send`` takes the signal's model, and
``emitted`` yields the event models it is given."""

from __future__ import annotations

from typing import reveal_type

from snip import CardDeclined, Image, Receipt, SendInvoice, app

from typedq.durable import LogEntry, Run, Signal

approval = Signal("approval", CardDeclined)


@app.task
async def charge(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.durable
async def checkout(run: Run, invoice: SendInvoice) -> Receipt:
    await run.wait_for(approval)
    await run.emit(Image(url="progress"))
    return await run.step(charge, invoice)


@app.durable(queue="runs", retries=3)
async def notify(run: Run, invoice: SendInvoice) -> None:
    await run.step(charge, invoice)


reveal_type(checkout)  # R: typedq.durable.host.DurableTask[snip.SendInvoice, snip.Receipt]
reveal_type(notify)  # R: typedq.durable.host.DurableTask[snip.SendInvoice, None]


async def drive() -> None:
    handle = await checkout.start(SendInvoice(customer_id=1, invoice_id=2), run_id="r-1")
    reveal_type(handle)  # R: typedq.durable.host.RunHandle[snip.Receipt]
    await handle.send(approval, CardDeclined(code="no"))
    receipt = await handle.result(timeout=5)
    reveal_type(receipt)  # R: snip.Receipt
    await handle.cancel()
    async for image in handle.emitted(Image):
        reveal_type(image)  # R: snip.Image
    async for event in handle.emitted(Image, CardDeclined):
        reveal_type(event)  # R: snip.Image | snip.CardDeclined
    async for entry in handle.events():
        timeline: LogEntry = entry
        print(timeline.position)
