"""@app.task(emits=Token): the handler emits Tokens, job.stream() yields them."""

from __future__ import annotations

from typing import reveal_type

from snip import Receipt, SendInvoice, Token, app

from typedq import Job, JobContext, StreamRestarted
from typedq.job import StreamJob


@app.task(emits=Token)
async def write(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    await ctx.emit(Token(text="hello"))
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=1)


@app.task(emits=Token, retries=2)
def write_sync(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    ctx.emit_sync(Token(text="hello"))
    return Receipt(receipt_id="r", total_cents=1)


@app.task(emits=Token)
async def quiet(invoice: SendInvoice) -> Receipt:  # may emit nothing at all
    return Receipt(receipt_id="r", total_cents=1)


def receipt_of(job: Job[Receipt]) -> str:  # a stream job is a Job
    return job.id


async def read() -> None:
    reveal_type(write)  # R: typedq.task.StreamTask[snip.SendInvoice, snip.Receipt, snip.Token]
    reveal_type(write_sync)  # R: typedq.task.StreamTask[snip.SendInvoice, snip.Receipt, snip.Token]
    job = await write.enqueue(SendInvoice(customer_id=1, invoice_id=2))
    reveal_type(job)  # R: typedq.job.StreamJob[snip.Receipt, snip.Token]
    receipt_of(job)
    try:
        async for token in job.stream():
            reveal_type(token)  # R: snip.Token
            print(token.text)
    except StreamRestarted as exc:
        print(exc.attempt)
    again: StreamJob[Receipt, Token] = write.job(job.id)
    many = await write.enqueue_many([])
    reveal_type(many[0])  # R: typedq.job.StreamJob[snip.Receipt, snip.Token]
    print(again, await quiet.enqueue(SendInvoice(customer_id=1, invoice_id=2)))


@app.task(emits=Token, key=lambda inv: f"{inv.invoice_id}")  # the plugin checks the key here too
async def keyed(invoice: SendInvoice, ctx: JobContext[Token]) -> Receipt:
    return Receipt(receipt_id="r", total_cents=1)
