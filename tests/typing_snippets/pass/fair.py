"""Fair shares: the key function typed over the handler's input model."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, app

from typedq import ConcurrencyLimit, Fair


@app.task(fair=Fair(key=lambda inv: inv.customer_id))
async def per_customer(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(
    fair=Fair(key=lambda image: image.url, weights={"big": 3}, default_weight=2),
    concurrency=ConcurrencyLimit(2, key=lambda image: image.url),
)
async def weighted(image: Image) -> None:
    pass


# Fair shares built beforehand, typed by their annotation.
SHARED: Fair[Image] = Fair(key=lambda image: image.url)


@app.task(fair=SHARED)
async def shared(image: Image) -> None:
    pass
