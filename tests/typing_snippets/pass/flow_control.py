"""Unique windows and debounce: key functions typed over the handler's input model."""

from __future__ import annotations

from datetime import timedelta

from snip import Image, Receipt, SendInvoice, app

from typedq import Debounce


@app.task(key=lambda inv: str(inv.invoice_id), unique_for=timedelta(hours=1))
async def charge(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(key=lambda image: image.url, unique_for=30.0)
async def thumbnail(image: Image) -> None:
    pass


@app.task(debounce=Debounce(key=lambda image: image.url, wait=2.0, max_wait=30.0))
async def rerender(image: Image) -> None:
    pass


@app.task(debounce=Debounce(key=lambda inv: inv.customer_id, wait=timedelta(seconds=1)))
async def statement(invoice: SendInvoice) -> None:
    pass


# A debounce built beforehand, typed by its annotation.
SHARED: Debounce[Image] = Debounce(key=lambda image: image.url, wait=0.5)


@app.task(debounce=SHARED)
async def shared(image: Image) -> None:
    pass
