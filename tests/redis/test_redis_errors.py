"""Redis client errors reach users as typedq errors, through the one table in
``typedq/broker/redis/errors.py`` (``ERRORS``): each row's type, and the order of rows where
redis-py's exceptions subclass each other.

The broker is connected to a real redis-server (for its address and key prefix); the
redis-py exceptions are built by hand, as the client would raise them.
"""

from __future__ import annotations

import pytest
import redis.exceptions as rexc

from tests.redis_harness import RedisProcess, flushall
from typedq import BrokerError, BrokerUnavailable, QueueFull
from typedq.broker.base import BrokerSettings
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.connection import PoolExhausted

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.mark.parametrize(
    ("exc", "expected", "words"),
    [
        # AuthenticationError is a ConnectionError: it must not read as "unreachable".
        (rexc.AuthenticationError("invalid password"), BrokerError, "refused the credentials"),
        (rexc.AuthorizationError("no"), BrokerError, "redis://USER:PASSWORD@HOST"),
        (rexc.ConnectionError("refused"), BrokerUnavailable, "is unreachable (op)"),
        (rexc.TimeoutError("slow"), BrokerUnavailable, "did not answer in time (op): slow"),
        (ConnectionResetError("reset"), BrokerUnavailable, "is unreachable (op): reset"),
        # Issue 24 defect 7: no reason is ever empty. An exception without words is named
        # by its type; a pool out of free connections says so (redis-py's cluster pool
        # raises MaxConnectionsError(), its standalone blocking pool a ConnectionError).
        (TimeoutError(), BrokerUnavailable, "did not answer in time (op): TimeoutError"),
        (rexc.ConnectionError(), BrokerUnavailable, "is unreachable (op): ConnectionError"),
        (OSError(), BrokerUnavailable, "is unreachable (op): OSError"),
        (
            rexc.MaxConnectionsError(),
            BrokerUnavailable,
            "had no free connection for op (MaxConnectionsError): every connection stayed busy",
        ),
        (
            rexc.ConnectionError("No connection available."),
            BrokerUnavailable,
            "had no free connection for op (none came free within 5 s)",
        ),
        (
            PoolExhausted("none came free within 5 s; 64 calls in flight"),
            BrokerUnavailable,
            "had no free connection for op (none came free within 5 s; 64 calls in flight)",
        ),
        (rexc.ResponseError(), BrokerError, "op failed: ResponseError"),
        # OutOfMemoryError and NoPermissionError are ResponseErrors: matched first.
        (rexc.OutOfMemoryError("OOM"), BrokerError, "at maxmemory"),
        (
            rexc.NoPermissionError("NOPERM"),
            BrokerError,
            "~typedq:{errs}:* ~tq:{errs:* and &typedq:{errs}:*",
        ),
        (rexc.ResponseError("TYPEDQ_QUEUE_FULL q 10 1 10"), QueueFull, "max_queue_length=10"),
        (rexc.ResponseError("ERR odd"), BrokerError, "op failed: ERR odd"),
    ],
)
async def test_each_redis_error_has_its_typedq_error(
    redis_server: RedisProcess, exc: Exception, expected: type[BrokerError], words: str
) -> None:
    flushall(redis_server.port)
    broker = RedisBroker(redis_server.url, BrokerSettings(namespace="errs"))
    await broker.connect()
    try:
        error = broker._error(exc, "op")
    finally:
        await broker.close()
    assert type(error) is expected
    assert words in str(error)
    assert not str(error).rstrip().endswith(":")  # a reason follows every colon
    assert f"127.0.0.1:{redis_server.port}" in str(error) or expected is QueueFull
