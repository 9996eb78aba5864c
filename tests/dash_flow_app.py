"""An app with flow control for the dashboard's flow-control sections (browser test):
a fair task, a debounced task and a unique task on queue ``tenants``."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from typedq import App, Debounce, Fair

app = App("dashflow")


class Work(msgspec.Struct, frozen=True):
    """Work for one tenant."""

    tenant: str


@app.task(queue="tenants", fair=Fair(key=lambda w: w.tenant, weights={"acme": 2}))
async def share(w: Work) -> None:
    """A fair task: tenants take turns."""


@app.task(queue="tenants", debounce=Debounce(key=lambda w: w.tenant, wait=3600.0))
async def settle(w: Work) -> None:
    """A debounced task: runs an hour after its last enqueue."""


@app.task(queue="tenants", key=lambda w: w.tenant, unique_for=timedelta(hours=1))
async def once(w: Work) -> None:
    """A unique task: one job per tenant an hour."""
