"""What mypy rejects on durable runs' handles (issue 26): a start input that is not the
function's, a signal payload of another model, a result used as another type, an event
read as another model or of a type that is not a model."""

from __future__ import annotations

from snip import CardDeclined, Image, Receipt, SendInvoice, app

from typedq.durable import Run, Signal

approval = Signal("approval", CardDeclined)


@app.durable
async def checkout(run: Run, invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=1)


async def mismatches() -> None:
    await checkout.start(Image(url="x"))  # E: arg-type "Image"; expected "SendInvoice"
    handle = await checkout.start(SendInvoice(customer_id=1, invoice_id=2))
    img = Image(url="x")
    await handle.send(approval, img)  # E: misc Cannot infer value of type parameter "TPayload"
    image: Image = await handle.result()  # E: assignment "Receipt", variable has type "Image"
    print(image)
    async for event in handle.emitted(Image):
        receipt: Receipt = event  # E: assignment "Image", variable has type "Receipt"
        print(receipt)
    async for _ in handle.emitted(int):  # E: type-var "int"
        break
