"""A producer stub module of ``tests.verify_app``'s old release (``typedq verify
--against``): it declares ``place`` with ``OrderV1``."""

from __future__ import annotations

from tests.verify_app import NAME, OrderV1, Placed
from typedq import Producer

app = Producer(NAME)

place = app.task("place", OrderV1, Placed, queue="orders")
