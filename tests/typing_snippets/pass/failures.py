"""Failures: JobFailed from result(), typed domain errors, Retry/Abort/Reject in handlers."""

from __future__ import annotations

from typing import reveal_type

from snip import CardDeclined, OutOfStock, Receipt, SendInvoice, app

from typedq import Abort, FailureReason, JobCancelled, JobFailed, Reject, ResultTimeout, Retry


@app.task(retries=3, errors=(CardDeclined, OutOfStock))
async def charge(invoice: SendInvoice) -> Receipt:
    if invoice.invoice_id < 0:
        raise Abort("negative invoice id")
    if invoice.customer_id == 0:
        raise Reject(CardDeclined(code="insufficient_funds"))
    if invoice.customer_id == 1:
        raise Retry(delay=5)
    raise Retry


async def produce() -> None:
    job = await charge.enqueue(SendInvoice(customer_id=1, invoice_id=2))
    try:
        receipt = await job.result(timeout=1)
    except JobCancelled as exc:
        reveal_type(exc.record.reason)  # R: typedq.errors.FailureReason
    except JobFailed as exc:
        declined = exc.domain_error(CardDeclined)
        reveal_type(declined)  # R: snip.CardDeclined | None
        if declined is not None:
            print(declined.code)
        if (stock := exc.domain_error(OutOfStock)) is not None:
            reveal_type(stock)  # R: snip.OutOfStock
        if exc.reason is FailureReason.DOMAIN_ERROR:
            print(exc.record.domain_type, exc.job_id, exc.task)
    except ResultTimeout:
        pass
    else:
        reveal_type(receipt)  # R: snip.Receipt
