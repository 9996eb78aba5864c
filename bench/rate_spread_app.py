"""The app of bench/rate_spread.py's worker processes: one task under RateLimit(50, per=1)
whose handler pushes the time it starts (this host's clock) to a Redis list."""

from __future__ import annotations

import os
import time

import msgspec
import redis.asyncio as aioredis

from typedq import App, RateLimit

app = App("rate-spread")
_ledger: aioredis.Redis | None = None


class Tick(msgspec.Struct, frozen=True):
    n: int


@app.task(rate_limit=RateLimit(50, per=1.0))
async def paced(tick: Tick) -> None:
    """Record the handler's start."""
    global _ledger
    if _ledger is None:
        _ledger = aioredis.Redis.from_url(os.environ["RATE_SPREAD_LEDGER"])
    await _ledger.rpush("entered", repr(time.time()))
