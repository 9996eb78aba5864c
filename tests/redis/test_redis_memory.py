"""Redis memory per waiting job, pinned (issue 13: at most 250 bytes at 1,000,000).

A waiting job is an entry of its level list plus its id in the queue's waiting index
(see typedq/broker/redis/keys.py). This enqueues 100,000 jobs like the benchmark's (~110-byte
msgpack payload, ULID ids) into a fresh redis-server of the default config and holds
``used_memory`` per job to the figure measured for this layout, within a small
tolerance: a change of layout that costs memory fails here, not in a benchmark nobody
ran. (bench/redis_memory.py measures the same at 1,000,000: 239 bytes.)
"""

from __future__ import annotations

import msgspec
import pytest

from tests.redis_harness import redis_process
from tests.redis_support import broker_at, raw_redis
from typedq.broker.base import JobMessage
from typedq.names import new_job_id

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

JOBS = 100_000
#: used_memory per waiting job at 100,000 jobs (Redis 7.0, jemalloc): the level list's
#: entry ~192 bytes, the index ~42 (8,192 buckets amortised over 100k jobs; ~33 at 1M).
PINNED = 242
TOLERANCE = 6


def bench_job(i: int) -> JobMessage:
    """bench/redis_bench.py's job: its payload (110 bytes of msgpack) and task."""
    payload = msgspec.msgpack.encode(
        {
            "user_id": i,
            "email": f"user{i:07d}@example.com",
            "tags": ["alpha", "beta", "gamma"],
            "note": "x" * 40,
        }
    )
    return JobMessage(
        id=new_job_id(),
        task="noop",
        queue="default",
        payload=payload,
        fingerprint="fb1c496797e98824",
    )


async def test_a_waiting_job_costs_the_pinned_bytes_at_100k_jobs() -> None:
    with redis_process() as server:
        async with (
            broker_at(server.url, "mem", deadline=120) as broker,
            raw_redis(server.url) as raw,
        ):
            jobs = [bench_job(i) for i in range(JOBS)]
            await broker.enqueue([jobs[0]])  # the queue's own keys, made once
            before = int((await raw.info("memory"))["used_memory"])
            batches = [jobs[i : i + 5000] for i in range(1, JOBS, 5000)]
            for outcome in await broker.enqueue_batches(batches):
                assert isinstance(outcome, list)
                assert all(o.created for o in outcome)
            after = int((await raw.info("memory"))["used_memory"])
            per_job = (after - before) / (JOBS - 1)
            k = broker.keys
            # The layout measured: no key per job, every index bucket a listpack.
            assert await raw.type(k.job("default", jobs[-1].id)) == b"none"
            assert await raw.llen(k.waiting("default", 0)) == JOBS
            encodings = {
                await raw.object("encoding", key)
                async for key in raw.scan_iter(
                    k.index("default", "x").rsplit(":", 1)[0] + ":*", count=1000
                )
            }
            assert encodings == {b"listpack"}
            (record,) = await broker.get([jobs[JOBS // 2].id], queue="default")
            assert record is not None
            assert record.message == jobs[JOBS // 2]
    assert PINNED - TOLERANCE <= per_job <= PINNED + TOLERANCE, f"{per_job:.1f} bytes per job"
