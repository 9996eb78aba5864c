"""``typedq verify`` at scale (issue 28): a broker holding ``--jobs`` waiting jobs of
``--tasks`` tasks (over ``--queues`` queues), checked by ``verify`` with its default
sample; how long it takes, and the longest Redis command it caused (SLOWLOG, reset before
the check, threshold 1 ms).

Run: ``.venv/bin/python -m bench.verify_scale [--jobs 1000000 --tasks 50 --queues 10]``
(a fresh redis-server of its own; ~1-2 minutes to fill at 1,000,000 jobs).
"""

from __future__ import annotations

import argparse
import time

import anyio
import msgspec
import redis

from bench.redis_server import redis_server
from typedq import App
from typedq.verify import verify


class Order(msgspec.Struct):
    order_id: int
    customer: str


class Done(msgspec.Struct):
    ok: bool


def _slowest(port: int) -> tuple[int, int, str]:
    """(entries in the slow log, the longest one's µs, its command)."""
    client = redis.Redis(port=port)
    try:
        entries = client.slowlog_get(1000)
    finally:
        client.close()
    if not entries:
        return 0, 0, "-"
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    words = command.decode() if isinstance(command, bytes) else str(command)
    return len(entries), int(worst["duration"]), " ".join(words.split()[:3])


def build(url: str, tasks: int, queues: int) -> App:
    app = App("verifyscale", broker=url)
    for i in range(tasks):

        async def handler(order: Order) -> Done:
            return Done(ok=True)

        handler.__name__ = f"task{i}"
        app.task(name=f"task{i}", queue=f"q{i % queues}")(handler)
    return app


async def main(opts: argparse.Namespace) -> None:
    with redis_server() as redis:
        app = build(redis.url, opts.tasks, opts.queues)
        async with app:
            started = time.perf_counter()
            per_task = opts.jobs // opts.tasks
            for task in app.tasks.values():
                for first in range(0, per_task, 10_000):
                    await task.enqueue_many(
                        Order(order_id=n, customer="c")
                        for n in range(first, min(per_task, first + 10_000))
                    )
            filled = time.perf_counter() - started
            redis.command("CONFIG", "SET", "slowlog-log-slower-than", "1000")
            redis.command("SLOWLOG", "RESET")
            started = time.perf_counter()
            report = await verify(app, app.broker, sample=opts.sample)
            took = time.perf_counter() - started
        slow = _slowest(redis.port)
        memory = redis.info("memory")["used_memory_human"]
    print(
        f"{opts.jobs:,} waiting jobs of {opts.tasks} tasks in {opts.queues} queues "
        f"(filled in {filled:.1f} s, Redis {memory})"
    )
    print(
        f"verify --sample {opts.sample:,}: {took:.2f} s, read {report.scanned:,} jobs "
        f"(capped: {report.capped}), exit code {report.exit_code}; Redis commands over "
        f"1 ms during the check: {slow[0]}, the longest {slow[1] / 1000:.1f} ms ({slow[2]})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--sample", type=int, default=10_000)
    anyio.run(main, parser.parse_args())
