"""The worker's timing on virtual time: lease renewal, the reaper, the heartbeat, the
scheduler's backoff and the shutdown grace run on the clock a worker is given
(``Worker(..., clock=...)``), so a test of a 9-second lease moves a
:class:`~typedq.clock.VirtualClock` and sleeps for nothing.

The embedded broker's own deadlines stay real here: a spy in front of it records each
call on the worker's clock, and the assertions are about when the worker made them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from itertools import pairwise
from typing import Any, cast

import anyio
import anyio.lowlevel
import pytest

from tests.support import TEST_DEADLINE, FaultyBroker, In, Out
from typedq import App, BrokerUnavailable, JobFailed, JobState
from typedq.broker.base import Broker, LeaseStatus, WorkerInfo
from typedq.clock import VirtualClock
from typedq.schedule import Scheduler

pytestmark = pytest.mark.anyio

#: Where the virtual wall clock starts (any epoch time; a round one reads well).
EPOCH = 1_700_000_000.0


class ClockSpy(FaultyBroker):
    """The embedded broker, with each lease renewal, recovery and heartbeat recorded at
    the worker's virtual time."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.clock = VirtualClock()  # the worker's, set by clocked_app
        #: (virtual time, job ids) of each renewal the broker took.
        self.renewed: list[tuple[float, list[str]]] = []
        #: (virtual time, job ids the worker holds) of each stalled-job recovery.
        self.recoveries: list[tuple[float, set[str]]] = []
        #: (virtual time, entry, ttl) of each heartbeat.
        self.heartbeats: list[tuple[float, WorkerInfo, float]] = []
        self.unregistered: list[str] = []

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        statuses = await super().renew(leases, lease)
        self.renewed.append((self.clock.monotonic(), [job_id for job_id, _ in leases]))
        return statuses

    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        self.recoveries.append((self.clock.monotonic(), set(holding)))
        return await self.inner.recover_stalled(limit, holding=holding)

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        await self.inner.register_worker(info, ttl=ttl)
        self.heartbeats.append((self.clock.monotonic(), info, ttl))

    async def unregister_worker(self, worker_id: str) -> None:
        await self.inner.unregister_worker(worker_id)
        self.unregistered.append(worker_id)

    def renewals_of(self, job_id: str) -> list[float]:
        return [at for at, ids in self.renewed if job_id in ids]


def clocked_app(app_name: str, lease: float) -> tuple[App, ClockSpy, VirtualClock]:
    clock = VirtualClock(start=EPOCH)
    spy = ClockSpy.for_url("memory://", app_name)
    assert isinstance(spy, ClockSpy)
    spy.clock = clock
    return App(app_name, broker=spy, lease=lease, max_stalls=0), spy, clock


# The workers below have no grace period: a shutdown's waits are on virtual time too,
# so a test failing with a job still running would otherwise wait forever to stop.


async def until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition`` holds (no time passes, real or virtual)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


async def advance(clock: VirtualClock, seconds: float, step: float = 0.5) -> None:
    """Move the clock in steps, so each step's wake-ups run before the next one's."""
    for _ in range(round(seconds / step)):
        await clock.advance(step)


async def test_leases_are_renewed_every_third_of_a_lease_on_virtual_time(app_name: str) -> None:
    app, spy, clock = clocked_app(app_name, lease=9.0)
    started = anyio.Event()
    finish = anyio.Event()

    @app.task
    async def hold(x: In) -> Out:
        started.set()
        await finish.wait()
        return Out(x.n)

    real_start = time.monotonic()
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0) as worker:
            assert worker.renew_interval == 3.0
            job = await hold.enqueue(In(1))
            await started.wait()
            claimed_at = clock.monotonic()
            await advance(clock, 30.0)
            renewals = spy.renewals_of(job.id)
            assert await job.status() is JobState.ACTIVE
            finish.set()
            assert await job.result(timeout=10) == Out(1)
    # Three leases of virtual time: renewed at least every third of a lease throughout.
    gaps = [b - a for a, b in pairwise([claimed_at, *renewals, claimed_at + 30.0])]
    assert max(gaps) <= worker.renew_interval
    assert len(renewals) >= 30.0 / worker.renew_interval
    assert worker.stats.lease_lost == 0
    # ... and none of it was waited for.
    assert time.monotonic() - real_start < 9.0


async def test_one_failed_renewal_within_the_lease_keeps_the_job(app_name: str) -> None:
    app, spy, clock = clocked_app(app_name, lease=9.0)
    started = anyio.Event()
    finish = anyio.Event()
    cancelled = anyio.Event()

    @app.task
    async def steady(x: In) -> Out:
        started.set()
        try:
            await finish.wait()
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0) as worker:
            job = await steady.enqueue(In(3))
            await started.wait()
            spy.inject("renew", 1)
            await advance(clock, 12.0)  # longer than the lease: later renewals kept it
            assert spy.raised["renew"] == 1
            assert spy.renewals_of(job.id)
            assert not cancelled.is_set()
            assert await job.status() is JobState.ACTIVE
            finish.set()
            assert await job.result(timeout=10) == Out(3)
    assert worker.stats.lease_lost == 0
    assert worker.stats.completed == 1


