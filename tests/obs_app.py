"""The app the observability tests run in worker processes (``python -m typedq worker``).

Three tasks with known outcomes: ``ok`` completes, ``flaky`` fails its first attempt
and completes its second (one retry), ``broken`` fails both of its attempts (one
retry, then failed for good). Retries wait no time, so a run settles quickly.
"""

from __future__ import annotations

import msgspec

from typedq import App, Backoff, JobContext

app = App("obs", lease=2.0)


class Item(msgspec.Struct, frozen=True):
    """One job's input."""

    n: int


@app.task(queue="fast")
async def ok(item: Item) -> Item:
    """Completes at once."""
    return item


@app.task(queue="fast", retries=1, backoff=Backoff(kind="fixed", base=0))
async def flaky(item: Item, ctx: JobContext) -> Item:
    """Fails its first attempt, completes its second."""
    if ctx.attempt == 1:
        raise RuntimeError(f"flaky {item.n}: first attempt fails")
    return item


@app.task(queue="slow", retries=1, backoff=Backoff(kind="fixed", base=0))
async def broken(item: Item) -> Item:
    """Always fails: one retry, then failed for good."""
    raise ValueError(f"broken {item.n}")
