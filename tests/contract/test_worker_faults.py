"""The worker under broker faults, on every broker: lost requests, lost replies, races.

Faults come from :class:`~tests.support.FaultyBroker` wrapping the real broker, so
the broker's own answers (fencing, ALREADY_FINISHED) decide what happens next.
"""

from __future__ import annotations

from collections import Counter

import anyio
import anyio.lowlevel
import pytest

from tests.support import TEST_DEADLINE, FaultyBroker, In, Out
from typedq import App, Backoff, JobContext, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def test_worker_survives_failing_claims(app_name: str, broker_url: str) -> None:
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            faulty.inject("claim", 3)
            async with app.worker():
                assert await (await echo.enqueue(In(1))).result(timeout=10) == Out(1)
    assert faulty.raised["claim"] == 3


@pytest.mark.parametrize("path", ["claim loop", "refill after completions"])
async def test_lost_claim_replies_orphan_no_job(app_name: str, broker_url: str, path: str) -> None:
    """A claim that took effect but whose answer was lost is re-sent with its claim id:
    the worker gets those very jobs and runs them, instead of leaving them claimed and
    unrun until their lease expires (with max_stalls=0 such a job would fail as stalled
    without ever running)."""
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty, max_stalls=0, lease=2.0)
    runs: Counter[int] = Counter()

    @app.task
    async def echo(x: In) -> Out:
        runs[x.n] += 1
        await anyio.sleep(0.01)
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            if path == "claim loop":
                jobs = await echo.enqueue_many(In(i) for i in range(40))
                faulty.inject("claim", 3, after_applying=True)
            async with app.worker(concurrency=4):
                if path != "claim loop":
                    # The worker is idle now; each completion refills its slot through
                    # complete_and_claim, and those claims lose their answers.
                    first = await echo.enqueue(In(-1))
                    await first.result(timeout=10)
                    faulty.inject("claim", 3, after_applying=True)
                    jobs = await echo.enqueue_many(In(i) for i in range(40))
                results = [await job.result(timeout=20) for job in jobs]
                states = [await job.status() for job in jobs]
            records = await app.broker.get([job.id for job in jobs])
    assert faulty.raised["claim"] == 3
    assert results == [Out(i) for i in range(40)]
    assert states == [JobState.COMPLETED] * 40
    assert all(r is not None and r.stalls == 0 for r in records)
    assert {n: c for n, c in runs.items() if n >= 0} == dict.fromkeys(range(40), 1)


@pytest.mark.parametrize("lost", ["request", "reply"])
async def test_lost_finish_is_resent_and_counted_once(
    app_name: str, broker_url: str, lost: str
) -> None:
    """A completion whose request or reply is lost is sent again; it takes effect once."""
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty)
    runs: Counter[int] = Counter()

    @app.task
    async def echo(x: In) -> Out:
        runs[x.n] += 1
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            faulty.inject("complete", 2, after_applying=lost == "reply")
            async with app.worker() as worker:
                job = await echo.enqueue(In(7))
                assert await job.result(timeout=10) == Out(7)
            assert await job.status() is JobState.COMPLETED
    assert faulty.raised["complete"] == 2
    assert runs == {7: 1}  # the handler ran once; only the write was repeated
    assert worker.stats.completed == 1
    assert worker.stats.finish_rejected == 0


async def test_lost_failure_reply_does_not_spend_a_second_retry(
    app_name: str, broker_url: str
) -> None:
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty)
    attempts: list[int] = []

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0.0, jitter=0.0))
    async def once_bad(x: In, ctx: JobContext) -> Out:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            faulty.inject("fail", 1, after_applying=True)
            async with app.worker():
                assert await (await once_bad.enqueue(In(1))).result(timeout=10) == Out(2)
    assert attempts == [1, 2]
    assert faulty.raised["fail"] == 1


async def test_failing_renewal_keeps_the_job(app_name: str, broker_url: str) -> None:
    """One failed renewal within the lease is retried at the next tick, not a lost job."""
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty, lease=1.0)
    started = anyio.Event()
    finish = anyio.Event()

    @app.task
    async def steady(x: In) -> Out:
        started.set()
        await finish.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker() as worker:
            job = await steady.enqueue(In(3))
            await started.wait()
            faulty.inject("renew", 1)
            await anyio.sleep(1.2)  # longer than the lease: renewals must have kept it
            assert faulty.raised["renew"] == 1
            assert await job.status() is JobState.ACTIVE
            finish.set()
            assert await job.result(timeout=10) == Out(3)
    assert worker.stats.lease_lost == 0
    assert worker.stats.completed == 1


async def test_competing_workers_run_each_job_once(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    runs: Counter[int] = Counter()

    @app.task
    async def tally(x: In) -> Out:
        runs[x.n] += 1
        await anyio.lowlevel.checkpoint()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await tally.enqueue_many(In(i) for i in range(300))
            async with (
                app.worker(concurrency=8) as w1,
                app.worker(concurrency=8) as w2,
                app.worker(concurrency=8) as w3,
            ):
                results = [await job.result(timeout=10) for job in jobs]
    assert results == [Out(i) for i in range(300)]
    assert runs == dict.fromkeys(range(300), 1)
    assert w1.stats.completed + w2.stats.completed + w3.stats.completed == 300
