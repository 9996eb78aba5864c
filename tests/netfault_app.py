"""The app that worker processes of the network fault tests and the soak run.

Its one task is a no-op that first records the execution in a ledger: a list
``starts`` of ``"<job id> <pid> <attempt>"`` lines on a redis-server that no fault
touches (``$TYPEDQ_TEST_LEDGER``), so :mod:`tests.history` can count how often each
job really ran, and on which process, across cut connections, SIGKILLed workers and
Redis restarts. The lease comes from ``$TYPEDQ_TEST_LEASE``; finished jobs are kept
(``$TYPEDQ_TEST_KEEP``) so every job's final record can be read back.
"""

from __future__ import annotations

import os

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App, JobContext
from typedq.broker.base import Retention

#: Enough finished jobs kept for the longest soak (the default keeps 10,000).
KEEP = int(os.environ.get("TYPEDQ_TEST_KEEP", "200000"))

app = App(
    "netfault",
    lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "5.0")),
    max_stalls=10,
    retention=Retention(completed_max=KEEP, failed_max=KEEP),
)


class Tick(msgspec.Struct, frozen=True):
    """One unit of test work: ``n`` is its index in the run, ``sleep`` its seconds of work."""

    n: int
    sleep: float = 0.0


@app.task
async def tick(job: Tick, ctx: JobContext) -> None:
    """Record this execution (job id, process, attempt), then work ``sleep`` seconds."""
    await ledger().rpush("starts", f"{ctx.job_id} {os.getpid()} {ctx.attempt}")
    if job.sleep:
        await anyio.sleep(job.sleep)
