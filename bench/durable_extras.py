"""Durable runs on Redis, the issue 26 figures beyond throughput (typedq alone):

- **sleep accuracy**: ``--runs`` runs each ``run.sleep(1 s)``; how late each resumes after
  its due time (the due time is the log's ``SleepStarted.until``, on the Redis clock; the
  resume is the wall time a ``run.do`` block records on the replay that passes the sleep)
- **signal latency**: ``--runs`` runs wait for a signal; from ``handle.send`` to the
  ``run.do`` block after the wait (the run's next turn)
- **memory**: ``--suspended`` runs suspended in ``wait_for`` (their turn done, nothing
  queued): Redis ``used_memory`` per run

One process: a worker (``app.worker(concurrency=--concurrency)``) and the producer, on a
fresh redis-server of its own. Run: ``.venv/bin/python -m bench.durable_extras``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from datetime import timedelta

import anyio
import msgspec

from bench.redis_server import redis_server
from typedq import App, Run, Signal
from typedq.durable import SleepStarted, decode_entries


class Go(msgspec.Struct):
    n: int


class Seen(msgspec.Struct):
    at: float


go = Signal("go", Go)


def build(url: str) -> App:
    app = App("durextras", broker=url)

    @app.durable
    async def sleeper(run: Run, x: Go) -> Seen:
        await run.sleep(timedelta(seconds=1))
        return Seen(await run.do("woke", time.time))

    @app.durable
    async def waiter(run: Run, x: Go) -> Seen:
        await run.wait_for(go)
        return Seen(await run.do("got", time.time))

    return app


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main(opts: argparse.Namespace) -> None:
    with redis_server() as redis:
        app = build(redis.url)
        sleeper, waiter = app.durables["sleeper"], app.durables["waiter"]
        async with app, app.worker(concurrency=opts.concurrency):
            # Sleep accuracy.
            handles = [await sleeper.start(Go(i), run_id=f"s{i}") for i in range(opts.runs)]
            late: list[float] = []
            for h in handles:
                woke = (await h.result(timeout=60)).at
                record = await h.record()
                until = next(
                    e.until
                    for blob in record.log
                    for e in decode_entries(blob)
                    if isinstance(e, SleepStarted)
                )
                late.append(1000 * (woke - until))
            # Signal latency: every run waits first, then one signal at a time.
            handles = [await waiter.start(Go(i), run_id=f"w{i}") for i in range(opts.runs)]
            for h in handles:  # each has logged its wait (the log grew from nothing)
                await app.broker.wait_run(h.run_id, 0, 60)
            signal_ms: list[float] = []
            for h in handles:
                sent = time.time()
                await h.send(go, Go(1))
                got = (await h.result(timeout=60)).at
                signal_ms.append(1000 * (got - sent))
            # Memory of suspended runs.
            before = int(redis.info("memory")["used_memory"])
            for first in range(0, opts.suspended, 500):
                async with anyio.create_task_group() as tg:
                    for i in range(first, min(opts.suspended, first + 500)):
                        tg.start_soon(functools.partial(waiter.start, Go(i), run_id=f"m{i}"))
            last = waiter.handle(f"m{opts.suspended - 1}")
            await app.broker.wait_run(last.run_id, 0, 120)
            await anyio.sleep(1.0)  # the last turns settle
            after = int(redis.info("memory")["used_memory"])
    print(
        f"sleep(1 s) resume lateness over {opts.runs} runs: p50 {statistics.median(late):.1f} ms, "
        f"p99 {pct(late, 0.99):.1f} ms (goal p50 <= 10, p99 <= 50)"
    )
    print(
        f"signal to resumed run over {opts.runs} runs: p50 {statistics.median(signal_ms):.1f} "
        f"ms, p99 {pct(signal_ms, 0.99):.1f} ms (goal p50 <= 5)"
    )
    print(
        f"{opts.suspended:,} suspended runs: {(after - before) / opts.suspended:,.0f} bytes of "
        "Redis each (goal <= 2,048)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--suspended", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    anyio.run(main, parser.parse_args())
