"""Bulk retry throughput on Redis: ``total`` failed jobs retried by filter
(:class:`typedq.bulk.BulkQuery`, what ``typedq jobs --state failed --retry`` runs), jobs
per second of the whole walk (page, read, filter, retry), median of ``rounds``.

Run: ``.venv/bin/python -m bench.bulk_retry [--total 20000] [--rounds 3] [--where]``.

Each round: the failed jobs are made by a worker in this process (every attempt raises
Abort), then retried by a filter on task and error type (``--where``: also a payload
field, which decodes every payload with the task's codec).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time

import anyio
import msgspec

from bench.redis_server import redis_server
from typedq import Abort, App, JobState
from typedq.bulk import BulkQuery, JobFilter


class Item(msgspec.Struct, frozen=True):
    n: int
    tenant: str


def make_app(url: str) -> App:
    app = App("bulkbench", broker=url)

    @app.task(queue="bulk", retries=0)
    async def breaks(item: Item) -> None:
        raise Abort("boom")

    return app


#: For ``typedq jobs bench.bulk_retry:app --broker URL``: the bench's app and task.
app = make_app("memory://")


async def one_round(url: str, total: int, where: bool) -> float:
    app = make_app(url)
    async with app:
        task = app.tasks["breaks"]
        for start in range(0, total, 5000):
            await task.enqueue_many(Item(i, "acme") for i in range(start, min(total, start + 5000)))
        async with app.worker(concurrency=64):
            # Polls the counts: 20,000 result waits would cost more than the drain.
            while (await app.broker.counts("bulk"))[JobState.FAILED] < total:  # noqa: ASYNC110
                await anyio.sleep(0.2)
        flt = JobFilter(task="breaks", error_type="Abort", where=("tenant=acme",) if where else ())
        query = BulkQuery(app.client, app.queues, flt, tasks=app.tasks)
        began = time.perf_counter()
        report = await query.apply("retry")
        took = time.perf_counter() - began
        assert report.done == total, report
        await app.broker.purge("bulk", list(JobState))
    return total / took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--where", action="store_true")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)  # the 20,000 failures' log lines
    with redis_server() as server:
        rates = [
            anyio.run(one_round, server.url, args.total, args.where) for _ in range(args.rounds)
        ]
    print(
        f"bulk retry of {args.total} failed jobs{' (with --where)' if args.where else ''}: "
        f"median {statistics.median(rates):,.0f} jobs/s ({', '.join(f'{r:,.0f}' for r in rates)})"
    )


if __name__ == "__main__":
    main()
