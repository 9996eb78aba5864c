"""Stands in for the heavy dependencies of the billing handlers.

In a real service this is a payment provider's SDK, a PDF renderer and a database
driver: slow to import, with their own pins, often not installable in the web tier.
The handlers import it; producers never do (tests check that importing the stubs and
the web app leaves this module unimported).
"""

from __future__ import annotations

import hashlib

__all__ = ["charge", "refund", "render_pdf"]


def charge(customer_id: int, invoice_id: int) -> tuple[str, int]:
    """Charge a customer; returns (receipt id, amount in cents). Customer 13's card declines."""
    if customer_id == 13:
        raise PermissionError("insufficient_funds")
    return f"R-{customer_id}-{invoice_id}", 1000 + invoice_id


def refund(receipt_id: str, amount_cents: int) -> None:
    """Refund part of a charge."""
    if amount_cents <= 0:
        raise ValueError("refunds are positive")


def render_pdf(customer_id: int, month: str) -> tuple[str, int]:
    """Render a statement; returns (storage URL, number of lines)."""
    digest = hashlib.sha256(f"{customer_id}/{month}".encode()).hexdigest()[:12]
    return f"s3://statements/{month}/{customer_id}-{digest}.pdf", 10 + customer_id % 7
