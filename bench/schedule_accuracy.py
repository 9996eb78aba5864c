"""Schedule tick accuracy on Redis: how late each tick is enqueued and started.

Run: ``.venv/bin/python -m bench.schedule_accuracy [--ticks 60] [--workers 3] [--every 1]``.

Spawns a redis-server (bench/redis_bench.py's) and ``--workers`` worker processes of
this module's app, which has one schedule ``every=--every`` seconds and a no-op handler.
Every process runs the scheduler; each tick is enqueued once. After ``--ticks`` ticks it
reads the tick jobs back and prints, over those ticks, the lateness p50/p99/max of:

- enqueue: the job's enqueue time minus its tick time (both Redis clock): the
  scheduler's own accuracy (the sleep until the tick, a TIME round trip, the fire script);
- start: the job's start time minus its tick time (Redis clock): what a handler sees.

It also checks that each tick in the window was enqueued exactly once and none is
missing (the job ids are deterministic, so a missing tick is a missing id).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterator

import anyio
import msgspec

from bench.redis_bench import ROOT, redis_server
from typedq import App, JobState
from typedq.schedule import tick_job_id

app = App("schedbench")


class Tick(msgspec.Struct, frozen=True):
    """The schedule's payload."""

    n: int = 0


@app.task
async def noop(tick: Tick) -> None:
    """Does nothing: the measurement is of the schedule, not the handler."""


EVERY = float(os.environ.get("TYPEDQ_BENCH_EVERY", "1"))
schedule = app.schedule(noop, Tick(), every=EVERY)


@contextlib.contextmanager
def workers(url: str, count: int, every: float) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TYPEDQ_BENCH_EVERY": str(every)}
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "typedq", "--log-level", "WARNING", "worker"),
                *("bench.schedule_accuracy:app", "--concurrency", "4", "--broker", url),
            ],
            env=env,
            cwd=ROOT,
        )
        for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=30)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def measure(url: str, ticks: int, count: int, every: float) -> None:
    app.use_broker(url)
    async with app:
        broker = app.broker
        with workers(url, count, every):
            # Wait until every process has reconciled, then one more tick, so the window
            # starts with all schedulers running.
            await anyio.sleep(3.0)
            start_us = await broker.broker_time_us()
            first = schedule.next_tick(start_us + round(every * 1_000_000))
            step = round(every * 1_000_000)
            window = [first + i * step for i in range(ticks)]
            # Past the last tick, plus time for its job to run.
            await broker.sleep_until_us(window[-1] + 2 * step + 1_000_000)
        records = await broker.get([tick_job_id(schedule.name, t) for t in window])
        (state,) = await broker.schedule_states()
    missing = [t for t, r in zip(window, records, strict=True) if r is None]
    done = [r for r in records if r is not None and r.state is JobState.COMPLETED]
    enqueue = [(r.enqueued_at - r.message.scheduled_for) * 1000 for r in done]
    started = [(r.started_at - r.message.scheduled_for) * 1000 for r in done]
    print(f"schedule every={every:g}s, {count} worker processes, {ticks} ticks in the window")
    print(
        f"  ticks enqueued: {len(window) - len(missing)} of {len(window)} (missing: {len(missing)})"
    )
    print(f"  broker state: fired={state.fired} skipped={state.skipped}")
    for label, values in (("enqueue", enqueue), ("start", started)):
        if values:
            print(
                f"  {label} lateness ms: p50={statistics.median(values):.2f} "
                f"p99={percentile(values, 99):.2f} max={max(values):.2f} min={min(values):.2f}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=60)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--every", type=float, default=1.0)
    args = parser.parse_args()
    with redis_server() as url:
        anyio.run(measure, url, args.ticks, args.workers, args.every)


if __name__ == "__main__":
    main()
