"""Redis time per call of each typedq script in the end-to-end workload (bench/redis_bench.py).

Run: ``.venv/bin/python -m bench.script_cost [--concurrency 1,16] [--jobs 20000]``.

``INFO commandstats`` sums every script under one command (FCALL, or EVALSHA before the
function library), so this runs the end-to-end workload with Redis's slow log keeping
every command (``slowlog-log-slower-than 0``) and sums the logged durations per script: a
FCALL names its function (``typedq_<hash>_<script>``), an EVALSHA its SHA1 (mapped to the
script by the typedq being run, for comparisons with older commits). The durations are
the ones ``INFO commandstats`` adds up (the same clock around each command); the slow
log itself costs Redis some CPU, so take CPU per job from redis_bench.py, not here.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
import redis.asyncio as aioredis

from bench import redis_bench
from bench.redis_bench import end_to_end, fresh, redis_server

_LOG_LEN = 2_000_000


def _script_names() -> dict[str, str]:
    """SHA1 -> script name for a typedq that runs scripts by EVALSHA (none otherwise)."""
    try:
        from typedq.broker.redis import scripts
    except ImportError:
        return {}
    table: Any = getattr(scripts, "SCRIPTS", {})
    return {sha: name for name, (_, sha) in table.items()}


def _name(args: list[bytes], shas: dict[str, str]) -> str:
    command = args[0].decode().upper()
    if command == "FCALL" and len(args) > 1:
        return args[1].decode().split("_", 2)[-1]
    if command == "EVALSHA" and len(args) > 1:
        return shas.get(args[1].decode(), "?")
    return command


async def per_script(url: str, concurrency: int, jobs: int) -> dict[str, tuple[int, float]]:
    """Script (or other command) -> (calls, µs per call) over one end-to-end run."""
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_set("slowlog-max-len", _LOG_LEN)
        async with fresh(url):
            await client.config_set("slowlog-log-slower-than", -1)
            await client.slowlog_reset()
            # Only the run itself: end_to_end resets the stats when the worker is up.
            await client.config_set("slowlog-log-slower-than", 0)
            await end_to_end(url, jobs, concurrency)
            await client.config_set("slowlog-log-slower-than", -1)
        execute: Any = client.execute_command  # untyped in redis-py
        entries = await execute("SLOWLOG", "GET", -1)
    finally:
        await client.aclose()
    shas = _script_names()
    total: dict[str, list[float]] = {}
    for entry in entries:
        # [id, timestamp, µs, args, client address, client name] (redis-py parses it).
        duration, args = (
            (entry["duration"], entry["command"].split(b" "))
            if isinstance(entry, dict)
            else (entry[2], entry[3])
        )
        key = _name(list(args), shas)
        t = total.setdefault(key, [0, 0.0])
        t[0] += 1
        t[1] += duration
    return {k: (int(c), us / c) for k, (c, us) in total.items()}


async def main(concurrency: list[int], jobs: int) -> None:
    with redis_server() as url:
        redis_bench.app.use_broker(url)
        for c in concurrency:
            stats = await per_script(url, c, jobs)
            # 'get' is the benchmark reading the jobs back once they are done.
            scripts = {k: v for k, v in stats.items() if k.islower() and k != "get"}
            line = ", ".join(f"{k} {n} x {us:.2f} µs" for k, (n, us) in sorted(scripts.items()))
            per_1k = sum(n * us for n, us in scripts.values()) / jobs
            print(f"C={c:<3} {line}; scripts {per_1k:.1f} ms/1k jobs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    args = parser.parse_args()
    anyio.run(main, [int(c) for c in args.concurrency.split(",")], args.jobs)
