"""Redis bytes per waiting job at 1,000,000 waiting ~100-byte jobs.

Run: ``.venv/bin/python bench/redis_memory.py [--jobs N] [--priority P] [--delay S]``.
Spawns its own redis-server (default config: ``hash-max-listpack-value 64`` and
friends untouched), enqueues N jobs with ``enqueue_many`` (no worker), and reports
(used_memory after - before) / N, plus where it goes: a waiting job is an entry of
its level list and an id in the queue's waiting index (small hashes, listpacks), so
it reports the list's cost per entry and the index's (MEMORY USAGE of every bucket,
their count and encodings); with ``--delay`` a scheduled job is a job string: one job
key's cost (MEMORY USAGE, type, encoding, value length) and the scheduled zset's.
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
            lines = []
            if delay:
                job_key = keys.job("default", first)
                size = await client.memory_usage(job_key)
                kind = text(await client.type(job_key))
                encoding = text(await client.object("encoding", job_key))
                value = await client.strlen(job_key) if kind == "string" else None
                detail = f"{kind}, {encoding}" + (f", value {value} bytes" if value else "")
                lines.append(f"  one job key (MEMORY USAGE): {size} bytes ({detail})")
                index, index_key = "the scheduled zset", keys.scheduled("default")
            else:
                index, index_key = "the waiting list", keys.waiting("default", priority)
                buckets, encodings = 0, {}
                pattern = keys.index("default", first).rsplit(":", 1)[0] + ":*"
                async for key in client.scan_iter(pattern, count=1000):
                    buckets += await client.memory_usage(key, samples=0) or 0
                    kind = text(await client.object("encoding", key))
                    encodings[kind] = encodings.get(kind, 0) + 1
                shape = ", ".join(f"{n:,} {kind}" for kind, n in sorted(encodings.items()))
                lines.append(
                    f"  the waiting index: {buckets / jobs:,.1f} bytes per job ({shape} buckets)"
                )
            index_size = await client.memory_usage(index_key, samples=0)
        await client.aclose()
    print(
        f"{jobs:,} {'scheduled' if delay else 'waiting'} jobs: {(after - before) / jobs:,.1f} bytes per job"
    )
    print(f"  payload {len(msgspec.msgpack.encode(payload(0)))} bytes (msgpack)")
    print(f"  {index}: {index_size / jobs if index_size else 0:,.1f} bytes per entry")
    for line in lines:
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--priority", type=int, default=0, help="priority of every job")
    parser.add_argument("--delay", type=float, default=0.0, help="schedule every job S s out")
    args = parser.parse_args()
    anyio.run(main, args.jobs, args.priority, args.delay)
