"""Dashboard render times with 1,000,000 jobs in Redis across 20 queues.

Run: ``.venv/bin/python bench/dashboard_render.py [--jobs N] [--queues Q] [--requests R]``.
Spawns its own redis-server, fills it with ``enqueue_many`` (pipelined batches, no
worker), finishes a few thousand jobs per queue (completed, failed, retried: the
overview's counts and rollups then have something to show), and times requests through
the dashboard's ASGI app in-process (template rendering included, no network):

- the overview (every queue's counts, oldest waiting age and last hour's chart): its cost
  must not grow with the number of jobs (two broker calls);
- a queue page of waiting jobs at the first, the middle and the last page (one page of
  ids, then their records), and a failed-jobs page;
- a job page.

Prints the median and the slowest of ``--requests`` requests each. The target (issue 12):
the overview within 200 ms at 1M jobs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import quote

import anyio
import httpx
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_bench import app, noop, payload, redis_server
from typedq import App
from typedq.broker.base import Completion, Failure, JobState
from typedq.dashboard import create_app

BATCH = 10_000


async def fill(queues: list[str], jobs: int) -> None:
    """``jobs`` waiting jobs, spread evenly over ``queues``, in pipelined batches."""
    per_queue = jobs // len(queues)
    started = time.perf_counter()
    for queue in queues:
        for start in range(0, per_queue, BATCH):
            messages = [
                msgspec.structs.replace(noop.message(payload(n)), queue=queue)
                for n in range(start, min(per_queue, start + BATCH))
            ]
            await app.client.enqueue_many(messages)
    print(f"filled {per_queue * len(queues):,} jobs in {time.perf_counter() - started:.1f} s")


async def finish_some(queues: list[str], n: int) -> None:
    """Claim ``n`` jobs per queue and settle them: 80% completed, 10% failed for good,
    10% failed once and back to waiting (retried)."""
    broker = app.broker
    for queue in queues:
        claimed = await broker.claim([queue], n, worker_id="bench", lease=60)
        done, failed = [], []
        for i, job in enumerate(claimed):
            if i % 10 < 8:
                done.append(Completion(job.message.id, job.token, b"\xc0"))
            else:
                retry = None if i % 10 == 8 else 0.0
                record = msgspec.msgpack.encode(
                    {
                        "reason": "error",
                        "error_type": "ValueError",
                        "message": "bench",
                        "attempt": job.attempt,
                        "retryable": retry is not None,
                    }
                )
                failed.append(
                    Failure(id=job.message.id, token=job.token, error=record, retry_delay=retry)
                )
        await broker.complete(done)
        await broker.fail(failed)


async def timed(http: httpx.AsyncClient, path: str, requests: int) -> tuple[float, float, int]:
    """Median and slowest time (ms) of ``requests`` GETs of ``path`` (after one warm-up),
    and how many jobs the page links to (a queue page shows 50)."""
    r = await http.get(path)
    assert r.status_code == 200, (path, r.status_code, r.text[:300])
    links = r.text.count('href="/jobs/')
    times = []
    for _ in range(requests):
        t = time.perf_counter()
        r = await http.get(path)
        times.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200
    return statistics.median(times), max(times), links


async def main(jobs: int, queue_count: int, requests: int) -> None:
    queues = [f"q{i:02d}" for i in range(queue_count)]
    with redis_server() as url:
        app.use_broker(url)
        async with app:
            await fill(queues, jobs)
            await finish_some(queues, 1000)
            stats = await app.broker.queue_stats(queues)
            total = sum(sum(s.counts.values()) for s in stats)
            print(f"{total:,} jobs in {len(queues)} queues")
            dash = create_app(app, queues=queues)
            transport = httpx.ASGITransport(app=dash)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as http:
                waiting = stats[0].counts[JobState.WAITING]
                middle, last = (waiting // 100) * 50, ((waiting - 1) // 50) * 50
                # Queue pages go by cursor (Broker.page_jobs): walk to the middle and
                # the last page's cursors first.
                at_middle = await cursor_at(app, queues[0], middle)
                at_last = await cursor_at(app, queues[0], last)
                ids = await app.broker.list_jobs(queues[0], JobState.FAILED, limit=1)
                pages = {
                    "overview (20 queues)": "/",
                    "queue page, waiting, first": f"/queues/{queues[0]}?state=waiting",
                    "queue page, waiting, middle": f"/queues/{queues[0]}?state=waiting&cursor={quote(at_middle)}",
                    "queue page, waiting, last": f"/queues/{queues[0]}?state=waiting&cursor={quote(at_last)}",
                    "queue page, failed": f"/queues/{queues[0]}?state=failed",
                    "queue page, waiting, filtered by task": f"/queues/{queues[0]}?state=waiting&task=noop",
                    "job page (a failed job)": f"/jobs/{ids[0]}",
                }
                print(
                    f"{'page':40} {'median ms':>10} {'max ms':>8} {'jobs':>5}  ({requests} requests)"
                )
                for name, path in pages.items():
                    median, worst, links = await timed(http, path, requests)
                    print(f"{name:40} {median:10.1f} {worst:8.1f} {links:5}")


async def cursor_at(app: App, queue: str, jobs: int) -> str:
    """The ``page_jobs`` cursor after the first ``jobs`` waiting jobs of ``queue``."""
    cursor: str | None = None
    while jobs > 0:
        page = await app.broker.page_jobs(
            queue, JobState.WAITING, cursor=cursor, limit=min(jobs, 1000)
        )
        jobs -= len(page.ids)
        if page.cursor is None:
            break
        cursor = page.cursor
    return cursor or ""


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--queues", type=int, default=20)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    anyio.run(main, args.jobs, args.queues, args.requests)
