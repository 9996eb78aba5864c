"""The app the dashboard tests show (in-process, and in ``typedq dashboard`` / worker
processes for the browser test).

``charge`` fails (a RuntimeError with a traceback) until the file its input names
exists, so a test makes a job fail for good, then creates the file and retries it from
the dashboard. ``enrich`` and ``total`` chain into a flow; ``report`` completes at once.
"""

from __future__ import annotations

import anyio
import msgspec

from typedq import App, Backoff

app = App("dash", lease=5.0)


class Charge(msgspec.Struct, frozen=True):
    """One payment to take."""

    order: int
    ticket: str
    note: str | None = None
    express: bool = False


class Receipt(msgspec.Struct, frozen=True):
    """A taken payment."""

    order: int


class Report(msgspec.Struct, frozen=True):
    """A report to build."""

    n: int


@app.task(queue="billing", retries=1, backoff=Backoff(kind="fixed", base=0))
async def charge(c: Charge) -> Receipt:
    """Fails until the file ``c.ticket`` exists."""
    if not await anyio.Path(c.ticket).exists():
        raise RuntimeError(f"card declined for order {c.order}")
    return Receipt(order=c.order)


@app.task(queue="reports")
async def report(r: Report) -> Report:
    """Completes at once."""
    return Report(n=r.n + 1)


@app.task(queue="reports")
async def total(r: Report) -> Report:
    """The second step of a chain."""
    return Report(n=r.n * 10)


@app.task(queue="reports")
async def summary(rs: list[Report]) -> Report:
    """The fan-in of a fan-out of reports."""
    return Report(n=sum(r.n for r in rs))
