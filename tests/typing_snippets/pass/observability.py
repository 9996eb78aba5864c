"""Metrics.attach and Worker.observe keep the worker's type; observers are typed."""

from __future__ import annotations

from typing import reveal_type

from prometheus_client import CollectorRegistry
from snip import Receipt, SendInvoice, app

from typedq import Worker
from typedq.broker.base import ClaimedJob
from typedq.metrics import Metrics
from typedq.observe import JobOutcome, WorkerObserver


@app.task
async def send_invoice(invoice: SendInvoice) -> Receipt:
    return Receipt(receipt_id=str(invoice.invoice_id), total_cents=100)


class Durations(WorkerObserver):
    def __init__(self) -> None:
        self.seconds: list[float] = []

    def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
        if outcome is JobOutcome.COMPLETED:
            self.seconds.append(duration)


metrics = Metrics(CollectorRegistry())
# R: typedq.worker.Worker[snip.SendInvoice, snip.Receipt]
reveal_type(metrics.attach(Worker(send_invoice)))
# R: typedq.worker.Worker[snip.SendInvoice, snip.Receipt]
reveal_type(Worker(send_invoice).observe(Durations()))
