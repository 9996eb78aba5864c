"""Throughput of the embedded broker: enqueue_many N jobs, then drain them at concurrency C.

    .venv/bin/python bench/embedded.py [--jobs 100000] [--concurrency 64] [--runs 3]

Prints the median of the runs. The handler is an async no-op; the payload is a small
msgspec Struct (about 100 bytes encoded).
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import msgspec

from typedq import App, JobState


class Payload(msgspec.Struct):
    customer_id: int
    invoice_id: int
    note: str


async def one_run(jobs: int, concurrency: int) -> tuple[float, float]:
    app = App("bench", broker="memory://", retention=None)
    done = anyio.Event()
    remaining = jobs

    @app.task
    async def noop(payload: Payload) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            done.set()

    payloads = [Payload(customer_id=i, invoice_id=i, note="x" * 70) for i in range(jobs)]
    async with app:
        started = time.perf_counter()
        await noop.enqueue_many(payloads)
        enqueue_s = time.perf_counter() - started
        started = time.perf_counter()
        async with app.worker(concurrency=concurrency):
            await done.wait()
        drain_s = time.perf_counter() - started
        counts = await app.broker.counts("default")
        assert counts[JobState.COMPLETED] == min(jobs, app.settings.retention.completed_max)
    return jobs / enqueue_s, jobs / drain_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = [anyio.run(one_run, args.jobs, args.concurrency) for _ in range(args.runs)]
    enqueue = statistics.median(r[0] for r in results)
    drain = statistics.median(r[1] for r in results)
    print(
        f"embedded broker, {args.jobs} jobs, concurrency {args.concurrency}, median of {args.runs}:"
    )
    print(f"  enqueue_many: {enqueue:,.0f} jobs/s")
    print(f"  drain:        {drain:,.0f} jobs/s")


if __name__ == "__main__":
    main()
