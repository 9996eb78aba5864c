"""An app with limits, for the stub generator's note on per-key limits."""

from __future__ import annotations

from tests.stubfix.limited_models import Call
from typedq import App, ConcurrencyLimit, RateLimit

app = App("limited")


@app.task(rate_limit=RateLimit(10, per=1.0))
async def paced(call: Call) -> None:
    """Task-wide: a stub's jobs are limited exactly like the app's."""


@app.task(concurrency=ConcurrencyLimit(2, key=lambda c: c.tenant))
async def hold(call: Call) -> None:
    """Per key: a stub cannot compute the key."""
