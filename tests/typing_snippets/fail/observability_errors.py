"""Observers are WorkerObservers, and their hooks keep the interface's signatures."""

from __future__ import annotations

from snip import Receipt, SendInvoice, app

from typedq import Worker
from typedq.broker.base import ClaimedJob
from typedq.observe import WorkerObserver


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


class Wrong(WorkerObserver):
    # E: override Signature of "job_finished" incompatible with supertype "typedq.observe.WorkerObserver"
    def job_finished(self, job: ClaimedJob) -> None:
        pass


Worker(send_invoice).observe(object())  # E: arg-type has incompatible type "object"
