"""The execution ledger of worker-process tests: a second Redis (``TYPEDQ_TEST_LEDGER``),
which no fault touches, where handlers record each execution."""

from __future__ import annotations

import os

import redis.asyncio as aioredis

__all__ = ["ledger"]

_ledger: aioredis.Redis | None = None


def ledger() -> aioredis.Redis:
    """The ledger connection of this process (created on first use)."""
    global _ledger
    if _ledger is None:
        _ledger = aioredis.Redis.from_url(os.environ["TYPEDQ_TEST_LEDGER"])
    return _ledger
