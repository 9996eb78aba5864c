"""The worker runtime against every broker: slots, retries, timeouts, cancel, shutdown, leases.

These run on Redis too, because each one depends on a broker transition (claim limits,
scheduled retries, cancel requests, release, fencing) as much as on the runtime.
"""

from __future__ import annotations

import itertools
import time

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest

from tests.support import TEST_DEADLINE, FaultyBroker, In, Out
from typedq import (
    App,
    Backoff,
    FailureReason,
    JobCancelled,
    JobContext,
    JobFailed,
    JobState,
    Retry,
    Worker,
)
from typedq.broker.base import Completion, FinishOutcome
from typedq.clock import VirtualClock

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

NO_WAIT = Backoff(kind="fixed", base=0.0, jitter=0.0)


async def test_concurrency_limit_is_exact(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    limit = 3
    running = 0
    peak = 0
    peak_active = 0
    full = anyio.Event()

    @app.task
    async def slow(x: In) -> Out:
        nonlocal running, peak, peak_active
        running += 1
        peak = max(peak, running)
        # What the broker holds as claimed: never more than the worker's slots.
        active = (await app.broker.counts("default")).get(JobState.ACTIVE, 0)
        peak_active = max(peak_active, active)
        if running == limit:
            full.set()
        await full.wait()
        await anyio.sleep(0.01)
        running -= 1
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=limit) as worker:
            jobs = await slow.enqueue_many(In(i) for i in range(15))
            results = [await job.result(timeout=10) for job in jobs]
    assert results == [Out(i) for i in range(15)]
    assert peak == limit
    assert 1 <= peak_active <= limit
    assert worker.stats.claimed == 15
    assert worker.stats.completed == 15


async def test_busy_worker_does_not_claim(app_name: str, broker_url: str) -> None:
    """Capacity first, then claim: a saturated worker leaves new jobs to an idle one."""
    app = App(app_name, broker=broker_url)
    blocker_started = anyio.Event()
    unblock = anyio.Event()
    ran_on: dict[int, str] = {}

    @app.task
    async def work(x: In, ctx: JobContext) -> Out:
        ran_on[x.n] = ctx.worker_id
        if x.n == 0:
            blocker_started.set()
            await unblock.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1) as busy:
            blocker = await work.enqueue(In(0))
            await blocker_started.wait()
            async with app.worker(concurrency=1) as idle:
                victims = {i: await work.enqueue(In(i)) for i in (1, 2, 3)}
                # Had the busy worker claimed a victim, it would sit behind `unblock`.
                for i, victim in victims.items():
                    assert await victim.result(timeout=10) == Out(i)
                unblock.set()
                assert await blocker.result(timeout=10) == Out(0)
    assert ran_on[0] == busy.id
    assert {ran_on[i] for i in (1, 2, 3)} == {idle.id}
    assert busy.stats.claimed == 1


async def test_async_and_sync_handlers(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="a")
    async def add_async(x: In) -> Out:
        await anyio.lowlevel.checkpoint()
        return Out(x.n + 1)

    @app.task(queue="s")
    def add_sync(x: In) -> Out:
        return Out(x.n + 2)

    @app.task(queue="a")
    async def nothing(x: In) -> None:
        return None

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            a = await add_async.enqueue(In(1))
            s = await add_sync.enqueue(In(1))
            n = await nothing.enqueue(In(1))
            assert await a.result(timeout=10) == Out(2)
            assert await s.result(timeout=10) == Out(3)
            await n.result(timeout=10)  # returns None
            assert await n.status() is JobState.COMPLETED


