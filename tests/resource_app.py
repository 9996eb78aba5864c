"""Apps whose resources cannot open, for tests/process/test_resources.py's CLI tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import msgspec

from typedq import App

app = App("resource-app")


class Ping(msgspec.Struct):
    n: int


async def connect(dsn: str) -> str:
    raise ConnectionRefusedError(f"warehouse database at {dsn} refused the connection")


@app.resource
async def warehouse() -> AsyncIterator[str]:
    yield await connect("db.invalid:5432")


@app.task
async def ping(payload: Ping) -> None:
    pass


hanging_app = App("resource-hang")


@hanging_app.resource
async def slow_db() -> AsyncIterator[str]:
    await anyio.sleep_forever()  # a database that never answers
    yield "never"


@hanging_app.task
async def pong(payload: Ping) -> None:
    pass
