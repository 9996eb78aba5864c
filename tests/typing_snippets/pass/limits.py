"""Rate and concurrency limits: key functions typed over the handler's input model."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import ConcurrencyLimit, JobContext, RateLimit, RateLimited


@app.task(rate_limit=RateLimit(100, per=1.0))
async def global_limit(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(rate_limit=RateLimit(5, per=1.0, key=lambda inv: inv.customer_id, burst=2))
async def per_customer(invoice: SendInvoice) -> Receipt:
    if invoice.invoice_id < 0:
        raise RateLimited(retry_after=1.5)
    return Receipt(receipt_id="r", total_cents=1)


@app.task(
    rate_limit=RateLimit(10, per=0.5, key=lambda image: image.url),
    concurrency=ConcurrencyLimit(2, key=lambda image: f"{image.url}:x"),
)
def both(image: Image, ctx: JobContext) -> Thumb:
    return Thumb(url=image.url, width=ctx.attempt)


@app.task(concurrency=ConcurrencyLimit(4))
async def task_wide(image: Image) -> None:
    pass


# A limit built beforehand, typed by its annotation.
SHARED: RateLimit[SendInvoice] = RateLimit(3, per=2.0, key=lambda inv: inv.invoice_id)


@app.task(rate_limit=SHARED)
async def shared(invoice: SendInvoice) -> None:
    pass
