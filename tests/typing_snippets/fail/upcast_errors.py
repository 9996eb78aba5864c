"""What mypy rejects in ``@task.upcast`` (typedq.upcast): an upcaster that does not
return the task's input model."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@send_invoice.upcast("0123456789abcdef")
def from_thumb(old: Thumb) -> SendInvoice:
    return SendInvoice(customer_id=old.width, invoice_id=0)


upcast: SendInvoice = from_thumb(Thumb(url="u", width=1))  # still the function


@send_invoice.upcast("fedcba9876543210")  # E: arg-type "Callable[[Image], Image]"
def returns_old(old: Image) -> Image:
    return old
