"""What mypy rejects at the producer."""

from __future__ import annotations

from snip import Image, Receipt, SendInvoice, Thumb, app

from typedq import Job
from typedq.task import Enqueuer


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


@app.task
def resize(image: Image) -> Thumb:
    return Thumb(url=image.url, width=64)


INVOICE = SendInvoice(customer_id=1, invoice_id=7)
RECEIPT = Receipt(receipt_id="r", total_cents=1)


async def wrong_payloads() -> None:
    await send_invoice.enqueue(RECEIPT)  # E: arg-type "Receipt"; expected "SendInvoice"
    await send_invoice.enqueue()  # E: call-arg Missing positional argument "payload"
    await send_invoice.enqueue({"customer_id": 1, "invoice_id": 7})  # E: arg-type "dict[str, int]"
    await send_invoice.enqueue(None)  # E: arg-type "None"; expected "SendInvoice"
    await send_invoice.enqueue(INVOICE, INVOICE)  # E: call-arg Too many positional
    await send_invoice.enqueue_many([RECEIPT])  # E: list-item "Receipt"; expected "SendInvoice"
    await send_invoice.enqueue_many(r for r in [RECEIPT])  # E: misc "Receipt"
    await send_invoice.enqueue_many(INVOICE)  # E: arg-type expected "Iterable[SendInvoice]"
    await send_invoice(RECEIPT)  # E: arg-type expected "SendInvoice"


async def wrong_options() -> None:
    await send_invoice.enqueue(INVOICE, retries="3")  # E: arg-type "retries" to "enqueue"
    await send_invoice.enqueue(INVOICE, priority="high")  # E: arg-type "priority" to "enqueue"
    await send_invoice.enqueue(INVOICE, delay="5m")  # E: arg-type "delay" to "enqueue"
    await send_invoice.enqueue(INVOICE, timeout="30")  # E: arg-type "timeout" to "enqueue"
    await send_invoice.enqueue(INVOICE, job_id=7)  # E: arg-type "job_id" to "enqueue"
    # E: call-arg Unexpected keyword argument "queue" for "enqueue"
    await send_invoice.enqueue(INVOICE, queue="other")
    await send_invoice.enqueue(INVOICE, retry=3)  # E: call-arg Unexpected keyword argument "retry"
    # E: call-arg Unexpected keyword argument "job_id" for "enqueue_many"
    await send_invoice.enqueue_many([INVOICE], job_id="x")


async def wrong_results() -> None:
    job = await send_invoice.enqueue(INVOICE)
    thumb: Thumb = await job.result()  # E: assignment "Receipt", variable has type "Thumb"
    # E: assignment "Coroutine[Any, Any, Receipt]", variable has type "Receipt"
    # N: Maybe you forgot to use "await"?
    not_awaited: Receipt = job.result()
    wrong_job: Job[Thumb] = job  # E: assignment "Job[Receipt]", variable has type "Job[Thumb]"
    other = await resize.enqueue(Image(url="u"))
    print((await other.result()).receipt_id)  # E: attr-defined "Thumb" has no attribute
    jobs: list[Job[Thumb]] = await send_invoice.enqueue_many([INVOICE])  # E: assignment
    print(thumb, not_awaited, wrong_job, jobs)


async def bill(task: Enqueuer[SendInvoice, Receipt]) -> None:
    await task.enqueue(RECEIPT)  # E: arg-type "Receipt"; expected "SendInvoice"


async def wrong_helper() -> None:
    # E: arg-type "Task[Image, Thumb]"; expected "Enqueuer[SendInvoice, Receipt]"
    await bill(resize)