async def test_renewals_failing_for_a_lease_stop_the_handler_and_the_reaper(
    app_name: str,
) -> None:
    """Past a lease without a renewal, another worker may hold the job: its async
    handler is stopped (its result discarded); and while its own leases are not renewed,
    the worker recovers no stalled jobs (they could be its own)."""
    app, spy, clock = clocked_app(app_name, lease=9.0)
    started = anyio.Event()
    cancelled_at: list[float] = []

    @app.task
    async def hold(x: In) -> Out:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled_at.append(clock.monotonic())
            raise
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0) as worker:
            await hold.enqueue(In(1))
            await started.wait()
            await advance(clock, 3.0)
            last_renewal = spy.renewed[-1][0]
            recoveries = len(spy.recoveries)
            spy.inject("renew", 1_000)  # the link to the broker fails from now on
            await advance(clock, 8.5)
            assert cancelled_at == []  # within the lease: kept
            await advance(clock, 3.5)
            await until(lambda: worker.running == 0)
            # Stopped at the first failed renewal past the lease.
            assert len(cancelled_at) == 1
            assert last_renewal + 9.0 < cancelled_at[0] <= last_renewal + 9.0 + 3.0
            assert len(spy.recoveries) == recoveries
    assert worker.stats.lease_lost == 1
    assert worker.stats.completed == 0


async def test_the_reaper_runs_every_interval_and_spares_the_worker_s_own_jobs(
    app_name: str,
) -> None:
    app, spy, clock = clocked_app(app_name, lease=30.0)
    started = anyio.Event()
    finish = anyio.Event()

    @app.task
    async def hold(x: In) -> Out:
        started.set()
        await finish.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0) as worker:
            assert worker.reaper_interval == 5.0
            await until(lambda: bool(spy.recoveries))  # the first one, at start
            job = await hold.enqueue(In(1))
            await started.wait()
            await advance(clock, 20.0)
            finish.set()
            assert await job.result(timeout=10) == Out(1)
    times = [at for at, _ in spy.recoveries]
    assert times == [0.0, 5.0, 10.0, 15.0, 20.0]
    # Every recovery after the claim was told the job this worker runs.
    assert all(job.id in holding for _, holding in spy.recoveries[1:])


async def test_heartbeats_are_written_every_interval_at_the_clock_s_time(app_name: str) -> None:
    app, spy, clock = clocked_app(app_name, lease=30.0)

    @app.task
    async def idle(x: In) -> Out:
        return Out(x.n)

    worker = app.worker(clock=clock)
    worker.heartbeat = 10.0
    with anyio.fail_after(TEST_DEADLINE):
        async with app, worker:
            await until(lambda: bool(spy.heartbeats))
            await advance(clock, 35.0)
    assert worker.started_at == EPOCH
    assert [at for at, _, _ in spy.heartbeats] == [0.0, 10.0, 20.0, 30.0]
    for at, info, ttl in spy.heartbeats:
        assert ttl == 30.0  # three missed heartbeats
        assert info.id == worker.id
        assert info.started_at == EPOCH
        assert info.heartbeat_at == EPOCH + at
    assert spy.unregistered == [worker.id]


class Unreachable:
    """A broker that never answers the scheduler (each try recorded on the clock)."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.tries: list[float] = []

    async def sync_schedules(self, *args: Any, **kwargs: Any) -> Any:
        self.tries.append(self.clock.monotonic())
        raise BrokerUnavailable("the broker is down")


async def test_the_scheduler_backs_off_on_its_clock() -> None:
    clock = VirtualClock(start=EPOCH)
    broker = Unreachable(clock)
    scheduler = Scheduler(cast(Broker, broker), [], prune=True, clock=clock)
    async with anyio.create_task_group() as tg:
        tg.start_soon(scheduler.run)
        await until(lambda: bool(broker.tries))
        await advance(clock, 12.0, step=0.1)
        tg.cancel_scope.cancel()
    # Doubling from 0.1 s, capped at 5 s: 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, ...
    assert broker.tries == pytest.approx([0.0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 11.3])


async def test_a_failure_record_is_dated_by_the_workers_clock(app_name: str) -> None:
    app, _, clock = clocked_app(app_name, lease=9.0)

    @app.task
    async def broken(x: In) -> Out:
        raise ValueError(f"no {x.n}")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0):
            await clock.advance(42.0)
            job = await broken.enqueue(In(7))
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=10)
    assert failed.value.record.message == "no 7"
    assert failed.value.record.failed_at == EPOCH + 42.0


async def test_a_job_s_timeout_runs_on_the_workers_clock(app_name: str) -> None:
    """An hour's timeout passes when the worker's virtual clock passes it, not before
    (the handler waits on an event nobody sets: only the timeout ends it)."""
    app, _, clock = clocked_app(app_name, lease=9.0)
    started = anyio.Event()

    @app.task(timeout=3600, retries=0)
    async def stuck(x: In) -> Out:
        started.set()
        await anyio.Event().wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(clock=clock, grace=0):
            job = await stuck.enqueue(In(1))
            await started.wait()
            await advance(clock, 3540.0, step=60.0)
            await advance(clock, 59.5)
            assert await job.status() is JobState.ACTIVE  # 3599.5 s: still within its hour
            await advance(clock, 1.0)
            with pytest.raises(JobFailed) as failed:
                await job.result(timeout=10)
    assert failed.value.record.reason == "timeout"
    assert failed.value.record.failed_at == pytest.approx(EPOCH + 3600.5, abs=0.6)
