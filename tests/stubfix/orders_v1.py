"""Version 1 of the order model: what an outdated producer still sends."""

from __future__ import annotations

import msgspec


class Order(msgspec.Struct, frozen=True):
    """An order, version 1."""

    order_id: int
    amount: int


class Ack(msgspec.Struct, frozen=True):
    """The result of placing an order."""

    order_id: int
    note: str | None = None
