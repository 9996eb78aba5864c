"""Prefetch on every broker: a worker holds up to ``concurrency + prefetch`` jobs (claimed
ahead, or finished and being recorded while the next runs), never runs more than
``concurrency`` handlers at once, and hands prefetched jobs back when it stops."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from tests.support import TEST_DEADLINE, HeldTask, In, Out
from typedq import App, ConfigError, JobContext, JobState, Worker

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def until_count(app: App, state: JobState, n: int) -> dict[JobState, int]:
    """The queue's counts once ``n`` of its jobs are in ``state`` (polled: the broker's
    side of a worker's claim has no event to wait on)."""
    while True:
        counts = await app.broker.counts("default")
        if counts.get(state, 0) == n:
            return counts
        await anyio.sleep(0.005)


async def test_prefetch_holds_the_extra_jobs_but_runs_concurrency_handlers(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    running = 0
    peak_running = 0
    peak_active = 0
    ran: list[int] = []

    @app.task
    async def short(x: In) -> Out:
        nonlocal running, peak_running, peak_active
        running += 1
        peak_running = max(peak_running, running)
        # What the broker holds as claimed for this worker: never more than its slots.
        active = (await app.broker.counts("default")).get(JobState.ACTIVE, 0)
        peak_active = max(peak_active, active)
        await anyio.lowlevel.checkpoint()
        ran.append(x.n)
        running -= 1
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await short.enqueue_many(In(i) for i in range(60))
            async with app.worker(concurrency=2, prefetch=3) as worker:
                results = [await job.result(timeout=10) for job in jobs]
    assert results == [Out(i) for i in range(60)]
    assert sorted(ran) == list(range(60))  # each ran once
    assert peak_running == 2
    # Claimed ahead: with 60 jobs waiting, the worker held more than it ran.
    assert 3 <= peak_active <= 5
    assert worker.stats.claimed == worker.stats.completed == 60


async def test_a_prefetched_job_waits_behind_a_long_one_and_goes_back_at_shutdown(
    app_name: str, broker_url: str
) -> None:
    """The job claimed ahead of a long handler is not lost nor run twice: the stopping
    worker hands it back unrun, and the next worker runs everything once."""
    app = App(app_name, broker=broker_url)
    started: list[tuple[int, str]] = []
    long_started = anyio.Event()

    @app.task
    async def work(x: In, ctx: JobContext) -> Out:
        started.append((x.n, ctx.worker_id))
        if x.n == 0 and len(started) == 1:
            long_started.set()
            await anyio.sleep_forever()  # cancelled by the forced stop: handed back
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            first = await work.enqueue(In(0))
            async with app.worker(concurrency=1, prefetch=1) as worker:
                await long_started.wait()
                second = await work.enqueue(In(1))
                # The second job is claimed (prefetched) while the first still runs.
                await until_count(app, JobState.ACTIVE, 2)
                assert [n for n, _ in started] == [0]
                worker.stop(force=True)
            counts = await app.broker.counts("default")
            assert counts.get(JobState.WAITING, 0) == 2, counts  # both handed back
            async with app.worker(concurrency=1, prefetch=1) as again:
                assert await first.result(timeout=10) == Out(0)
                assert await second.result(timeout=10) == Out(1)
    # The prefetched job never started on the stopping worker: it ran once, on the
    # second; job 0 started twice (cancelled and handed back, then ran).
    assert [n for n, w in started if n == 1] == [1]
    assert [w for n, w in started if n == 1] == [again.id]
    assert [w for n, w in started if n == 0] == [worker.id, again.id]


async def test_a_graceful_stop_hands_prefetched_jobs_back_at_once(
    app_name: str, broker_url: str
) -> None:
    """Stopping starts no job: the prefetched one is back in the queue while the long
    one still finishes within its grace."""
    app = App(app_name, broker=broker_url)
    held = HeldTask(app)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            first = await held.work.enqueue(In(0))
            async with app.worker(concurrency=1, prefetch=1, grace=60) as worker:
                await held.long_started.wait()
                second = await held.work.enqueue(In(1))
                await until_count(app, JobState.ACTIVE, 2)
                worker.stop()
                counts = await until_count(app, JobState.WAITING, 1)
                assert counts.get(JobState.ACTIVE, 0) == 1  # job 0, still in its grace
                assert held.started == [0]
                held.release.set()
            assert await first.result(timeout=10) == Out(0)  # finished within its grace
            assert await second.status() == JobState.WAITING
    assert held.started == [0]
    assert worker.stats.completed == 1


async def test_a_negative_prefetch_is_refused_in_one_line(app_name: str) -> None:
    app = App(app_name, broker="memory://")

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(ConfigError, match=r"^prefetch must be >= 0, got -1$"):
        Worker(app, prefetch=-1)
