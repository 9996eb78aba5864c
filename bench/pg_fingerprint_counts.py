"""``count_fingerprints`` on the PostgreSQL broker (issue 28 on issue 30's broker): a
queue of ``--jobs`` waiting jobs (``--tasks`` tasks, two fingerprints each, payloads of
``--payload`` bytes; ``--scheduled``: delayed) on a throwaway cluster
(tests/pg_harness.py), walked page by page after a VACUUM ANALYZE of the jobs table (as
autovacuum keeps it):

- ``count``: ``count_fingerprints`` (one statement per page: the page's keyset range,
  each stored message's task and fingerprint read in SQL, grouped);
- ``ids``: ``page_jobs``, the same pages as ids only (the walk without the counting).

``--rounds`` walks of each, interleaved: the median walk's time and its time per page.
Then the database's own time for one page in the middle of the walk (EXPLAIN ANALYZE).

Run: ``.venv/bin/python -m bench.pg_fingerprint_counts [--jobs 100000 --page 500]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import asyncpg

from tests.pg_harness import PgCluster
from typedq import JobState
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.names import new_job_ids


async def fill(
    broker: PostgresBroker, jobs: int, tasks: int, payload: int, scheduled: bool
) -> None:
    ids = new_job_ids(jobs)
    body = b"\x92" + b"x" * max(0, payload - 1)
    for start in range(0, jobs, 2000):
        await broker.enqueue(
            [
                JobMessage(
                    id=ids[i],
                    task=f"task{i % tasks}",
                    queue="q",
                    payload=body,
                    fingerprint=f"{i % 2:016x}",
                    delay=3600.0 + i % 100 if scheduled else 0.0,
                )
                for i in range(start, min(jobs, start + 2000))
            ]
        )


async def walk(
    broker: PostgresBroker, state: JobState, page: int, counting: bool
) -> tuple[float, int, int]:
    """(seconds, pages, jobs) of one walk of ``state``."""
    started = time.perf_counter()
    cursor: str | None = None
    pages = jobs = 0
    while True:
        pages += 1
        if counting:
            counted = await broker.count_fingerprints("q", state, cursor=cursor, limit=page)
            jobs += counted.jobs
            cursor = counted.cursor
        else:
            listed = await broker.page_jobs("q", state, cursor=cursor, limit=page)
            jobs += len(listed.ids)
            cursor = listed.cursor
        if cursor is None:
            return time.perf_counter() - started, pages, jobs


async def main(args: argparse.Namespace) -> None:
    cluster = PgCluster()
    cluster.start()
    try:
        broker = PostgresBroker(cluster.url, BrokerSettings(namespace="bench"))
        await broker.connect()
        try:
            began = time.perf_counter()
            await fill(broker, args.jobs, args.tasks, args.payload, args.scheduled)
            state = JobState.SCHEDULED if args.scheduled else JobState.WAITING
            print(f"filled {args.jobs} jobs in {time.perf_counter() - began:.1f} s")
            conn = await asyncpg.connect(broker.target.dsn)
            await conn.execute('VACUUM ANALYZE "typedq".jobs')
            times: dict[str, list[float]] = {"count": [], "ids": []}
            for _ in range(args.rounds):
                for name in ("count", "ids"):
                    seconds, pages, jobs = await walk(broker, state, args.page, name == "count")
                    assert jobs == args.jobs, (name, jobs)
                    times[name].append(seconds)
            for name, runs in times.items():
                med = statistics.median(runs)
                print(
                    f"{name:5s} walk median {med:6.2f} s, {pages} pages of {args.page}: "
                    f"{med / pages * 1000:5.2f} ms/page  runs {[round(r, 2) for r in runs]}"
                )
            if args.scheduled:
                await conn.close()
                return
            # One page from the middle of the walk, timed by the database itself.
            mid = await conn.fetchrow(
                'SELECT id, -priority AS a, seq AS b FROM "typedq".jobs WHERE ns = $1 '
                "AND queue = 'q' AND state = 0 ORDER BY -priority, seq, id "
                "OFFSET $2 LIMIT 1",
                "bench",
                args.jobs // 2,
            )
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) " + broker._count_sql[JobState.WAITING],
                "bench",
                "q",
                float(mid["a"]),
                int(mid["b"]),
                mid["id"],
                args.page,
                -int(mid["a"]),
            )
            for row in plan[-2 if not args.plan else 0 :]:
                print("count page:", row[0])
            await conn.close()
        finally:
            await broker.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scheduled", action="store_true", help="the jobs delayed")
    parser.add_argument("--plan", action="store_true", help="print the whole plan")
    anyio.run(main, parser.parse_args(), backend="asyncio")
