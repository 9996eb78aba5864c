"""What mypy rejects in ``app.schedule``."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app


@app.task
async def send_digest(invoice: SendInvoice) -> None:
    pass


@app.task
def thumbnail(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


RECEIPT = Receipt(receipt_id="r", total_cents=1)
INVOICE = SendInvoice(customer_id=1, invoice_id=7)

app.schedule(send_digest, RECEIPT, every=30)  # E: arg-type "Receipt"; expected "SendInvoice"
app.schedule(thumbnail, INVOICE, cron="0 8 * * *")  # E: arg-type "SendInvoice"; expected "Image"
RAW = {"customer_id": 1, "invoice_id": 7}
app.schedule(send_digest, RAW, every=30)  # E: arg-type "dict[str, int]"
app.schedule(send_digest, every=30)  # E: call-arg Missing positional argument "payload"
app.schedule(send_digest, INVOICE, every="30s")  # E: arg-type "every"
app.schedule(send_digest, INVOICE, every=30, missed="all")  # E: arg-type "missed"
app.schedule(send_digest, INVOICE, every=30, overlap="wait")  # E: arg-type "overlap"
