"""The web tier's billing calls: typed enqueues through the generated stubs.

Run a billing worker and then this producer against the same Redis::

    typedq worker examples.billing.tasks:app --broker redis://localhost:6379/0 &
    python -m examples.webapp --broker redis://localhost:6379/0

It prints one JSON line per call. mypy checks every enqueue here exactly as it would
with the real tasks: ``send_invoice.enqueue(Refund(...))`` or a ``Statement`` used as a
``Receipt`` are type errors, although this module cannot import the handlers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import TypeVar

import anyio

from stubs.billing import (
    CardDeclined,
    Receipt,
    Refund,
    SendInvoice,
    Statement,
    StatementRequest,
    app,
    refund,
    render_statement,
    send_invoice,
)
from typedq import Enqueuer, JobFailed

__all__ = ["call", "checkout", "main", "refund_receipt", "statement"]

In = TypeVar("In", bound=SendInvoice | Refund | StatementRequest)
Out = TypeVar("Out", bound=Receipt | Statement | None)


async def call(task: Enqueuer[In, Out], payload: In, *, timeout: float = 30.0) -> Out:
    """Enqueue one job and wait for its typed result (a stub or the real task alike)."""
    job = await task.enqueue(payload)
    return await job.result(timeout=timeout)


async def checkout(customer_id: int, invoice_id: int) -> dict[str, object]:
    """Charge an invoice; a declined card comes back as data, not as an exception."""
    try:
        receipt = await call(send_invoice, SendInvoice(customer_id, invoice_id))
    except JobFailed as exc:
        declined = exc.domain_error(CardDeclined)
        if declined is None:
            raise
        return {"invoice": invoice_id, "declined": declined.decline_code}
    return {"invoice": invoice_id, "receipt": receipt.receipt_id, "cents": receipt.total_cents}


async def refund_receipt(receipt_id: str, amount_cents: int) -> dict[str, object]:
    """Refund part of a charge, idempotently: the same refund twice is one job."""
    job_id = f"refund.{receipt_id}.{amount_cents}"
    first = await refund.enqueue(
        Refund(receipt_id=receipt_id, amount_cents=amount_cents), job_id=job_id
    )
    again = await refund.enqueue(
        Refund(receipt_id=receipt_id, amount_cents=amount_cents), job_id=job_id
    )
    await first.result(timeout=30)
    return {"refund": receipt_id, "job": first.id, "deduplicated": not again.created}


async def statement(customer_id: int, month: str) -> dict[str, object]:
    """Render a monthly statement on the reports queue."""
    result = await call(render_statement, StatementRequest(customer_id, month))
    return {"statement": result.url, "lines": result.lines}


async def _demo(broker: str | None) -> list[dict[str, object]]:
    if broker:
        app.use_broker(broker)
    async with app:
        return [
            await checkout(1, 7),
            await checkout(13, 8),
            await refund_receipt("R-1-7", 500),
            await statement(1, "2024-05"),
        ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo calls and print one JSON line each."""
    parser = argparse.ArgumentParser(prog="python -m examples.webapp")
    parser.add_argument("--broker", default=None, help="broker URL (default: $TYPEDQ_BROKER)")
    args = parser.parse_args(argv)
    for line in anyio.run(_demo, args.broker):
        print(json.dumps(line, sort_keys=True))
    return 0
