"""Worker reliability, on every broker: nothing a job does leaves it unsettled, sync
threads never let a job run twice or exceed ``concurrency``, shutdown is bounded, and
outcomes outlive broker outages.

Each test uses ``max_stalls=0`` where a job left unsettled would show: such a job is
recovered once and ends ``failed`` with reason ``stalled``, not with its own record.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Collection, Sequence
from typing import Any

import anyio
import anyio.from_thread
import msgspec
import pydantic
import pytest
from anyio.abc import TaskStatus

from tests.support import TEST_DEADLINE, FaultyBroker, In, Out
from typedq import (
    Abort,
    App,
    Backoff,
    BrokerError,
    BrokerUnavailable,
    FailureReason,
    FailureRecord,
    JobContext,
    JobFailed,
    JobState,
    Retry,
    execution,
    failures,
    outcomes,
)
from typedq import settling as settling_module
from typedq.broker.base import (
    ClaimedJob,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    LeaseStatus,
    Release,
)
from typedq.clock import VirtualClock
from typedq.names import new_job_id

pytestmark = pytest.mark.anyio

NO_WAIT = Backoff(kind="fixed", base=0.0, jitter=0.0)


# -- models whose decoding blows up in ways other than a validation error -------------


class Nested(msgspec.Struct):
    data: Any


class Picky(pydantic.BaseModel):
    name: str

    @pydantic.field_validator("name")
    @classmethod
    def _check(cls, value: str) -> str:
        raise TypeError("a validator with a bug")


class Keyed(msgspec.Struct):
    key: str

    def __post_init__(self) -> None:
        raise KeyError(self.key)


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


class Exploding(Backoff, frozen=True, kw_only=True):
    """A backoff whose arithmetic overflows."""

    def delay(self, retry: int) -> float:
        raise OverflowError("(34, 'Numerical result out of range')")


class Unbounded(Backoff, frozen=True, kw_only=True):
    """A backoff (a user's subclass) that answers an infinite delay; Backoff itself
    refuses non-finite settings at construction."""

    def delay(self, retry: int) -> float:
        return math.inf


def raw(task: str, payload: bytes) -> JobMessage:
    return JobMessage(id=new_job_id(), task=task, queue="default", payload=payload)


async def final_record(app: App, job_id: str) -> tuple[JobState, Any]:
    """Wait for the job's final state; its state and decoded failure record."""
    record = await app.broker.wait_finished(job_id, 10)
    assert record is not None, f"job {job_id} did not finish"
    assert record.error is not None
    return record.state, msgspec.msgpack.decode(record.error, type=FailureRecord)


# -- defect 5: unexpected exceptions become a failure record of that job -------------


async def test_payloads_that_break_decoding_are_recorded_as_invalid(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)
    ran: list[str] = []

    @app.task(retries=3)
    async def nested(x: Nested) -> None:
        ran.append("nested")

    @app.task(retries=3)
    async def picky(x: Picky) -> None:
        ran.append("picky")

    @app.task(retries=3)
    async def keyed(x: Keyed) -> None:
        ran.append("keyed")

    deep = raw("nested", b"\x81\xa4data" + b"\x91" * 200_000 + b"\xc0")
    validator = raw("picky", msgspec.msgpack.encode({"name": "bolt"}))
    post_init = raw("keyed", msgspec.msgpack.encode({"key": "k1"}))
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            await app.broker.enqueue([deep, validator, post_init])
            records = {m.id: await final_record(app, m.id) for m in (deep, validator, post_init)}
            # The worker is fine: a good job still runs.
            await (await nested.enqueue(Nested(data=[1]))).result(timeout=10)
    assert ran == ["nested"]
    for state, record in records.values():
        assert state is JobState.FAILED
        assert record.reason is FailureReason.INVALID_PAYLOAD
        assert record.retryable is False
        assert record.attempt == 1
    assert "RecursionError" in records[deep.id][1].message
    assert "TypeError" in records[validator.id][1].message
    assert "a validator with a bug" in records[validator.id][1].message
    assert "KeyError" in records[post_init.id][1].message


@pytest.mark.parametrize("kind", ["unprintable", "untraceable", "surrogate"])
async def test_exceptions_that_break_the_failure_record_are_still_recorded(
    app_name: str, broker_url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)
    errors: dict[str, Exception] = {
        "unprintable": Unprintable(),
        "untraceable": ValueError("cannot format my traceback"),
        "surrogate": ValueError("lone surrogate \ud800 in the message"),
    }
    if kind == "untraceable":

        def broken_formatter(exc: BaseException) -> str:
            raise RecursionError("maximum recursion depth exceeded while formatting")

        monkeypatch.setattr(failures, "_format_traceback", broken_formatter)

    @app.task(retries=0)
    async def broken(x: In) -> Out:
        raise errors[kind]

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await broken.enqueue(In(1))
            state, record = await final_record(app, job.id)
            good = await broken.enqueue(In(2))  # the worker still runs jobs
            await final_record(app, good.id)
    assert state is JobState.FAILED
    assert record.reason is FailureReason.ERROR
    assert record.attempt == 1
    if kind == "unprintable":
        assert record.error_type.endswith("Unprintable")
        assert "unprintable" in record.message
    elif kind == "untraceable":
        assert record.error_type == "ValueError"
        assert record.message == "cannot format my traceback"
        assert record.traceback is not None
        assert "traceback unavailable" in record.traceback
    else:
        assert record.error_type == "ValueError"
        assert "lone surrogate" in record.message


@pytest.mark.parametrize("delay", [math.inf, math.nan])
async def test_retry_with_a_delay_that_is_not_a_number_fails_the_job(
    app_name: str, broker_url: str, delay: float
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)
    attempts = 0

    @app.task(retries=3)
    async def again(x: In) -> Out:
        nonlocal attempts
        attempts += 1
        raise Retry(delay=delay)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await again.enqueue(In(1))
            state, record = await final_record(app, job.id)
    assert state is JobState.FAILED
    assert record.reason is FailureReason.ERROR
    assert record.error_type == "Retry"
    assert "not retried" in record.message
    assert f"Retry(delay={delay!r})" in record.message
    assert record.retryable is False
    assert attempts == 1


async def test_retry_with_a_negative_delay_is_an_ordinary_error(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)

    @app.task(retries=1, backoff=NO_WAIT)
    async def again(x: In) -> Out:
        raise Retry(delay=-1)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await again.enqueue(In(1))
            state, record = await final_record(app, job.id)
    assert state is JobState.FAILED
    assert record.error_type == "ValueError"
    assert "must be >= 0" in record.message
    assert record.attempt == 2  # its one retry was spent as usual


@pytest.mark.parametrize(
    "backoff",
    [
        Exploding(),
        Unbounded(),
    ],
    ids=["raises", "infinite"],
)
async def test_a_backoff_that_cannot_give_a_delay_fails_the_job(
    app_name: str, broker_url: str, backoff: Backoff
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)

    @app.task(retries=3, backoff=backoff)
    async def flaky(x: In) -> Out:
        raise ValueError("flaky dependency")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await flaky.enqueue(In(1))
            state, record = await final_record(app, job.id)
    assert state is JobState.FAILED
    assert record.error_type == "ValueError"
    assert record.message.startswith("flaky dependency (not retried: its backoff")
    assert record.retryable is False


async def test_a_huge_retry_delay_is_clamped_to_a_finite_one(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)

    @app.task(retries=3)
    async def later(x: In) -> Out:
        raise Retry(delay=1e300)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker() as worker:
            job = await later.enqueue(In(1))
            while worker.stats.retried == 0:  # noqa: ASYNC110
                await anyio.sleep(0.02)
            info = await job.info()
    assert info.status is JobState.SCHEDULED
    assert time.time() < info.run_at <= time.time() + outcomes.MAX_RETRY_DELAY + 60


async def test_an_unexpected_error_in_the_runtime_still_records_the_job(
    app_name: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last resorts: an attempt or a settle that raises gives a minimal record."""
    app = App(app_name, broker=broker_url, max_stalls=0)
    ran: list[int] = []

    @app.task(retries=0)
    async def task(x: In, ctx: JobContext) -> Out:  # a context: the worker builds one
        ran.append(x.n)
        raise ValueError("handler failed")

    def broken_context(**kwargs: Any) -> JobContext:
        raise RuntimeError("building the context failed")

    real = outcomes.safe_retry_delay
    calls = 0

    def broken_once(delay: float | None) -> float | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise TypeError("computing the delay failed")
        return real(delay)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            monkeypatch.setattr(execution, "JobContext", broken_context)
            first = await task.enqueue(In(1))
            _, in_attempt = await final_record(app, first.id)
            monkeypatch.undo()
            monkeypatch.setattr(settling_module, "safe_retry_delay", broken_once)
            second = await task.enqueue(In(2))
            state, in_settle = await final_record(app, second.id)
    assert in_attempt.error_type == "RuntimeError"
    assert "could not run this job: building the context failed" in in_attempt.message
    assert state is JobState.FAILED
    assert in_settle.error_type == "WorkerError"
    assert "could not record the outcome: TypeError: computing the delay failed" in (
        in_settle.message
    )
    assert ran == [2]


class PoisonBroker(FaultyBroker):
    """Refuses any failure batch that carries the poisoned job (a lasting error)."""

    poisoned: str = ""

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        await anyio.sleep(0.05)  # slow, so that failures queue up into shared batches
        if any(item.id == self.poisoned for item in items):
            raise BrokerError(f"failure of {self.poisoned} refused (poisoned)")
        return await self.inner.fail(items)


async def test_one_bad_settle_does_not_poison_its_batch(app_name: str, broker_url: str) -> None:
    faulty = PoisonBroker.for_url(broker_url, app_name)
    assert isinstance(faulty, PoisonBroker)
    app = App(app_name, broker=faulty, max_stalls=0)
    started = 0
    all_started = anyio.Event()
    total = 12

    @app.task(retries=1)
    async def doomed(x: In) -> Out:
        nonlocal started
        started += 1
        if started == total:
            all_started.set()
        await all_started.wait()  # all fail at once, so their failures share batches
        if x.n == 0:
            raise Retry(delay=math.inf)  # the old code sent inf and broke the batch
        if x.n == 1:
            raise Unprintable()
        raise Abort(f"job {x.n} aborts")

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = [await doomed.enqueue(In(i)) for i in range(total)]
            faulty.poisoned = jobs[2].id
            async with app.worker(concurrency=total) as worker:
                records = [await final_record(app, job.id) for job in jobs if job is not jobs[2]]
                worker.stop(force=True)
            poisoned = await jobs[2].status()
    for state, record in records:
        assert state is JobState.FAILED
        assert record.reason in (FailureReason.ABORTED, FailureReason.ERROR)
    assert records[0][1].error_type == "Retry"
    assert records[1][1].error_type.endswith("Unprintable")
    assert poisoned is JobState.ACTIVE  # never recorded; comes back by lease expiry


# -- defect 3 and 4: sync handlers, timeouts, bounded shutdown ------------------------


class RenewSpy(FaultyBroker):
    """Records when each job's lease was renewed, on the worker's (virtual) clock."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.clock = VirtualClock()
        self.renewed: list[tuple[float, str]] = []
        self._renewal: anyio.Event | None = None

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        statuses = await super().renew(leases, lease)
        now = self.clock.monotonic()
        self.renewed.extend((now, job_id) for job_id, _ in leases)
        if self._renewal is not None:
            self._renewal.set()
        return statuses

    async def renewed_after(self, job_id: str, since: float, most: float = 5.0) -> None:
        """Wait for a renewal of ``job_id`` that the broker answered after ``since``
        (virtual time), moving the clock on while none has: a renewal's round trip to a
        real Redis takes real time, during which the steps of :meth:`advance` went on, so
        the renewal loop's next sleep may end after where ``advance`` stopped (it waited
        forever here once, on a loaded box). At most ``most`` more virtual seconds."""
        deadline = self.clock.monotonic() + most
        while not any(at > since and jid == job_id for at, jid in self.renewed):
            assert self.clock.monotonic() < deadline, f"no renewal of {job_id} after {since}"
            self._renewal = anyio.Event()
            with anyio.move_on_after(0.05):  # real time: a reply on its way lands
                await self._renewal.wait()
            await self.clock.advance(0.1)

    async def advance(self, seconds: float, step: float = 0.1) -> None:
        """Move the worker's clock in steps (each step's wake-ups run before the next)."""
        for _ in range(round(seconds / step)):
            await self.clock.advance(step)


async def test_a_timed_out_sync_thread_keeps_its_slot_until_it_returns(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, max_stalls=0)
    release = threading.Event()
    started = threading.Event()
    ran: list[int] = []

    @app.task(timeout=0.3, retries=0)
    def hung(x: In) -> Out:
        ran.append(x.n)
        if x.n == 1:
            started.set()
            release.wait(TEST_DEADLINE)  # ignores its timeout: threads cannot be killed
        return Out(x.n)

    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with app, app.worker(concurrency=1) as worker:
                first = await hung.enqueue(In(1))
                with pytest.raises(JobFailed) as caught:
                    await first.result(timeout=10)
                assert started.is_set()
                # The attempt ended; its thread did not, and still holds the only slot.
                while worker.running:  # noqa: ASYNC110 -- the settle's last step
                    await anyio.sleep(0.01)
                assert worker.busy_threads == 1
                assert worker.free_slots == 0
                second = await hung.enqueue(In(2))
                await anyio.sleep(0.5)
                assert await second.status() is JobState.WAITING
                assert ran == [1]
                release.set()
                assert await second.result(timeout=10) == Out(2)
                assert worker.busy_threads == 0
                assert await first.status() is JobState.FAILED  # its late result: discarded
    finally:
        release.set()
    assert caught.value.reason is FailureReason.TIMEOUT
    assert ran == [1, 2]
    assert worker.stats.orphaned_threads == 1


async def test_shutdown_keeps_renewing_a_running_sync_job_and_records_its_outcome(
    app_name: str, broker_url: str
) -> None:
    """On a virtual clock: the grace period and the lease pass without real waiting."""
    spy = RenewSpy.for_url(broker_url, app_name)
    assert isinstance(spy, RenewSpy)
    app = App(app_name, broker=spy, lease=3.0, max_stalls=0)
    started = threading.Event()
    finish = threading.Event()
    runs = 0

    @app.task
    def steady(x: In) -> Out:
        nonlocal runs
        runs += 1
        started.set()
        finish.wait(TEST_DEADLINE)  # never looks at ctx.check_cancelled()
        return Out(x.n)

    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with app:
                async with app.worker(grace=0.1, clock=spy.clock) as worker:
                    job = await steady.enqueue(In(5))
                    await anyio.to_thread.run_sync(started.wait, TEST_DEADLINE)
                    worker.stop()
                    await anyio.wait_all_tasks_blocked()  # the shutdown's grace has begun
                    cancelled_at = spy.clock.monotonic() + 0.1
                    # Past the grace period the thread still runs: its lease must still be
                    # renewed, or another worker would start the job meanwhile.
                    await spy.advance(1.5)
                    await spy.renewed_after(job.id, cancelled_at + 0.2)
                    assert await job.status() is JobState.ACTIVE
                    finish.set()
                assert await job.result(timeout=5) == Out(5)  # its real outcome
    finally:
        finish.set()
    assert runs == 1
    assert worker.stats.abandoned == 0
    assert worker.stats.released == 0


async def test_cancel_of_a_sync_job_keeps_renewing_until_its_thread_returns(
    app_name: str, broker_url: str
) -> None:
    """On a virtual clock: more than a lease passes without real waiting."""
    spy = RenewSpy.for_url(broker_url, app_name)
    assert isinstance(spy, RenewSpy)
    app = App(app_name, broker=spy, lease=1.5, max_stalls=0)
    started = threading.Event()
    finish = threading.Event()
    stopped: list[str] = []

    @app.task
    def crunch(x: In, ctx: JobContext) -> Out:
        started.set()
        finish.wait(TEST_DEADLINE)
        try:
            ctx.check_cancelled()
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise
        return Out(x.n)

    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with app, app.worker(clock=spy.clock) as worker:
                job = await crunch.enqueue(In(1))
                await anyio.to_thread.run_sync(started.wait, TEST_DEADLINE)
                assert await job.cancel() is True
                asked = spy.clock.monotonic()
                # Longer than a lease: the thread still runs, so the lease is renewed.
                await spy.advance(2.0)
                await spy.renewed_after(job.id, asked + 1.6)
                assert await job.status() is JobState.ACTIVE
                finish.set()
                with pytest.raises(JobFailed) as caught:
                    await job.result(timeout=10)
    finally:
        finish.set()
    assert caught.value.reason is FailureReason.CANCELLED
    assert len(stopped) == 1
    assert worker.stats.lease_lost == 0


async def test_cancel_before_the_thread_starts_does_not_wait_for_a_thread(
    app_name: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel landing before the worker thread picked the call up: no thread ever runs,
    so the attempt must not wait for one (it did, until shutdown)."""
    app = App(app_name, broker=broker_url, max_stalls=0)
    ran: list[int] = []
    real_run_sync = anyio.to_thread.run_sync
    handing_over = anyio.Event()

    async def slow_hand_over(*args: Any, **kwargs: Any) -> Any:
        handing_over.set()
        await anyio.sleep(30)  # the window before a thread takes the call
        return await real_run_sync(*args, **kwargs)

    @app.task
    def crunch(x: In) -> Out:
        ran.append(x.n)
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            monkeypatch.setattr(anyio.to_thread, "run_sync", slow_hand_over)
            job = await crunch.enqueue(In(1))
            await handing_over.wait()
            assert await job.cancel() is True
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=5)
            monkeypatch.undo()
    assert caught.value.reason is FailureReason.CANCELLED
    assert ran == []


async def test_forced_stop_ends_the_worker_with_a_hung_sync_thread(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, lease=30.0)
    started = threading.Event()
    release = threading.Event()

    @app.task
    def stuck(x: In) -> Out:
        started.set()
        release.wait(60)  # stands for a handler that never returns
        return Out(x.n)

    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with app:
                async with app.worker(grace=30.0) as worker:
                    job = await stuck.enqueue(In(1))
                    await anyio.to_thread.run_sync(started.wait, TEST_DEADLINE)
                    stopping = time.monotonic()
                    worker.stop(force=True)
                # Bounded: neither the 30 s grace nor the 30 s lease was waited for.
                assert time.monotonic() - stopping < 10
                # Not handed back while its thread may still run: it comes back by lease.
                assert await job.status() is JobState.ACTIVE
    finally:
        release.set()
    assert worker.stats.abandoned == 1
    assert worker.stats.released == 0


# -- defect 11: outcomes outlive a broker outage ------------------------------------


class OutageBroker(FaultyBroker):
    """While ``down``, every call fails as if the broker were unreachable."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.down = False
        self.refused: Counter[str] = Counter()

    def _gate(self, op: str) -> None:
        if self.down:
            self.refused[op] += 1
            raise BrokerUnavailable(f"outage: {op} refused")

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        self._gate("claim")
        return await super().claim(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        if self.down:
            await anyio.sleep(min(timeout, 0.1))
            self._gate("wait_for_jobs")
        await super().wait_for_jobs(queues, timeout)

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        self._gate("renew")
        return await super().renew(leases, lease)

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        self._gate("complete")
        return await super().complete(items)

    async def complete_and_claim(
        self,
        items: Sequence[Completion],
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> tuple[list[FinishOutcome], list[ClaimedJob]]:
        self._gate("complete")
        return await self.inner.complete_and_claim(
            items, queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        self._gate("fail")
        return await super().fail(items)

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        self._gate("release")
        return await self.inner.release(items)

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        self._gate("cancel_requests")
        return await super().cancel_requests(ids)

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        if self.down:
            await anyio.sleep(min(timeout, 0.1))
            self._gate("wait_cancel_requests")
        await super().wait_cancel_requests(timeout, task_status=task_status)

    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        self._gate("recover_stalled")
        return await self.inner.recover_stalled(limit, holding=holding)


@pytest.mark.slow  # an outage of more than two real leases
async def test_a_completion_outlives_an_outage_longer_than_two_leases(
    app_name: str, broker_url: str
) -> None:
    faulty = OutageBroker.for_url(broker_url, app_name)
    assert isinstance(faulty, OutageBroker)
    # Short (the outage lasts 2.5 of them), as long as the blocked-loop test's: a busy
    # machine not scheduling the worker for a moment must not expire it before the outage.
    lease = 0.6
    app = App(app_name, broker=faulty, lease=lease, max_stalls=0)
    started = anyio.Event()
    go = anyio.Event()
    runs: Counter[int] = Counter()

    @app.task
    async def work(x: In) -> Out:
        runs[x.n] += 1
        started.set()
        await go.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2) as worker:
            job = await work.enqueue(In(9))
            await started.wait()
            faulty.down = True
            go.set()  # it completes during the outage: the completion cannot be sent
            await anyio.sleep(2.5 * lease)
            assert faulty.refused["complete"] >= 2
            assert worker.running == 1  # the job keeps its slot meanwhile
            faulty.down = False
            assert await job.result(timeout=10) == Out(9)
            after = await work.enqueue(In(10))
            assert await after.result(timeout=10) == Out(10)
    assert runs == {9: 1, 10: 1}
    assert worker.stats.completed == 2
    assert worker.stats.lease_lost == 0
    assert worker.stats.finish_rejected == 0


async def test_shutdown_gives_up_on_outcomes_in_a_bounded_time(
    app_name: str, broker_url: str
) -> None:
    faulty = OutageBroker.for_url(broker_url, app_name)
    assert isinstance(faulty, OutageBroker)
    app = App(app_name, broker=faulty, lease=1.0, max_stalls=0)
    started = anyio.Event()
    go = anyio.Event()

    @app.task
    async def work(x: In) -> Out:
        started.set()
        await go.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with app.worker(grace=0.5) as worker:
                job = await work.enqueue(In(1))
                await started.wait()
                faulty.down = True
                go.set()
                await anyio.sleep(0.3)
                stopping = time.monotonic()
            # grace + one lease + the final wait, at most.
            assert time.monotonic() - stopping < 0.5 + 1.0 + 6.0
            faulty.down = False
            assert await job.status() is JobState.ACTIVE  # comes back by lease expiry
    assert worker.stats.settles_given_up == 1
