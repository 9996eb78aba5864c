"""The app the worker processes of tests/process/test_limits_processes.py run.

Handlers record what they do in the execution ledger (``$TYPEDQ_TEST_LEDGER``), so the
test sees every run across processes, including ones that were SIGKILLed.
"""

from __future__ import annotations

import os
import time

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App, ConcurrencyLimit, JobContext, RateLimit

app = App("limits", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "1.0")), max_stalls=10)


class Tick(msgspec.Struct, frozen=True):
    n: int


class Hold(msgspec.Struct, frozen=True):
    customer: str
    n: int
    #: Seconds to sleep on the first run only (a run a SIGKILL interrupts).
    hang: float = 0.0


@app.task(rate_limit=RateLimit(50, per=1.0))
async def paced(tick: Tick) -> None:
    """A no-op: its start times (recorded by the broker) are what the test checks."""


@app.task(rate_limit=RateLimit(50, per=1.0))
async def spread(tick: Tick) -> None:
    """Record when the handler starts (this host's clock, at handler entry): a rate limit
    must hold there, not only where the claim counts starts (issue 24 defect 2): the
    tick's number and the time, '<n> <seconds>'."""
    await ledger().rpush("entered:spread", f"{tick.n} {time.time()!r}")


@app.task(concurrency=ConcurrencyLimit(1, key=lambda m: m.customer))
async def hold(job: Hold, ctx: JobContext) -> None:
    """Record how many run at once per customer (the peak must never pass the limit)."""
    runs = await ledger().hincrby("runs", ctx.job_id, 1)
    # A set of running job ids, not a counter: a run a SIGKILL ends never leaves it, but
    # the same job running again does not count twice.
    await ledger().sadd(f"running:{job.customer}", ctx.job_id)
    await ledger().rpush(f"peaks:{job.customer}", await ledger().scard(f"running:{job.customer}"))
    await ledger().rpush("started:hold", ctx.job_id)
    try:
        await anyio.sleep(job.hang if runs == 1 else 0.02)
    finally:
        await ledger().srem(f"running:{job.customer}", ctx.job_id)
