"""Job streams on Redis (``@app.task(emits=...)``, docs/streams.md): how many small items
per second one job can emit, and how long an item takes from ``ctx.emit`` to the reader.

Run: ``.venv/bin/python -m bench.streams [--items 50000] [--rate 10000] [--seconds 3]
[--postgres]``.

One process, one event loop: a worker (concurrency 2) runs the emitting job and the
reader iterates ``job.stream()`` beside it, on a throwaway redis-server
(bench/redis_server.py), or with ``--postgres`` on a throwaway PostgreSQL cluster
(tests/pg_harness.py). Two runs:

- **flood**: the handler emits ``items`` tokens in a tight loop; items/s is items over
  the time from the enqueue to the job's result (every batch stored, the job settled),
  with no reader; then the same with a reader following, whose rate is what it read over
  the time until it has read everything (and how many it missed, past the cap);
- **paced**: the handler emits ``rate`` tokens per second for ``seconds`` (a burst every
  millisecond), each carrying its ``perf_counter`` time; the reader takes the difference
  on receipt: p50 / p99 emit-to-read latency.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import msgspec

from bench.redis_server import redis_server
from typedq import App, JobContext, StreamTruncated


class Token(msgspec.Struct, array_like=True):
    text: str
    at: float = 0.0


class Run(msgspec.Struct):
    items: int
    rate: int = 0


class Done(msgspec.Struct):
    seconds: float


app = App("bench-streams")


@app.task(emits=Token, timeout=None)
async def generate(run: Run, ctx: JobContext[Token]) -> Done:
    start = time.perf_counter()
    if run.rate == 0:
        for _ in range(run.items):
            await ctx.emit(Token("tok"))
    else:
        per_ms = max(1, run.rate // 1000)
        sent = 0
        while sent < run.items:
            for _ in range(per_ms):
                await ctx.emit(Token("tok", time.perf_counter()))
            sent += per_ms
            await anyio.sleep(0.001)
    return Done(time.perf_counter() - start)


async def flood(items: int) -> None:
    # Stored: from the enqueue to the job's result, so the last batch's store (after
    # the handler returned) and the settle are counted; no reader.
    start = time.perf_counter()
    job = await generate.enqueue(Run(items))
    await job.result(timeout=60)
    stored = time.perf_counter() - start
    # Read: the same again with a reader following it.
    job = await generate.enqueue(Run(items))
    start = time.perf_counter()
    n = missed = 0
    stream = job.stream()
    while True:
        try:
            async for _ in stream:
                n += 1
            break
        except StreamTruncated as exc:  # the reader fell more than the cap behind
            missed += exc.missed
    read = time.perf_counter() - start
    await job.result(timeout=60)
    print(
        f"flood: {items} items emitted and stored in {stored:.2f} s (enqueue to result) = "
        f"{items / stored:,.0f} items/s; a reader following read {n} (missed {missed}) "
        f"in {read:.2f} s = {n / read:,.0f} items/s"
    )


async def paced(rate: int, seconds: float) -> None:
    items = int(rate * seconds)
    job = await generate.enqueue(Run(items, rate))
    lags: list[float] = []
    async for token in job.stream():
        lags.append(time.perf_counter() - token.at)
    await job.result(timeout=60)
    lags.sort()
    p50 = statistics.median(lags) * 1000
    p99 = lags[int(len(lags) * 0.99)] * 1000
    print(f"paced: {len(lags)} items at {rate}/s: emit-to-read p50 {p50:.2f} ms, p99 {p99:.2f} ms")


async def run(url: str, items: int, rate: int, seconds: float) -> None:
    app.use_broker(url)
    async with app, app.worker(concurrency=2):
        await flood(items)
        await paced(rate, seconds)


async def main(items: int, rate: int, seconds: float, postgres: bool) -> None:
    if postgres:
        from tests.pg_harness import PgCluster

        pg = PgCluster()
        pg.start()
        try:
            await run(pg.url, items, rate, seconds)
        finally:
            pg.stop()
        return
    with redis_server() as server:
        await run(server.url, items, rate, seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--postgres", action="store_true", help="a PostgreSQL broker")
    args = parser.parse_args()
    anyio.run(main, args.items, args.rate, args.seconds, args.postgres)
