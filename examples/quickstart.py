"""typedq quickstart: typed tasks on the embedded broker, end to end.

Run it with ``make demo`` (or ``python examples/quickstart.py``). It needs no server;
set ``TYPEDQ_BROKER=redis://localhost:6379/0`` to run the same code on Redis.

What it shows, in order:
1. a msgspec input and a Pydantic output, enqueued and awaited with full typing;
2. a bulk enqueue of 10,000 jobs;
3. a flaky task that fails twice and succeeds on its third attempt (retries + backoff);
4. a declared domain error that reaches the producer as typed data;
5. a running job cancelled from the producer side.
"""

from __future__ import annotations

import time

import anyio
import msgspec
from pydantic import BaseModel

from typedq import App, Backoff, JobCancelled, JobContext, JobFailed, Reject

# -- models: msgspec Structs and Pydantic models, on either side --------------------------


class SendInvoice(msgspec.Struct):
    customer_id: int
    invoice_id: int


class Receipt(BaseModel):
    receipt_id: str
    total_cents: int


class CardDeclined(msgspec.Struct):
    """A domain error: permanent, travels as data, matched by type on the producer side."""

    customer_id: int
    decline_code: str


class Report(msgspec.Struct):
    rows: int


# -- tasks ---------------------------------------------------------------------------------

app = App("billing")


@app.task(retries=3, timeout=30, errors=(CardDeclined,))
async def send_invoice(invoice: SendInvoice) -> Receipt:
    """Charge a customer; customers with id 13 have a card that is declined."""
    if invoice.customer_id == 13:
        raise Reject(CardDeclined(customer_id=13, decline_code="insufficient_funds"))
    return Receipt(receipt_id=f"R-{invoice.invoice_id}", total_cents=1000 + invoice.invoice_id)


@app.task(retries=3, backoff=Backoff(kind="exponential", base=0.05, jitter=0.0))
async def flaky_sync(invoice: SendInvoice, ctx: JobContext) -> Receipt:
    """Fails on its first two attempts (think: a payment API returning 503)."""
    if ctx.attempt < 3:
        raise ConnectionError(f"payment API unavailable (attempt {ctx.attempt})")
    return Receipt(receipt_id=f"R-{invoice.invoice_id}", total_cents=0)


@app.task
def build_report(invoice: SendInvoice, ctx: JobContext) -> Report:
    """A plain `def` handler: runs in a worker thread, never blocking the event loop.

    Threads cannot be interrupted, so a long sync handler checks for cancellation
    between steps.
    """
    for step in range(100):
        time.sleep(0.1)  # one step of a long, blocking computation
        ctx.check_cancelled()
        ctx.report_progress({"step": step})
    return Report(rows=invoice.invoice_id)


@app.task(queue="bulk")
async def archive(invoice: SendInvoice) -> None:
    """A no-op used for the bulk enqueue."""


# -- the producer side ---------------------------------------------------------------------


async def main() -> None:
    async with app, app.worker(concurrency=64):
        print("1. enqueue a typed job and await its typed result")
        job = await send_invoice.enqueue(SendInvoice(customer_id=1, invoice_id=7))
        receipt = await job.result(timeout=10)  # mypy knows: Receipt
        print(f"   job {job.id} -> {receipt!r}")

        print("2. bulk enqueue 10,000 jobs")
        started = time.perf_counter()
        jobs = await archive.enqueue_many(
            SendInvoice(customer_id=i, invoice_id=i) for i in range(10_000)
        )
        enqueued = time.perf_counter() - started
        for bulk_job in jobs:
            await bulk_job.result(timeout=60)
        total = time.perf_counter() - started
        print(f"   enqueued in {enqueued:.2f}s, all 10,000 done in {total:.2f}s")

        print("3. a flaky task, retried with exponential backoff")
        flaky = await flaky_sync.enqueue(SendInvoice(customer_id=2, invoice_id=8))
        await flaky.result(timeout=10)
        info = await flaky.info()
        print(f"   succeeded on attempt {info.attempt}")

        print("4. a declared domain error reaches the producer as typed data")
        declined = await send_invoice.enqueue(SendInvoice(customer_id=13, invoice_id=9))
        try:
            await declined.result(timeout=10)
        except JobFailed as failure:
            card = failure.domain_error(CardDeclined)  # mypy knows: CardDeclined | None
            print(f"   failed with reason={failure.reason.value}: {card!r}")
            print(
                f"   record: error_type={failure.record.error_type} "
                f"attempt={failure.record.attempt} retryable={failure.record.retryable}"
            )

        print("5. cancel a running job")
        report = await build_report.enqueue(SendInvoice(customer_id=3, invoice_id=10))
        # A producer in another process can only ask the broker, so the demo does too.
        while await report.status() != "active":  # noqa: ASYNC110
            await anyio.sleep(0.01)
        await report.cancel()
        try:
            await report.result(timeout=15)
        except JobCancelled as cancelled:
            print(f"   {cancelled.record.message} -> status {(await report.status()).value}")
    print("done: the worker shut down gracefully")


if __name__ == "__main__":
    anyio.run(main)
