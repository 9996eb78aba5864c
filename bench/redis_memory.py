"""Redis bytes per waiting job at 1,000,000 waiting ~100-byte jobs.

Run: ``.venv/bin/python bench/redis_memory.py [--jobs N]``. Spawns its own
redis-server, enqueues N jobs with ``enqueue_many`` (no worker), and reports
(used_memory after - before) / N, plus the per-key costs from MEMORY USAGE.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import anyio
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_bench import app, noop, payload, redis_server


async def main(jobs: int) -> None:
    with redis_server() as url:
        app.use_broker(url)
        client = aioredis.Redis.from_url(url)
        async with app:
            before = int((await client.info("memory"))["used_memory"])
            first = None
            for i in range(0, jobs, 10_000):
                batch = await noop.enqueue_many(
                    [payload(n) for n in range(i, min(jobs, i + 10_000))]
                )
                first = first or batch[0].id
            after = int((await client.info("memory"))["used_memory"])
            keys = app.broker.keys  # type: ignore[attr-defined]
            job_key = await client.memory_usage(keys.job(first))
            list_key = await client.memory_usage(keys.waiting("default", 0), samples=0)
        await client.aclose()
    print(f"{jobs:,} waiting jobs: {(after - before) / jobs:,.1f} bytes per job")
    print(f"  one job hash (MEMORY USAGE): {job_key} bytes")
    print(f"  the waiting list: {list_key / jobs if list_key else 0:,.1f} bytes per entry")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    anyio.run(main, parser.parse_args().jobs)
