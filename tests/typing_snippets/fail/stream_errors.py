"""What mypy refuses about streams: a wrong item, an emit without emits=, a context of
another model, a stream of a task that emits nothing, a stream read as another model."""

from __future__ import annotations

import msgspec
from snip import Receipt, SendInvoice, Token, app

from typedq import JobContext


class Other(msgspec.Struct):
    n: int


@app.task(emits=Token)
async def wrong_item(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    await ctx.emit(Other(n=1))  # E: arg-type "Other"; expected "Token"
    ctx.emit_sync(Other(n=1))  # E: arg-type "Other"; expected "Token"
    return Receipt(receipt_id="r", total_cents=1)


@app.task
async def no_emits(invoice: SendInvoice, ctx: JobContext) -> Receipt:
    await ctx.emit(Token(text="x"))  # E: arg-type "Token"; expected "Never"
    return Receipt(receipt_id="r", total_cents=1)


# E: arg-type "Callable[[SendInvoice, JobContext[Other]], Coroutine[Any, Any, Receipt]]"
@app.task(emits=Token)
async def other_context(invoice: SendInvoice, ctx: JobContext[Other]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task  # E: arg-type "Callable[[SendInvoice, JobContext[Token]], Coroutine[Any, Any, Receipt]]"
async def context_without_emits(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task
async def plain(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)


@app.task(emits=Token)
async def streaming(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    await ctx.emit(Token(text="x"))
    return Receipt(receipt_id="r", total_cents=1)


async def read() -> None:
    job = await plain.enqueue(SendInvoice(customer_id=1, invoice_id=2))
    job.stream()  # E: attr-defined "Job[Receipt]" has no attribute "stream"
    streamed = await streaming.enqueue(SendInvoice(customer_id=1, invoice_id=2))
    async for token in streamed.stream():
        print(token.n)  # E: attr-defined "Token" has no attribute "n"


# P: ok key= needs the mypy plugin
# E: attr-defined "SendInvoice" has no attribute "nope"
@app.task(emits=Token, key=lambda inv: inv.nope)
async def keyed(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)
