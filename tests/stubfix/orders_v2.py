"""Version 2, incompatible: ``amount`` became the required ``amount_cents``."""

from __future__ import annotations

import msgspec


class Order(msgspec.Struct, frozen=True):
    """An order, version 2 (breaking)."""

    order_id: int
    amount_cents: int
