"""Models and an app shared by the typing snippets (imported as ``snip``).

Both libraries on both sides: a msgspec input with a Pydantic output, and the reverse.
"""

from __future__ import annotations

import msgspec
from pydantic import BaseModel

from typedq import App


class SendInvoice(msgspec.Struct):
    customer_id: int
    invoice_id: int


class Receipt(BaseModel):
    receipt_id: str
    total_cents: int


class Image(BaseModel):
    url: str


class Thumb(msgspec.Struct):
    url: str
    width: int


class Token(msgspec.Struct):
    """What a streaming task emits (the stream snippets)."""

    text: str


class CardDeclined(msgspec.Struct):
    code: str


class OutOfStock(BaseModel):
    sku: str


app = App("billing")


class Pool:
    """Stands for a resource's value (a connection pool) in the resource snippets."""

    async def fetch_total(self, invoice_id: int) -> int:
        return invoice_id * 100
