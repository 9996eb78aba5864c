"""RELIABILITY B6: Redis at maxmemory refuses whole batches with a clear error, never half."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import msgspec
import pytest
import redis

from tests.redis_harness import RedisProcess
from typedq import App, BrokerError, JobState

pytestmark = [pytest.mark.redis, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the Redis client is asyncio-based


@pytest.fixture
def small_redis() -> Iterator[RedisProcess]:
    """Its own server: the test fills it to maxmemory."""
    server = RedisProcess()
    server.start()
    yield server
    server.stop()


class Blob(msgspec.Struct):
    data: str


async def test_enqueue_at_maxmemory_is_refused_whole_and_clearly(
    small_redis: RedisProcess,
) -> None:
    admin = redis.Redis(port=small_redis.port)
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 2_000_000)
    app = App("oom", broker=small_redis.url)

    @app.task
    async def keep(blob: Blob) -> None:
        return None

    accepted: list[str] = []
    refused: list[str] = []
    error: BrokerError | None = None
    with anyio.fail_after(60):
        async with app:
            for batch in range(200):
                messages = [keep.message(Blob(data="x" * 2_000)) for _ in range(50)]
                try:
                    outcomes = await app.client.enqueue_many(messages)
                except BrokerError as exc:
                    error = exc
                    refused.extend(m.id for m in messages)
                    if batch > 0 and len(refused) >= 150:
                        break
                else:
                    accepted.extend(o.id for o in outcomes)
            assert error is not None, "Redis never reached maxmemory"
            assert "maxmemory" in str(error)
            assert accepted, "nothing fit before maxmemory"
            # All or nothing per batch: every accepted job is whole, no refused one exists.
            records = await app.broker.get(accepted + refused)
            assert all(r is not None for r in records[: len(accepted)])
            assert all(r is None for r in records[len(accepted) :])
            counts = await app.broker.counts("default")
            assert counts[JobState.WAITING] == len(accepted)
    admin.close()
