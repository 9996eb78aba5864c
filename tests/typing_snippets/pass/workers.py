"""Worker[TIn, TOut] is inferred from the task it runs; app.worker() runs them all."""

from __future__ import annotations

from typing import Any, reveal_type

import anyio
from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import Worker


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


reveal_type(Worker(send_invoice))  # R: typedq.worker.Worker[snip.SendInvoice, snip.Receipt]
# R: typedq.worker.Worker[snip.Image, snip.Thumb]
reveal_type(Worker(resize, concurrency=8, grace=1.0))
reveal_type(app.worker(concurrency=8))  # R: typedq.worker.Worker[Any, Any]

typed: Worker[SendInvoice, Receipt] = Worker(send_invoice)
everything: Worker[Any, Any] = app.worker(queues=["default"], grace=5)


async def run() -> None:
    async with app, Worker(send_invoice, concurrency=8) as worker:
        reveal_type(worker)  # R: typedq.worker.Worker[snip.SendInvoice, snip.Receipt]
    async with app.worker(concurrency=8):
        pass
    async with anyio.create_task_group() as tg:
        await tg.start(typed.run)
        typed.stop()
    await everything.run()
