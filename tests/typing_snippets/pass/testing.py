"""A user's own test: typedq.testing's harness, the fake clock, and the job context."""

from __future__ import annotations

from typing import reveal_type

from snip import Receipt, SendInvoice, app

from typedq import JobContext, JobState, Retry
from typedq.testing import FakeClock, Harness, run_worker


@app.task(retries=3)
async def flaky(invoice: SendInvoice, ctx: JobContext) -> Receipt:
    reveal_type(ctx.attempt)  # R: int
    reveal_type(ctx.enqueued_at)  # R: float
    if ctx.attempt < 3:
        raise Retry(delay=60)
    return Receipt(receipt_id=ctx.job_id, total_cents=invoice.invoice_id)


async def test_flaky_is_retried() -> None:
    clock = FakeClock(start=0)
    async with run_worker(app, clock=clock, concurrency=1) as harness:
        reveal_type(harness)  # R: typedq.testing.Harness
        job = await flaky.enqueue(SendInvoice(customer_id=1, invoice_id=2))
        for _ in range(2):
            await harness.idle()
            await harness.advance(60)
        reveal_type(await job.result(timeout=5))  # R: snip.Receipt
        counts = await harness.counts()
        reveal_type(counts)  # R: dict[typedq.broker.messages.JobState, int]
        assert counts[JobState.COMPLETED] == 1
    clock.advance(1.5)
    reveal_type(clock())  # R: float


def helper(harness: Harness) -> None:
    print(harness)
