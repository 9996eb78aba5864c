"""Helpers for the Redis-only test files: a broker on the session's redis-server, a raw
client beside it, and a minimal envelope."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis

from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.redis import RedisBroker

__all__ = [
    "STALL_SOCKET_TIMEOUT",
    "Item",
    "broker_at",
    "message",
    "raw_redis",
    "with_socket_timeout",
]


#: Seconds of socket timeout for the brokers of the server-stall tests (``DEBUG SLEEP``
#: past the socket timeout, so the client re-sends its scripts): 1 s, not typedq's 5 s
#: (:data:`typedq.broker.redis.SOCKET_TIMEOUT`), so each stall lasts 2 s rather than 6.
STALL_SOCKET_TIMEOUT = 1.0


def with_socket_timeout(url: str, seconds: float = STALL_SOCKET_TIMEOUT) -> str:
    """``url`` with a ``socket_timeout`` query option: redis-py options in a broker URL's
    query override typedq's client settings (documented on :class:`RedisBroker`)."""
    return f"{url}{'&' if '?' in url else '?'}socket_timeout={seconds:g}"


class Item(msgspec.Struct, frozen=True):
    n: int


def message(job_id: str, *, queue: str = "q", priority: int = 0) -> JobMessage:
    """An envelope of task ``t`` with a one-field payload."""
    return JobMessage(id=job_id, task="t", queue=queue, payload=b"\x91\x01", priority=priority)


@contextlib.asynccontextmanager
async def broker_at(
    url: str, name: str, *, deadline: float = 60.0, **settings: Any
) -> AsyncIterator[RedisBroker]:
    """A connected RedisBroker of app ``name``; the block must end within ``deadline``."""
    broker = RedisBroker(url, BrokerSettings(namespace=name, **settings))
    await broker.connect()
    try:
        with anyio.fail_after(deadline):
            yield broker
    finally:
        await broker.close()


@contextlib.asynccontextmanager
async def raw_redis(url: str, **kwargs: Any) -> AsyncIterator[aioredis.Redis]:
    """A plain redis-py client, to look at (or tamper with) what the broker wrote."""
    client = aioredis.Redis.from_url(url, **kwargs)
    try:
        yield client
    finally:
        await client.aclose()


def server_url(request: pytest.FixtureRequest, backend: str) -> str:
    """The URL of the session's redis-server (``redis``) or of its Redis Cluster
    (``cluster``, flushed first), for tests parametrized over the two; ``postgres``: the
    session's throwaway PostgreSQL cluster (tests are kept apart by their app names)."""
    if backend == "postgres":
        pg_url: str = request.getfixturevalue("pg_cluster").url
        return pg_url
    if backend == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        cluster.flushall()
        url: str = cluster.url
        return url
    redis_url: str = request.getfixturevalue("redis_url")
    return redis_url
