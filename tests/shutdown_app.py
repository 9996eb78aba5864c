"""The app run by the graceful-shutdown process tests (``python -m typedq worker``)."""

from __future__ import annotations

import anyio
import msgspec

from typedq import App

app = App("shutdown", lease=2.0)


class Nap(msgspec.Struct, frozen=True):
    """Sleep this long inside the handler."""

    seconds: float


@app.task
async def nap(job: Nap) -> None:
    """An async handler that sleeps (cancellable)."""
    await anyio.sleep(job.seconds)
