"""The app that worker processes of the workflow fault tests run (``python -m typedq worker``).

Every handler records its execution in the ledger (``$TYPEDQ_TEST_LEDGER``, see
tests/ledger.py): ``runs`` counts executions per job id and ``started`` lists
``<job id> <pid>``, so a test counts from outside how often each step, member and
callback really ran, across SIGKILLed workers.
"""

from __future__ import annotations

import os

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App, JobContext

app = App("flowfault", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "1.0")), max_stalls=10)


class Work(msgspec.Struct, frozen=True):
    """A value carried along a flow; every handler sleeps ``sleep`` seconds."""

    n: int
    sleep: float = 0.0


async def _record(ctx: JobContext, sleep: float) -> None:
    await ledger().hincrby("runs", ctx.job_id, 1)
    await ledger().rpush("started", f"{ctx.job_id} {os.getpid()}")
    if sleep:
        await anyio.sleep(sleep)


@app.task
async def step(work: Work, ctx: JobContext) -> Work:
    """A chain link: ``n + 1``."""
    await _record(ctx, work.sleep)
    return Work(n=work.n + 1, sleep=work.sleep)


@app.task
async def square(work: Work, ctx: JobContext) -> Work:
    """A fan-out member: ``n * n``."""
    await _record(ctx, work.sleep)
    return Work(n=work.n * work.n, sleep=work.sleep)


@app.task
async def gather(works: list[Work], ctx: JobContext) -> Work:
    """A fan-in callback: the sum, and how many members it got."""
    await _record(ctx, 0.0)
    await ledger().hincrby("callbacks", ctx.job_id, 1)
    return Work(n=sum(w.n for w in works) * 1000 + len(works))
