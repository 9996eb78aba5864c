"""Broker contract: finished jobs are kept within count and age bounds, oldest out first."""

from __future__ import annotations

import anyio
import pytest

from tests.support import TEST_DEADLINE, In, Out, connected, count, msg
from typedq import App, JobNotFound, JobState, Retention
from typedq.broker.base import Broker, ClaimedJob, Completion, Failure

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def run_all(broker: Broker, ids: list[str], *, fail: bool = False, step: int = 5) -> None:
    """Claim and finish the jobs ``ids`` (FIFO), a few per call like a worker would."""
    for start in range(0, len(ids), step):
        claimed: list[ClaimedJob] = await broker.claim(["q"], step, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == ids[start : start + step]
        if fail:
            await broker.fail([Failure(id=c.message.id, token=c.token, error=b"") for c in claimed])
        else:
            await broker.complete([Completion(c.message.id, c.token, b"") for c in claimed])


async def test_completed_max_keeps_the_newest(app_name: str, broker_url: str) -> None:
    retention = Retention(completed_max=10)
    async with connected(app_name, broker_url, retention=retention) as broker:
        messages = [msg() for _ in range(50)]
        ids = [m.id for m in messages]
        await broker.enqueue(messages)
        await run_all(broker, ids)
        counts = await broker.counts("q")
        assert 0 < count(counts, JobState.COMPLETED) <= 10
        records = await broker.get(ids)
        kept = [r.message.id for r in records if r is not None]
        assert len(kept) == count(counts, JobState.COMPLETED)
        assert kept == ids[-len(kept) :]  # the oldest went first
        assert records[:40] == [None] * 40


async def test_failed_max_keeps_the_newest(app_name: str, broker_url: str) -> None:
    retention = Retention(failed_max=5)
    async with connected(app_name, broker_url, retention=retention) as broker:
        messages = [msg() for _ in range(30)]
        ids = [m.id for m in messages]
        await broker.enqueue(messages)
        await run_all(broker, ids, fail=True)
        counts = await broker.counts("q")
        assert 0 < count(counts, JobState.FAILED) <= 5
        records = await broker.get(ids)
        kept = [r.message.id for r in records if r is not None]
        assert kept == ids[-len(kept) :]
        assert all(r.state is JobState.FAILED for r in records if r is not None)


async def test_bounds_are_per_final_state(app_name: str, broker_url: str) -> None:
    retention = Retention(completed_max=3, failed_max=100)
    async with connected(app_name, broker_url, retention=retention) as broker:
        failed = [msg() for _ in range(4)]
        await broker.enqueue(failed)
        await run_all(broker, [m.id for m in failed], fail=True, step=4)
        done = [msg() for _ in range(20)]
        await broker.enqueue(done)
        await run_all(broker, [m.id for m in done])
        counts = await broker.counts("q")
        assert count(counts, JobState.FAILED) == 4  # not pushed out by completions
        assert count(counts, JobState.COMPLETED) <= 3
        # Jobs not yet finished are never removed by retention.
        pending = [msg() for _ in range(15)]
        await broker.enqueue(pending)
        assert None not in await broker.get([m.id for m in pending])


async def test_completed_ttl_expires_jobs(app_name: str, broker_url: str) -> None:
    retention = Retention(completed_ttl=0.2, failed_ttl=0.2)
    async with connected(app_name, broker_url, retention=retention) as broker:
        done = [msg() for _ in range(5)]
        bad = [msg() for _ in range(3)]
        await broker.enqueue(done + bad)
        await run_all(broker, [m.id for m in done])
        await run_all(broker, [m.id for m in bad], fail=True, step=3)
        assert None not in await broker.get([m.id for m in done + bad])  # fresh: kept
        await anyio.sleep(0.35)
        await broker.recover_stalled()  # the reaper's pass also applies retention
        assert await broker.get([m.id for m in done + bad]) == [None] * 8
        counts = await broker.counts("q")
        assert count(counts, JobState.COMPLETED) == 0
        assert count(counts, JobState.FAILED) == 0


async def test_removed_job_is_not_found(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url, retention=Retention(completed_max=2))

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = [await work.enqueue(In(i)) for i in range(6)]
            async with app.worker(concurrency=1):
                assert await jobs[-1].result(timeout=10) == Out(5)
            for old in jobs[:3]:
                with pytest.raises(JobNotFound):
                    await old.status()
                with pytest.raises(JobNotFound):
                    await old.result(timeout=1)
            assert await jobs[-1].status() is JobState.COMPLETED
            assert count(await app.broker.counts("default"), JobState.COMPLETED) <= 2


async def test_trimmed_jobs_are_counted_per_queue_and_state(app_name: str, broker_url: str) -> None:
    retention = Retention(completed_max=10, failed_max=3)
    async with connected(app_name, broker_url, retention=retention) as broker:
        done = [msg() for _ in range(50)]
        await broker.enqueue(done)
        await run_all(broker, [m.id for m in done])
        failed = [msg() for _ in range(5)]
        await broker.enqueue(failed)
        await run_all(broker, [m.id for m in failed], fail=True)
        (stats,) = await broker.queue_stats(["q"])
        assert count(stats.counts, JobState.COMPLETED) == 10
        assert stats.trimmed == {JobState.COMPLETED: 40, JobState.FAILED: 2}
        (other,) = await broker.queue_stats(["elsewhere"])
        assert other.trimmed == {}


async def test_a_trimmed_jobs_result_says_retention_deleted_it(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, retention=Retention(completed_max=2))

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app:
        jobs = await echo.enqueue_many([In(i) for i in range(5)])
        async with app.worker(concurrency=1):
            assert await jobs[-1].result(timeout=TEST_DEADLINE) == Out(4)
        assert await jobs[-2].result(timeout=5) == Out(3)
        with pytest.raises(JobNotFound) as info:
            await jobs[0].result(timeout=5)
        message = str(info.value)
        assert f"job {jobs[0].id} of task 'echo' is not in the broker" in message
        assert "most likely trimmed by result retention, which has deleted 3 completed" in message
        assert "keeping at most 2 completed" in message