@pytest.mark.parametrize(
    ("backoff", "gaps"),
    [
        (Backoff(kind="fixed", base=0.05, jitter=0.0), [0.05, 0.05, 0.05]),
        (Backoff(kind="exponential", base=0.05, factor=2.0, jitter=0.0), [0.05, 0.1, 0.2]),
    ],
    ids=["fixed", "exponential"],
)
async def test_retries_with_backoff(
    app_name: str, broker_url: str, backoff: Backoff, gaps: list[float]
) -> None:
    app = App(app_name, broker=broker_url)
    attempts: dict[int, list[tuple[int, float]]] = {}

    @app.task(retries=3, backoff=backoff)
    async def flaky(x: In, ctx: JobContext) -> Out:
        """Fails its first ``x.n`` attempts."""
        attempts.setdefault(x.n, []).append((ctx.attempt, time.monotonic()))
        if ctx.attempt <= x.n:
            raise ValueError(f"attempt {ctx.attempt} fails")
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            jobs = {n: await flaky.enqueue(In(n)) for n in (0, 1, 3, 99)}
            for n in (0, 1, 3):
                assert await jobs[n].result(timeout=10) == Out(n + 1)
            with pytest.raises(JobFailed) as caught:
                await jobs[99].result(timeout=10)

    for n in (0, 1, 3):
        assert [a for a, _ in attempts[n]] == list(range(1, n + 2))
    # Always failing: the first attempt plus exactly `retries` more.
    assert [a for a, _ in attempts[99]] == [1, 2, 3, 4]
    record = caught.value.record
    assert record.attempt == 4
    assert record.reason is FailureReason.ERROR
    assert record.retryable is False
    assert record.message == "attempt 4 fails"
    # Backoff is respected between attempts (and not wildly exceeded).
    times = [t for _, t in attempts[99]]
    for (earlier, later), gap in zip(itertools.pairwise(times), gaps, strict=True):
        assert gap - 0.01 <= later - earlier < gap + 1.5


