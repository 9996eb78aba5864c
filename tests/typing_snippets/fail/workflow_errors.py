"""What mypy rejects in workflows: steps whose types do not meet."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import Failed, Ok


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


@app.task
async def make_album(thumbs: list[Thumb]) -> Receipt:
    return Receipt(receipt_id="a", total_cents=len(thumbs))


@app.task
async def by_receipts(receipts: list[Receipt]) -> Receipt:
    return receipts[0]


@app.task
async def report(outcomes: list[Ok[Thumb] | Failed]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=len(outcomes))


async def mismatches(images: list[Image]) -> None:
    # E: arg-type "Task[Image, Thumb]"; expected "TaskBase[Receipt, Thumb]"
    send_invoice.then(resize)
    resize.map(images).then(make_album).then(resize)  # E: arg-type "then" of "Flow"
    resize.then(make_album)  # E: arg-type expected "TaskBase[Thumb, Receipt]"
    resize.map([SendInvoice(customer_id=1, invoice_id=2)])  # E: list-item expected "Image"
    resize.map(images).then(by_receipts)  # E: arg-type expected "TaskBase[list[Thumb], Receipt]"
    resize.map(images).then(resize)  # E: arg-type expected "TaskBase[list[Thumb], Thumb]"
    resize.map(images).then(report)  # E: arg-type "then" of "FanOut"
    # E: arg-type expected "TaskBase[list[Ok[Thumb] | Failed], Receipt]"
    resize.map(images).collect(make_album)
    job = await resize.map(images).then(make_album).enqueue()
    wrong: Thumb = await job.result()  # E: assignment "Receipt", variable has type "Thumb"
    fan = await resize.map(images).enqueue()
    single: Thumb = await fan.result()  # E: assignment "list[Thumb]", variable has type "Thumb"
    print(wrong, single)
    chain = send_invoice.then(send_invoice)  # E: arg-type expected "TaskBase[Receipt, Receipt]"
    print(chain)
    await make_album.enqueue([Image(url="x")])  # E: list-item expected "Thumb"
