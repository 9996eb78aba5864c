"""What one job costs the event loop at worker concurrency 1 on Redis: the runner sends
its outcome and the next claim itself (one script call), waits only for that reply, and
runs the job the reply brought next. Counted (deterministically) in a drain of no-op
jobs: event-loop turns and timers per job. Timings belong to the benchmarks.

Per job: the reply's two turns (the socket becomes readable; the runner resumes), no
turn to gather batch mates a lone runner cannot have; no timer on a write the kernel
took at once, nor for the reply (the lane keeps the read deadlines of its calls with
one shared timer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import msgspec
import pytest

from typedq import App

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

JOBS = 400


class Item(msgspec.Struct):
    n: int


@contextmanager
def counting_loop() -> Iterator[dict[str, int]]:
    """Counts the running loop's turns (``_run_once``) and timers (``call_at``)."""
    loop: Any = asyncio.get_running_loop()
    counts = {"turns": 0, "timers": 0}
    run_once, call_at = loop._run_once, loop.call_at

    def counting_run_once() -> None:
        counts["turns"] += 1
        run_once()

    def counting_call_at(*args: Any, **kwargs: Any) -> Any:
        counts["timers"] += 1
        return call_at(*args, **kwargs)

    loop._run_once, loop.call_at = counting_run_once, counting_call_at
    try:
        yield counts
    finally:
        del loop._run_once, loop.call_at


async def test_a_job_at_concurrency_1_costs_its_replys_turns_and_no_timer(
    redis_url: str, app_name: str
) -> None:
    app = App(app_name, broker=redis_url)
    done = anyio.Event()
    ran = 0

    @app.task
    async def noop(item: Item) -> None:
        nonlocal ran
        ran += 1
        if ran == JOBS:
            done.set()

    with anyio.fail_after(60):
        async with app:
            await noop.enqueue_many([Item(i) for i in range(JOBS)])
            with counting_loop() as counts:
                async with app.worker(concurrency=1):
                    await done.wait()
                    measured = dict(counts)
    # Worker start and stop cost a few dozen of each, whatever the number of jobs.
    assert measured["turns"] / JOBS <= 2.3  # 3 with a turn to gather batch mates
    assert measured["timers"] / JOBS <= 0.3  # 2 with a timer on every write and read
