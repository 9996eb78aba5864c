"""Redis bytes per waiting job at 1,000,000 waiting ~100-byte jobs.

Run: ``.venv/bin/python bench/redis_memory.py [--jobs N] [--priority P] [--delay S]``.
Spawns its own redis-server (default config: ``hash-max-listpack-value 64`` and
friends untouched), enqueues N jobs with ``enqueue_many`` (no worker), and reports
(used_memory after - before) / N, plus what one job key costs (MEMORY USAGE, type,
encoding, value length) and the waiting list's cost per entry (or the scheduled
zset's with ``--delay``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio
import msgspec
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_bench import app, noop, payload, redis_server


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def main(jobs: int, priority: int, delay: float) -> None:
    with redis_server() as url:
        app.use_broker(url)
        client = aioredis.Redis.from_url(url)
        async with app:
            before = int((await client.info("memory"))["used_memory"])
            first = None
            for i in range(0, jobs, 10_000):
                batch = await noop.enqueue_many(
                    [payload(n) for n in range(i, min(jobs, i + 10_000))],
                    priority=priority,
                    delay=delay,
                )
                first = first or batch[0].id
            after = int((await client.info("memory"))["used_memory"])
            assert first is not None
            keys = app.broker.keys  # type: ignore[attr-defined]
            job_key = keys.job("default", first)
            size = await client.memory_usage(job_key)
            kind = text(await client.type(job_key))
            encoding = text(await client.object("encoding", job_key))
            value = await client.strlen(job_key) if kind == "string" else None
            if delay:
                index, index_key = "the scheduled zset", keys.scheduled("default")
            else:
                index, index_key = "the waiting list", keys.waiting("default", priority)
            index_size = await client.memory_usage(index_key, samples=0)
        await client.aclose()
    print(f"{jobs:,} waiting jobs: {(after - before) / jobs:,.1f} bytes per job")
    print(f"  payload {len(msgspec.msgpack.encode(payload(0)))} bytes (msgpack)")
    detail = f"{kind}, {encoding}" + (f", value {value} bytes" if value is not None else "")
    print(f"  one job key (MEMORY USAGE): {size} bytes ({detail})")
    print(f"  {index}: {index_size / jobs if index_size else 0:,.1f} bytes per entry")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--priority", type=int, default=0, help="priority of every job")
    parser.add_argument("--delay", type=float, default=0.0, help="schedule every job S s out")
    args = parser.parse_args()
    anyio.run(main, args.jobs, args.priority, args.delay)
