"""@app.task on every handler shape: async or sync, with or without a JobContext, bare or
with options, msgspec and Pydantic on either side, and ``-> None``."""

from __future__ import annotations

from typing import reveal_type

from snip import CardDeclined, Image, Receipt, SendInvoice, Thumb, app

from typedq import App, Backoff, JobContext, Task


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
async def resize(image: Image, ctx: JobContext) -> Thumb:
    await ctx.progress({"done": 0.5})
    return Thumb(url=image.url, width=ctx.attempt)


@app.task
def resize_sync(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


@app.task
def archive(invoice: SendInvoice, ctx: JobContext) -> None:
    ctx.report_progress(ctx.job_id)
    ctx.check_cancelled()


@app.task
async def notify(receipt: Receipt) -> None:
    pass


@app.task(retries=3, timeout=30)
async def send_invoice_retried(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task()
def parens_no_options(thumb: Thumb) -> Image:
    return Image(url=thumb.url)


@app.task(
    name="charge",
    queue="payments",
    retries=5,
    backoff=Backoff(),
    timeout=2.5,
    priority=10,
    errors=(CardDeclined,),
)
async def charge(invoice: SendInvoice, ctx: JobContext) -> Receipt:
    return Receipt(receipt_id=ctx.job_id, total_cents=invoice.invoice_id)


@app.task(queue="thumbs")
def resize_sync_ctx(image: Image, ctx: JobContext) -> Thumb:
    return Thumb(url=image.url, width=ctx.attempt)


async def make_thumb(image: Image) -> Thumb:
    return Thumb(url=image.url, width=1)


# Applied without decorator syntax, bare and with options.
other = App("other")
made_bare = other.task(make_thumb)
made_with_options = other.task(name="thumb2", retries=1)(make_thumb)

reveal_type(send_invoice)  # R: typedq.task.Task[snip.SendInvoice, snip.Receipt]
reveal_type(resize)  # R: typedq.task.Task[snip.Image, snip.Thumb]
reveal_type(resize_sync)  # R: typedq.task.Task[snip.Image, snip.Thumb]
reveal_type(archive)  # R: typedq.task.Task[snip.SendInvoice, None]
reveal_type(notify)  # R: typedq.task.Task[snip.Receipt, None]
reveal_type(send_invoice_retried)  # R: typedq.task.Task[snip.SendInvoice, snip.Receipt]
reveal_type(parens_no_options)  # R: typedq.task.Task[snip.Thumb, snip.Image]
reveal_type(charge)  # R: typedq.task.Task[snip.SendInvoice, snip.Receipt]
reveal_type(resize_sync_ctx)  # R: typedq.task.Task[snip.Image, snip.Thumb]
reveal_type(made_bare)  # R: typedq.task.Task[snip.Image, snip.Thumb]
reveal_type(made_with_options)  # R: typedq.task.Task[snip.Image, snip.Thumb]
reveal_type(app.task(retries=1))  # R: typedq.task.TaskDecorator

# The explicit annotation users write in their own signatures.
typed: Task[SendInvoice, Receipt] = send_invoice
registry: dict[str, Task[SendInvoice, Receipt]] = {"a": send_invoice, "b": charge}


async def unit_test() -> None:
    # Calling the task runs the handler directly, async or sync, context optional.
    reveal_type(await send_invoice(SendInvoice(customer_id=1, invoice_id=2)))  # R: snip.Receipt
    reveal_type(await resize_sync(Image(url="u")))  # R: snip.Thumb
    reveal_type(await archive(SendInvoice(customer_id=1, invoice_id=2)))  # R: None
