"""The billing service's handlers (worker side).

Run a worker with ``typedq worker examples.billing.tasks:app`` (set ``TYPEDQ_BROKER``
or pass ``--broker redis://...``). Producers that cannot import this module (it pulls in
the payment SDK) enqueue through the generated ``stubs/billing.py``::

    typedq stubs examples.billing.tasks:app --out stubs/billing.py
"""

from __future__ import annotations

from typedq import App, Backoff, JobContext, Reject

from . import payments  # heavy: the reason producers use stubs
from .models import CardDeclined, Receipt, Refund, SendInvoice, Statement, StatementRequest

__all__ = ["app", "refund", "render_statement", "send_invoice"]

app = App("billing")


@app.task(queue="billing", retries=3, timeout=30, errors=(CardDeclined,))
async def send_invoice(invoice: SendInvoice) -> Receipt:
    """Charge a customer for an invoice; a declined card is a CardDeclined domain error."""
    try:
        receipt_id, total = payments.charge(invoice.customer_id, invoice.invoice_id)
    except PermissionError as exc:
        raise Reject(CardDeclined(customer_id=invoice.customer_id, decline_code=str(exc))) from exc
    return Receipt(receipt_id=receipt_id, total_cents=total)


@app.task(queue="billing", key=lambda r: f"{r.receipt_id}-{r.amount_cents}")
def refund(request: Refund) -> None:
    """Refund part of a charge (a plain def: run in a worker thread)."""
    payments.refund(request.receipt_id, request.amount_cents)


@app.task(queue="reports", retries=5, backoff=Backoff(kind="fixed", base=10.0), priority=-1)
async def render_statement(request: StatementRequest, ctx: JobContext) -> Statement:
    """Render a customer's monthly statement as a PDF."""
    await ctx.progress({"stage": "rendering"})
    url, lines = payments.render_pdf(request.customer_id, request.month)
    return Statement(url=url, lines=lines)
