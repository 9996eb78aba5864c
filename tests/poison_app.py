"""The app run by the poison-pill process test: one payload kills its worker process."""

from __future__ import annotations

import os

import msgspec

from typedq import App

app = App("poison", lease=1.0, max_stalls=2)


class Pill(msgspec.Struct, frozen=True):
    """``lethal`` pills kill the process that runs them, like a segfaulting C extension."""

    n: int
    lethal: bool = False


@app.task
async def swallow(pill: Pill) -> None:
    """Exit the whole process, without cleanup, for a lethal pill."""
    if pill.lethal:
        os._exit(137)
