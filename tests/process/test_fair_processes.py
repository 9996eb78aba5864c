"""Fair shares (typedq.fair) across real worker processes on Redis: one tenant flooding
the queue does not hold back another tenant's job.

Asserted on the start times Redis recorded (its own clock), not on wall-clock durations.
"""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pytest

from tests.fair_app import Work, app, work
from tests.support import spawn_worker, stop_workers

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow, pytest.mark.asyncio_only]

FLOOD = 5_000
WORKERS, CONCURRENCY = 2, 8


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    """conftest's ``redis_url``, and after the test the module's app back on the embedded
    broker (the test points it at Redis)."""
    yield redis_url
    app.use_broker("memory://")


async def test_a_flooding_tenant_does_not_hold_back_another_tenants_job(url: str) -> None:
    workers = [spawn_worker("tests.fair_app:app", url, concurrency=CONCURRENCY)]
    workers.append(spawn_worker("tests.fair_app:app", url, concurrency=CONCURRENCY))
    try:
        app.use_broker(url)
        async with app:
            with anyio.fail_after(120):
                flood = await work.enqueue_many(Work("flood", i) for i in range(FLOOD))
                # The workers are draining the flood when the other tenant's job comes.
                await flood[200].result(timeout=60)
                other = await work.enqueue(Work("other", 0))
                await other.result(timeout=60)
                mine = (await app.broker.get([other.id]))[0]
                for job in flood:
                    await job.result(timeout=60)
            records = await app.broker.get([j.id for j in flood])
    finally:
        stop_workers(workers)
    assert mine is not None
    started = [r.started_at for r in records if r is not None]
    assert len(started) == FLOOD
    # Flood jobs started after the other tenant's job was enqueued and before it started:
    # the ones already claimed (at most a claim's worth per worker slot) and about one
    # turn of the flood per claim; FIFO would have run the whole remaining flood first.
    ahead = sum(mine.enqueued_at <= t < mine.started_at for t in started)
    behind = sum(t > mine.started_at for t in started)
    assert ahead <= 2 * WORKERS * CONCURRENCY, ahead
    assert behind >= FLOOD // 2, behind
