"""The app that worker processes of the Redis fault tests run (``python -m typedq worker``).

The handler records every execution in a ledger on a separate Redis database
(``$TYPEDQ_TEST_LEDGER``), so a test can count how often each job really ran, even
across SIGKILLed workers. The lease comes from ``$TYPEDQ_TEST_LEASE`` (short, so a
killed worker's jobs come back within a second or two).
"""

from __future__ import annotations

import os

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App, JobContext

app = App("rfault", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "1.0")), max_stalls=10)


class Work(msgspec.Struct, frozen=True):
    """One unit of test work: ``sleep`` seconds inside the handler."""

    n: int
    sleep: float = 0.0


@app.task
async def work(job: Work, ctx: JobContext) -> None:
    """Count the execution (per job id), mark it started, sleep, count the finish."""
    await ledger().hincrby("runs", ctx.job_id, 1)
    await ledger().rpush("started", f"{ctx.job_id} {os.getpid()}")
    if job.sleep:
        await anyio.sleep(job.sleep)
    await ledger().hincrby("ends", ctx.job_id, 1)
