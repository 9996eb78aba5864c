"""The app of the ``typedq jobs`` process tests (``python -m typedq worker|jobs
tests.bulk_app:app``).

Its handler records every run in the ledger (``$TYPEDQ_TEST_LEDGER``): the first run of
every order fails (``CardDeclined``), a run after a retry completes, except orders whose
``n`` is a multiple of 10, which always fail (``OutOfStock``).
"""

from __future__ import annotations

import msgspec

from tests.ledger import ledger
from typedq import App, JobContext

app = App("bulkapp")


class Address(msgspec.Struct, frozen=True):
    city: str


class Order(msgspec.Struct, frozen=True):
    n: int
    tenant: str
    address: Address | None = None


class CardDeclined(Exception):
    """The first run of an order."""


class OutOfStock(Exception):
    """Every run of an order whose n is a multiple of 10."""


@app.task(queue="orders", retries=0)
async def charge(order: Order, ctx: JobContext) -> None:
    """Count the run; fail as the module's docstring says."""
    runs = await ledger().hincrby("runs", ctx.job_id, 1)
    if order.n % 10 == 0:
        raise OutOfStock(f"order {order.n}")
    if runs == 1:
        raise CardDeclined(f"card of order {order.n}")
