"""The app run by the graceful-shutdown process tests (``python -m typedq worker``)."""

from __future__ import annotations

import os
import threading
import time

import anyio
import msgspec

from typedq import App

#: 2 s unless ``$TYPEDQ_TEST_LEASE`` says otherwise (a test waiting out leases shortens it).
app = App("shutdown", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "2.0")))


class Nap(msgspec.Struct, frozen=True):
    """Sleep this long inside the handler."""

    seconds: float


@app.task
async def nap(job: Nap) -> None:
    """An async handler that sleeps (cancellable)."""
    await anyio.sleep(job.seconds)


class Hang(msgspec.Struct, frozen=True):
    """Append a line to ``path`` (pid, start time), then block for good."""

    path: str


@app.task
def hang(job: Hang) -> None:
    """A sync handler that never returns and never checks for cancellation."""
    with open(job.path, "a") as out:
        out.write(f"{os.getpid()} {time.time()}\n")
    threading.Event().wait()
