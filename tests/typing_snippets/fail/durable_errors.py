"""What mypy rejects in durable runs (preview, typedq.durable): a step's input that is not the
task's, a signal payload of another model, a step's result used as another type."""

from __future__ import annotations

from snip import CardDeclined, Image, Receipt, SendInvoice, Thumb, app

from typedq.durable import Run, Signal


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


approval = Signal("approval", CardDeclined)
not_a_model = Signal("count", int)  # E: type-var "Signal" cannot be "int"
wrong_channel: Signal[Image] = Signal("approval", CardDeclined)  # E: arg-type "type[CardDeclined]"
approval.encode(Image(url="x"))  # E: arg-type "Image"; expected "CardDeclined"


async def mismatches(run: Run, invoice: SendInvoice) -> None:
    run.step(send_invoice, Image(url="x"))  # E: misc Cannot infer value of type parameter "TIn"
    # E: arg-type "Task[SendInvoice, Receipt]"; expected "TaskBase[SendInvoice, Thumb]"
    receipt: Thumb = await run.step(send_invoice, invoice)
    ok: Image = await run.wait_for(approval)  # E: arg-type expected "Signal[Image]"
    thumb, sent = await run.gather(run.step(send_invoice, invoice), run.step(resize, ok))
    print(sent.receipt_id)  # E: attr-defined "Thumb" has no attribute "receipt_id"
    print(receipt, thumb.url)  # E: attr-defined "Receipt" has no attribute "url"
