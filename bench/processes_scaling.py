"""How drain throughput grows with ``typedq worker --processes N`` on Redis.

Run: ``.venv/bin/python -m bench.processes_scaling [--rounds 3] [--jobs 20000]``.

The drain workload of bench/redis_bench.py (pre-filled jobs, a no-op handler, C=16 per
process) with 1 and then 2 worker processes under the supervisor, interleaved round by
round; prints each run and the medians. On a 2-core machine Redis, the producer and the
worker processes share the cores, so the ratio shows what a second process buys when
the worker's Python is the limit, not what a larger machine would reach.
"""

from __future__ import annotations

import argparse
import statistics

import anyio

from bench.redis_bench import app, drain, fresh, redis_server


async def main(rounds: int, jobs: int, counts: list[int]) -> None:
    results: dict[int, list[float]] = {n: [] for n in counts}
    with redis_server() as url:
        app.use_broker(url)
        for r in range(rounds):
            for n in counts:
                async with fresh(url):
                    rate, _cost = await drain(url, jobs, 16, n)
                results[n].append(rate)
                print(f"round {r + 1}: --processes {n}: {rate:,.0f} jobs/s", flush=True)
    base = statistics.median(results[counts[0]])
    for n in counts:
        median = statistics.median(results[n])
        print(f"--processes {n}: median {median:,.0f} jobs/s ({median / base:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", default="1,2", help="comma-separated counts")
    args = parser.parse_args()
    anyio.run(main, args.rounds, args.jobs, [int(n) for n in args.processes.split(",")])
