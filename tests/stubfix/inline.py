"""Models defined in the handler module itself: the generator must refuse."""

from __future__ import annotations

import msgspec

from typedq import App

app = App("inline")


class Ping(msgspec.Struct):
    """Defined next to the handler."""

    n: int


@app.task
async def ping(p: Ping) -> None:
    del p
