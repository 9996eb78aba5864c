"""The app that worker processes of the schedule fault tests run (``python -m typedq worker``).

One schedule, ``every=$TYPEDQ_TEST_EVERY`` seconds (default 1), with a grace of 60 s (a
tick late on a loaded machine still counts as on time: the tests count ticks, not policies). The handler records each
execution in the ledger (``$TYPEDQ_TEST_LEDGER``): per tick how often it ran, how often
as a first attempt, and the tick's lateness (enqueue time minus tick time, both on the
Redis clock). ``$TYPEDQ_TEST_SKEW`` seconds are added to this process's ``time.time()``
(a worker whose clock is wrong): ticks come from Redis ``TIME``, so it must not matter.
"""

from __future__ import annotations

import os
import time

import msgspec

from tests.ledger import ledger
from typedq import App, JobContext

_skew = float(os.environ.get("TYPEDQ_TEST_SKEW", "0"))
if _skew:
    _real_time = time.time

    def _skewed_time() -> float:
        return _real_time() + _skew

    time.time = _skewed_time

app = App("rsched", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "1.0")), max_stalls=10)


class Tick(msgspec.Struct, frozen=True):
    """The schedule's payload."""

    what: str = "tick"


@app.task
async def tick(job: Tick, ctx: JobContext) -> None:
    """Count the execution per tick; record the first attempt's lateness and the process that ran it."""
    assert ctx.scheduled_for is not None
    key = f"{ctx.scheduled_for:.6f}"
    await ledger().hincrby("runs", key, 1)
    if ctx.attempt == 1:
        await ledger().hincrby("first_runs", key, 1)
        await ledger().hset("lateness", key, f"{ctx.enqueued_at - ctx.scheduled_for:.6f}")
        await ledger().hset("ran_by", key, str(os.getpid()))


schedule = app.schedule(
    tick, Tick(), every=float(os.environ.get("TYPEDQ_TEST_EVERY", "1")), grace=60
)
