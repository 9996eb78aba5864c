"""The producer side: enqueue options, enqueue_many, and typed job handles."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import reveal_type

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import UNSET, Job, JobInfo, JobState, JobStatus
from typedq.task import Enqueuer


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


@app.task
async def notify(receipt: Receipt) -> None:
    pass


def invoices(n: int) -> Iterator[SendInvoice]:
    for i in range(n):
        yield SendInvoice(customer_id=i, invoice_id=i)


async def produce() -> None:
    async with app:
        job = await send_invoice.enqueue(SendInvoice(customer_id=1, invoice_id=7))
        reveal_type(job)  # R: typedq.job.Job[snip.Receipt]
        reveal_type(await job.result())  # R: snip.Receipt
        receipt: Receipt = await job.result(timeout=10)
        print(receipt.total_cents)
        reveal_type(await job.status())  # R: typedq.broker.messages.JobState
        status: JobStatus = await job.status()
        if status is JobState.COMPLETED:
            print(status.value)
        reveal_type(await job.cancel())  # R: bool
        reveal_type(await job.info())  # R: typedq.job.JobInfo
        info: JobInfo = await job.info()
        print(info.attempt, job.id, job.task, job.created)

        # Every option, by keyword; UNSET spelled out means "the task's default".
        await send_invoice.enqueue(
            SendInvoice(customer_id=1, invoice_id=8),
            delay=timedelta(minutes=5),
            eta=datetime.now(UTC) + timedelta(hours=1),
            priority=5,
            job_id="invoice-8",
            retries=2,
            timeout=None,
        )
        await send_invoice.enqueue(
            SendInvoice(customer_id=1, invoice_id=9), delay=1.5, eta=1e9, timeout=3
        )
        await send_invoice.enqueue(
            SendInvoice(customer_id=1, invoice_id=9), priority=UNSET, retries=UNSET, timeout=UNSET
        )

        # enqueue_many takes any iterable: a generator expression, a generator, a list.
        jobs = await send_invoice.enqueue_many(
            SendInvoice(customer_id=i, invoice_id=i) for i in range(10_000)
        )
        reveal_type(jobs)  # R: list[typedq.job.Job[snip.Receipt]]
        await send_invoice.enqueue_many(invoices(3), delay=2.0, priority=1)
        thumbs = await resize.enqueue_many([Image(url="a"), Image(url="b")])
        reveal_type([await j.result() for j in thumbs])  # R: list[snip.Thumb]

        # A task that returns None has a Job[None].
        done = await notify.enqueue(Receipt(receipt_id="r", total_cents=1))
        reveal_type(done)  # R: typedq.job.Job[None]
        reveal_type(await done.result())  # R: None

        # A handle on an existing job keeps the task's output type.
        again: Job[Receipt] = send_invoice.job("invoice-8")
        reveal_type(await again.result())  # R: snip.Receipt


# Helpers that only enqueue take the Enqueuer protocol: a Task (or a producer stub) fits.
async def bill(task: Enqueuer[SendInvoice, Receipt], customer_id: int) -> Receipt:
    job = await task.enqueue(SendInvoice(customer_id=customer_id, invoice_id=1), priority=1)
    reveal_type(job)  # R: typedq.job.Job[snip.Receipt]
    return await job.result()


async def use_helper() -> None:
    reveal_type(await bill(send_invoice, 1))  # R: snip.Receipt
