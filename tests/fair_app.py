"""The app the worker processes of tests/process/test_fair_processes.py run."""

from __future__ import annotations

import anyio
import msgspec

from typedq import App, Fair

app = App("fair")


class Work(msgspec.Struct, frozen=True):
    tenant: str
    n: int


@app.task(fair=Fair(key=lambda w: w.tenant))
async def work(w: Work) -> None:
    """A short job: its start time (recorded by the broker) is what the test checks."""
    await anyio.sleep(0.002)