async def test_retry_with_delay(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    seen: list[tuple[int, float]] = []
    first_failed = anyio.Event()

    @app.task(retries=2, backoff=Backoff(kind="fixed", base=60.0))
    async def later(x: In, ctx: JobContext) -> Out:
        seen.append((ctx.attempt, time.monotonic()))
        if ctx.attempt == 1:
            first_failed.set()
            raise Retry(delay=0.3, message="not yet")
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await later.enqueue(In(1))
            await first_failed.wait()
            await anyio.sleep(0.1)
            info = await job.info()
            assert info.status is JobState.SCHEDULED  # the Retry delay, not the 60 s backoff
            assert info.error is not None
            assert info.error.message == "not yet"
            assert info.error.retryable is True
            assert await job.result(timeout=10) == Out(2)
    (a1, t1), (a2, t2) = seen
    assert (a1, a2) == (1, 2)
    assert 0.29 <= t2 - t1 < 2.0


async def test_timeout_fails_the_attempt_and_retries(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    timed_out: list[int] = []

    @app.task(timeout=0.2, retries=1, backoff=NO_WAIT)
    async def sleepy(x: In, ctx: JobContext) -> Out:
        if ctx.attempt <= x.n:
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                timed_out.append(ctx.attempt)
                raise
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            recovers = await sleepy.enqueue(In(1))
            assert await recovers.result(timeout=10) == Out(2)
            start = time.monotonic()
            never = await sleepy.enqueue(In(5))
            with pytest.raises(JobFailed) as caught:
                await never.result(timeout=10)
            assert time.monotonic() - start < 5
            # A per-job override of the timeout.
            quick = await sleepy.enqueue(In(5), timeout=0.05, retries=0)
            with pytest.raises(JobFailed) as quick_caught:
                await quick.result(timeout=10)
    record = caught.value.record
    assert record.reason is FailureReason.TIMEOUT
    assert record.attempt == 2
    assert record.retryable is False
    assert "timeout" in record.message
    assert quick_caught.value.record.reason is FailureReason.TIMEOUT
    assert quick_caught.value.record.attempt == 1
    assert timed_out == [1, 1, 2, 1]


async def test_cancel_running_async_handler(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    started = anyio.Event()
    saw_cancel = anyio.Event()

    @app.task
    async def forever(x: In) -> Out:
        if x.n == 0:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                saw_cancel.set()
                raise
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2) as worker:
            job = await forever.enqueue(In(0))
            await started.wait()
            assert await job.status() is JobState.ACTIVE
            assert await job.cancel() is True
            with pytest.raises(JobCancelled) as caught:
                await job.result(timeout=10)
            assert saw_cancel.is_set()
            assert await job.status() is JobState.CANCELLED
            assert await job.cancel() is False
            # The worker carries on.
            assert await (await forever.enqueue(In(7))).result(timeout=10) == Out(7)
    assert caught.value.record.reason is FailureReason.CANCELLED
    assert caught.value.record.attempt == 1
    assert worker.stats.cancelled == 1


async def test_graceful_shutdown_finishes_short_and_hands_back_long(
    app_name: str, broker_url: str
) -> None:
    """On a virtual clock: the grace period and the short job's work take no real time."""
    app = App(app_name, broker=broker_url)
    clock = VirtualClock()
    short_started = anyio.Event()
    long_started = anyio.Event()
    long_cancelled = anyio.Event()
    hang = True
    long_attempts: list[int] = []

    @app.task
    async def work(x: In, ctx: JobContext) -> Out:
        if x.n == 0:
            short_started.set()
            await clock.sleep(0.1)
            return Out(0)
        long_attempts.append(ctx.attempt)
        long_started.set()
        if hang:
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                long_cancelled.set()
                raise
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with app.worker(concurrency=2, grace=0.3, clock=clock) as first:
                short = await work.enqueue(In(0))
                long = await work.enqueue(In(1))
                await short_started.wait()
                await long_started.wait()
                leaving = clock.monotonic()
                first.stop()
                await anyio.wait_all_tasks_blocked()  # the shutdown's grace has begun
                await clock.advance(0.1)  # the short job finishes within it
                assert await short.result(timeout=5) == Out(0)
                await clock.advance(0.15)
                assert not long_cancelled.is_set()  # 0.25 s in: still within the grace
                await clock.advance(0.1)  # past the grace: the long job is cancelled
                await long_cancelled.wait()
                exit_began = time.monotonic()
            # The rest of the shutdown waits for no more time, virtual or real.
            assert time.monotonic() - exit_began < 5
            took = clock.monotonic() - leaving
            assert 0.25 <= took < 5
            assert long_cancelled.is_set()
            assert await short.status() is JobState.COMPLETED
            assert await short.result(timeout=1) == Out(0)
            # Handed back: waiting again, the attempt not spent.
            info = await long.info()
            assert info.status is JobState.WAITING
            assert info.attempt == 0
            assert first.stats.released == 1
            assert first.stats.completed == 1

            hang = False
            async with app.worker(concurrency=2):
                assert await long.result(timeout=10) == Out(1)
    assert long_attempts == [1, 1]


async def test_shutdown_waits_for_in_flight_jobs_within_grace(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    started = anyio.Event()

    @app.task
    def steady(x: In) -> Out:
        anyio.from_thread.run_sync(started.set)
        time.sleep(0.2)
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with app.worker(grace=5):
                job = await steady.enqueue(In(4))
                await started.wait()
            # Leaving the block waited for the sync handler to finish.
            assert await job.status() is JobState.COMPLETED
            assert await job.result(timeout=1) == Out(4)


async def test_a_worker_cancelled_while_it_starts_returns_and_claims_nothing(
    app_name: str, broker_url: str
) -> None:
    """A cancel that reaches ``run()`` while it starts (``typedq worker`` signalled
    during its start-up) ends it: ``run()`` returns and nothing is claimed. (Its serving
    task was shielded from its first line, and a cancelled start waits for the task it
    started: run() never returned, and the process hung after SIGTERM.)"""
    app = App(app_name, broker=broker_url)

    @app.task
    async def noop(x: In) -> Out:
        return Out(x.n)

    async with app:
        job = await noop.enqueue(In(1))
        worker = app.worker()
        returned = anyio.Event()

        async def run_cancelled() -> None:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await worker.run()
            assert scope.cancelled_caught
            returned.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_cancelled)
            with anyio.move_on_after(TEST_DEADLINE):
                await returned.wait()
            if not returned.is_set() and worker._serve_scope is not None:
                worker._serve_scope.cancel()  # unstick it: the test fails, not hangs
        assert returned.is_set(), "run() did not return after its start was cancelled"
        assert worker.stats.claimed == 0
        assert await job.status() is JobState.WAITING


async def test_lease_loss_cancels_handler_and_discards_its_result(
    app_name: str, broker_url: str
) -> None:
    lease = 0.3
    faulty = FaultyBroker.for_url(broker_url, app_name)
    app = App(app_name, broker=faulty, lease=lease)
    started = anyio.Event()
    cancelled = anyio.Event()

    @app.task
    async def hold(x: In) -> Out:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return Out(-1)  # never: the handler only ends by cancellation

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1) as worker:
            job = await hold.enqueue(In(1))
            await started.wait()
            # The worker's link stalls: its renewals stop reaching the broker ...
            faulty.hold_renewals()
            await anyio.sleep(lease * 1.5 + 0.05)
            # ... the lease expires, and a second worker recovers and claims the job.
            inner = faulty.inner
            while True:
                await inner.recover_stalled()
                stolen = await inner.claim(["default"], 1, worker_id="thief", lease=30)
                if stolen:
                    break
                await anyio.sleep(0.05)
            (thief,) = stolen
            assert thief.attempt == 2
            assert thief.stalls == 1
            assert not cancelled.is_set()
            # The stalled renewal gets through, learns the lease is gone, cancels the handler.
            faulty.resume()
            await cancelled.wait()
            result = hold.output.encode(Out(99))
            assert await inner.complete([Completion(job.id, thief.token, result)]) == [
                FinishOutcome.OK
            ]
            assert await job.result(timeout=5) == Out(99)
    assert worker.stats.lease_lost == 1
    assert worker.stats.completed == 0
    assert worker.stats.failed == 0
    assert worker.stats.finish_rejected == 0


async def test_worker_for_one_task(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="mine")
    async def mine(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="theirs")
    async def theirs(x: In) -> Out:
        return Out(-x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            other = await theirs.enqueue(In(1))
            worker: Worker[In, Out] = Worker(mine, concurrency=2)
            async with worker:
                assert await (await mine.enqueue(In(5))).result(timeout=10) == Out(5)
            assert worker.tasks.keys() == {"mine"}
            assert await other.status() is JobState.WAITING
            async with app.worker():
                assert await other.result(timeout=10) == Out(-1)


async def test_lost_worker_job_is_recovered_and_stalls_spend_no_retries(
    app_name: str, broker_url: str
) -> None:
    lease = 0.3
    app = App(app_name, broker=broker_url, lease=lease)
    attempts: list[int] = []

    @app.task(retries=1, backoff=NO_WAIT)
    async def fragile(x: In, ctx: JobContext) -> Out:
        attempts.append(ctx.attempt)
        raise ValueError(f"attempt {ctx.attempt}")

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await fragile.enqueue(In(1))
            # A worker claims the job and dies: no renewals, no finish.
            (lost,) = await app.broker.claim(["default"], 1, worker_id="dead", lease=lease)
            assert lost.attempt == 1
            async with app.worker():  # its reaper recovers the job once the lease expires
                with pytest.raises(JobFailed) as caught:
                    await job.result(timeout=10)
            info = await job.info()
    # The stall bumped the attempt but spent no retry: two real failures were allowed.
    assert attempts == [2, 3]
    assert info.stalls == 1
    assert caught.value.record.attempt == 3
    assert caught.value.record.reason is FailureReason.ERROR


async def test_cancel_jobs_waiting_or_backing_off_while_a_worker_runs(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    runs: list[int] = []

    @app.task(retries=5, backoff=Backoff(kind="fixed", base=30.0, jitter=0.0))
    async def flaky(x: In) -> Out:
        runs.append(x.n)
        raise ValueError("again later")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1):
            delayed = await flaky.enqueue(In(1), delay=30)
            assert await delayed.cancel() is True
            backing_off = await flaky.enqueue(In(2))
            # Wait until the first attempt failed and the job sits in its 30 s backoff.
            while await backing_off.status() is not JobState.SCHEDULED:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            assert await backing_off.cancel() is True
            for job in (delayed, backing_off):
                with pytest.raises(JobCancelled):
                    await job.result(timeout=5)
    assert runs == [2]
