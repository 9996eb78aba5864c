"""Workflows: chains, fan-out, fan-in and the collecting fan-in, typed end to end."""

from __future__ import annotations

from typing import reveal_type

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import Chain, Failed, FanOut, Flow, Job, Ok


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
async def thumbnail(receipt: Receipt) -> Image:
    return Image(url=receipt.receipt_id)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


@app.task
async def make_album(thumbs: list[Thumb]) -> Receipt:
    return Receipt(receipt_id=",".join(t.url for t in thumbs), total_cents=len(thumbs))


@app.task
async def report(outcomes: list[Ok[Thumb] | Failed]) -> Receipt:
    good = [o.value for o in outcomes if isinstance(o, Ok)]
    bad = [o.error.reason for o in outcomes if isinstance(o, Failed)]
    return Receipt(receipt_id=str(bad), total_cents=len(good))


async def chains() -> None:
    flow = send_invoice.then(thumbnail).then(resize)
    reveal_type(flow)  # R: typedq.workflow.Chain[snip.SendInvoice, snip.Thumb]
    job = await flow.enqueue(SendInvoice(customer_id=1, invoice_id=2), job_id="inv-2")
    reveal_type(job)  # R: typedq.job.Job[snip.Thumb]
    thumb: Thumb = await job.result()
    print(thumb.width)
    chain: Chain[SendInvoice, Image] = send_invoice.then(thumbnail)
    print(chain)


async def fan_out_and_in(images: list[Image]) -> None:
    fan = resize.map(images)
    reveal_type(fan)  # R: typedq.workflow.FanOut[snip.Thumb]
    job = await fan.enqueue()
    reveal_type(job)  # R: typedq.job.Job[list[snip.Thumb]]
    thumbs: list[Thumb] = await job.result()
    print(thumbs)
    album = resize.map(Image(url=str(i)) for i in range(3)).then(make_album)
    reveal_type(album)  # R: typedq.workflow.Flow[snip.Receipt]
    more: Flow[Image] = album.then(thumbnail)
    receipt_job: Job[Image] = await more.enqueue()
    print(receipt_job)
    collected = resize.map(images).collect(report)
    reveal_type(collected)  # R: typedq.workflow.Flow[snip.Receipt]
    fans: FanOut[Thumb] = resize.map([])
    print(fans)
    direct = await make_album.enqueue([Thumb(url="u", width=1)])
    reveal_type(direct)  # R: typedq.job.Job[snip.Receipt]
