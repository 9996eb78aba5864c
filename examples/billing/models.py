"""The billing service's models: the contract shared with producers.

Models live in their own module, apart from the handlers, so that ``typedq stubs`` can
generate producer stubs that import only this module. Both msgspec Structs and Pydantic
models are used, on either side of a task.
"""

from __future__ import annotations

import msgspec
from pydantic import BaseModel, Field

__all__ = ["CardDeclined", "Refund", "Receipt", "SendInvoice", "Statement", "StatementRequest"]


class SendInvoice(msgspec.Struct, frozen=True):
    """Charge a customer for one invoice."""

    customer_id: int
    invoice_id: int


class Receipt(BaseModel):
    """What charging an invoice produced."""

    receipt_id: str
    total_cents: int


class CardDeclined(msgspec.Struct, frozen=True):
    """A domain error: permanent, travels as data, matched by type on the producer side."""

    customer_id: int
    decline_code: str


class Refund(BaseModel):
    """Refund part of a charge; deduplicated by receipt id."""

    receipt_id: str
    amount_cents: int = Field(gt=0)


class StatementRequest(msgspec.Struct, frozen=True):
    """Render a monthly statement."""

    customer_id: int
    month: str  # "2024-05"


class Statement(msgspec.Struct, frozen=True):
    """A rendered statement: where the PDF went and how many lines it has."""

    url: str
    lines: int
