"""Version 2, compatible: a new optional field, so version 1 payloads still validate."""

from __future__ import annotations

import msgspec


class Order(msgspec.Struct, frozen=True):
    """An order, version 2 (compatible)."""

    order_id: int
    amount: int
    note: str | None = None
