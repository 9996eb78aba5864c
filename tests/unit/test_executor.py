"""Unit tests of the Executor: one claimed job in, one outcome out, no broker and no worker.

The claimed jobs are built by hand (a real ``ClaimedJob`` around a real envelope); what
the worker would do with the outcome is not exercised here.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

from tests.support import TEST_DEADLINE, In, Out
from typedq import Abort, App, FailureReason, JobContext, Reject, Retry
from typedq.broker.base import ClaimedJob, JobMessage
from typedq.clock import SYSTEM_CLOCK, Clock, VirtualClock
from typedq.execution import Executor, HandlerScope, Running
from typedq.outcomes import Abandon, Attempt, Complete, Drop, Fail, HandBack, Outcome

pytestmark = pytest.mark.anyio


class OutOfStock(msgspec.Struct):
    """A declared domain error."""


class Undeclared(msgspec.Struct):
    """A domain error the task does not declare."""


def build_app() -> App:
    app = App("executor-tests")

    @app.task(retries=2)
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    @app.task(retries=2)
    def double_sync(x: In) -> Out:
        return Out(x.n * 2)

    @app.task(retries=2)
    async def fails(x: In) -> Out:
        if x.n == 1:
            raise Retry(delay=math.nan)
        if x.n == 2:
            raise Abort("no point")
        if x.n == 3:
            raise Reject(Undeclared())
        raise ValueError(f"bad {x.n}")

    @app.task(errors=(OutOfStock,))
    async def rejects(x: In) -> Out:
        raise Reject(OutOfStock())

    @app.task
    async def wrong_result(x: In) -> Out:
        bad: Any = "not an Out"
        return bad  # type: ignore[no-any-return]

    @app.task
    async def forever(x: In) -> Out:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    @app.task
    def sync_with_ctx(x: In, ctx: JobContext) -> Out:
        return Out(ctx.attempt)

    return app


APP = build_app()


def claimed(
    task: str,
    payload: Any = None,
    *,
    attempt: int = 1,
    fingerprint: str = "",
    timeout: float = -1.0,
    raw: bytes | None = None,
) -> ClaimedJob:
    """A claimed job as a broker would hand it over."""
    message = JobMessage(
        id=f"job-{task}",
        task=task,
        queue="default",
        payload=raw if raw is not None else msgspec.msgpack.encode(payload or In(1)),
        fingerprint=fingerprint,
        timeout=timeout,
    )
    return ClaimedJob(
        message=message, token=f"lease-{task}", attempt=attempt, enqueued_at=time.time()
    )


async def no_progress(claimed: ClaimedJob, data: bytes) -> None:
    raise AssertionError("no test reports progress")


def executor() -> Executor:
    return Executor(
        dict(APP.tasks),
        worker_id="w1",
        threads=anyio.CapacityLimiter(2),
        progress=no_progress,
    )


async def run(job: ClaimedJob, running: Running | None = None) -> Attempt:
    with anyio.fail_after(TEST_DEADLINE):
        return await executor().attempt(job, running or Running(job))


def failed(attempt: Attempt) -> Fail:
    assert isinstance(attempt.outcome, Fail), attempt.outcome
    return attempt.outcome


async def test_a_returned_value_completes_with_the_encoded_result() -> None:
    for task in ("double", "double_sync"):
        attempt = await run(claimed(task, In(21)))
        assert attempt == Attempt(Complete(msgspec.msgpack.encode(Out(42))))


async def test_a_sync_handler_with_context_sees_its_attempt() -> None:
    attempt = await run(claimed("sync_with_ctx", attempt=3))
    assert attempt.outcome == Complete(msgspec.msgpack.encode(Out(3)))


async def test_an_unknown_task_fails_for_good_naming_the_registered_ones() -> None:
    outcome = failed(await run(claimed("nope")))
    assert outcome.record.reason is FailureReason.UNKNOWN_TASK
    assert outcome.retry_delay is None
    assert not outcome.record.retryable
    assert "unknown task 'nope'" in outcome.record.message
    assert "double" in outcome.record.message
    assert outcome.record.worker_id == "w1"


async def test_an_invalid_payload_fails_for_good() -> None:
    outcome = failed(await run(claimed("double", raw=msgspec.msgpack.encode({"m": 1}))))
    assert outcome.record.reason is FailureReason.INVALID_PAYLOAD
    assert outcome.retry_delay is None
    assert "task 'double': invalid payload" in outcome.record.message


async def test_a_differing_fingerprint_is_reported_not_counted() -> None:
    fingerprint = APP.tasks["double"].input.fingerprint
    attempt = await run(claimed("double", In(2), fingerprint="stale"))
    assert attempt.outcome == Complete(msgspec.msgpack.encode(Out(4)))
    assert attempt.fingerprint_mismatch == ("stale", fingerprint)
    # The same fingerprint as the worker's is no mismatch.
    attempt = await run(claimed("double", In(2), fingerprint=fingerprint))
    assert attempt.fingerprint_mismatch is None


async def test_a_differing_fingerprint_and_an_invalid_payload_is_a_schema_mismatch() -> None:
    attempt = await run(claimed("double", raw=msgspec.msgpack.encode({"m": 1}), fingerprint="old"))
    outcome = failed(attempt)
    assert outcome.record.reason is FailureReason.SCHEMA_MISMATCH
    assert "old" in outcome.record.message
    assert attempt.fingerprint_mismatch is None  # it did not run


async def test_a_handler_error_is_retried_while_retries_remain() -> None:
    outcome = failed(await run(claimed("fails", In(7))))
    assert outcome.record.reason is FailureReason.ERROR
    assert outcome.record.error_type == "ValueError"
    assert outcome.record.message == "bad 7"
    assert outcome.record.retryable
    assert outcome.record.traceback is not None
    assert outcome.retry_delay is not None
    assert outcome.retry_delay >= 0
    # Attempt 3 of a task with retries=2 is the last.
    last = failed(await run(claimed("fails", In(7), attempt=3)))
    assert last.retry_delay is None
    assert not last.record.retryable


async def test_retry_with_a_delay_that_is_not_a_number_is_not_retried() -> None:
    outcome = failed(await run(claimed("fails", In(1))))
    assert outcome.retry_delay is None
    assert "not retried: Retry(delay=nan) is not a finite number >= 0" in outcome.record.message


async def test_abort_fails_for_good() -> None:
    outcome = failed(await run(claimed("fails", In(2))))
    assert outcome.record.reason is FailureReason.ABORTED
    assert outcome.retry_delay is None


async def test_rejects_keep_declared_errors_and_name_undeclared_ones() -> None:
    undeclared = failed(await run(claimed("fails", In(3))))
    assert undeclared.record.error_type == "UndeclaredDomainError"
    assert "add it to @app.task(errors=...)" in undeclared.record.message
    declared = failed(await run(claimed("rejects")))
    assert declared.record.reason is FailureReason.DOMAIN_ERROR
    assert declared.record.domain_type is not None
    assert declared.record.domain_type.endswith("OutOfStock")


async def test_a_result_the_output_model_rejects_fails_for_good() -> None:
    outcome = failed(await run(claimed("wrong_result")))
    assert outcome.record.reason is FailureReason.INVALID_RESULT
    assert outcome.retry_delay is None


async def test_the_timeout_ends_the_attempt_and_is_retried() -> None:
    outcome = failed(await run(claimed("forever", timeout=0.01)))
    assert outcome.record.reason is FailureReason.TIMEOUT
    assert "ran longer than its timeout of 0.01 s" in outcome.record.message


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("shutdown", HandBack()), ("lease_lost", Drop())],
)
async def test_an_interrupted_attempt_is_handed_back_or_dropped(
    reason: Any, expected: object
) -> None:
    job = claimed("forever")
    running = Running(job)
    running.cancel(reason)
    assert (await run(job, running)).outcome == expected


async def test_a_cancel_request_records_a_cancelled_failure() -> None:
    job = claimed("forever", attempt=2)
    running = Running(job)
    running.cancel("cancel")
    outcome = failed(await run(job, running))
    assert outcome.cancelled
    assert outcome.record.reason is FailureReason.CANCELLED
    assert outcome.record.message == "cancelled while running (attempt 2)"


async def test_a_lost_lease_drops_even_a_finished_result() -> None:
    job = claimed("double")
    running = Running(job)
    running.lost = True
    assert (await run(job, running)).outcome == Drop()


async def test_shutdown_gives_up_on_a_sync_thread_that_does_not_return() -> None:
    done = anyio.Event()
    entered, gate = threading.Event(), threading.Event()
    app = App("executor-abandon")

    @app.task
    def stuck(x: In) -> Out:
        entered.set()
        gate.wait(TEST_DEADLINE)
        return Out(0)

    job = claimed("stuck")
    running = Running(job)
    ex = Executor(
        dict(app.tasks), worker_id="w1", threads=anyio.CapacityLimiter(1), progress=no_progress
    )
    result: list[Attempt] = []

    async def attempt() -> None:
        result.append(await ex.attempt(job, running))
        done.set()

    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt)
            await anyio.to_thread.run_sync(entered.wait, TEST_DEADLINE)
            running.cancel("shutdown")
            running.abandon()
            await done.wait()
            gate.set()
    assert result == [Attempt(Abandon())]


# -- a runner's scope, kept across its jobs (HandlerScope) ---------------------------


def gated_app() -> tuple[App, dict[int, anyio.Event], dict[int, anyio.Event]]:
    """An app of one task, ``gated``, whose handler for ``In(n)`` sets ``started[n]``
    and returns ``Out(n)`` once ``gates[n]`` is set (:func:`gated_jobs` makes both)."""
    app = App("executor-kept-scope")
    started: dict[int, anyio.Event] = {}
    gates: dict[int, anyio.Event] = {}

    @app.task
    async def gated(x: In) -> Out:
        started[x.n].set()
        await gates[x.n].wait()
        return Out(x.n)

    return app, started, gates


def executor_of(app: App, clock: Clock = SYSTEM_CLOCK) -> Executor:
    return Executor(
        dict(app.tasks),
        worker_id="w1",
        threads=anyio.CapacityLimiter(1),
        progress=no_progress,
        clock=clock,
    )


def gated_jobs(
    started: dict[int, anyio.Event], gates: dict[int, anyio.Event], *timeouts: float
) -> list[Running]:
    """One job of ``gated`` per timeout (-1: the task's, none), numbered from 1."""
    jobs = []
    for n, timeout in enumerate(timeouts, start=1):
        started[n], gates[n] = anyio.Event(), anyio.Event()
        jobs.append(Running(claimed("gated", In(n), timeout=timeout)))
    return jobs


async def run_in_one_scope(ex: Executor, jobs: list[Running], outcomes: list[Outcome]) -> None:
    """Attempt ``jobs`` one after another in this task, in one kept scope (as a runner)."""
    with HandlerScope() as scopes:
        for running in jobs:
            outcomes.append((await ex.attempt(running.claimed, running, scopes)).outcome)


def completed(n: int) -> Complete:
    return Complete(msgspec.msgpack.encode(Out(n)))


async def test_a_kept_scope_cancels_only_the_job_whose_handler_runs() -> None:
    app, started, gates = gated_app()
    ex = executor_of(app)
    jobs = gated_jobs(started, gates, -1, -1, -1)
    outcomes: list[Outcome] = []
    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_in_one_scope, ex, jobs, outcomes)
            await started[1].wait()
            jobs[0].cancel("cancel")  # job 1 stops; the runner's next job gets a new scope
            await started[2].wait()
            gates[2].set()
            await started[3].wait()
            # Job 2's handler returned already: its cancel or lost lease now reaches nothing.
            jobs[1].cancel("cancel")
            jobs[1].mark_lost()
            await anyio.wait_all_tasks_blocked()
            gates[3].set()
    assert isinstance(outcomes[0], Fail)
    assert outcomes[0].cancelled
    assert outcomes[1:] == [completed(2), completed(3)]


async def test_a_kept_scope_times_out_each_job_on_its_own_deadline() -> None:
    clock = VirtualClock()
    app, started, gates = gated_app()
    ex = executor_of(app, clock)
    jobs = gated_jobs(started, gates, 10.0, -1, 5.0)
    gates[1].set()  # job 1 returns at once, well within its 10 s
    outcomes: list[Outcome] = []
    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run_in_one_scope, ex, jobs, outcomes)
            await started[2].wait()
            assert clock.sleepers == 0  # job 1's deadline went with it
            await clock.advance(20.0)  # past where job 1's deadline was: job 2 runs on
            gates[2].set()
            await started[3].wait()
            await clock.advance(6.0)  # past job 3's 5 s
    assert outcomes[:2] == [completed(1), completed(2)]
    assert isinstance(outcomes[2], Fail)
    assert outcomes[2].record.reason is FailureReason.TIMEOUT
    assert clock.sleepers == 0


async def test_a_kept_scope_is_disarmed_when_a_timed_handler_returns() -> None:
    job = claimed("double", timeout=30.0)
    with HandlerScope() as scopes:
        attempt = await executor().attempt(job, Running(job), scopes)
        assert attempt.outcome == Complete(msgspec.msgpack.encode(Out(2)))
        assert scopes.enter().deadline == math.inf  # the same scope, no deadline left


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # trio: each scope's own deadline
async def test_a_kept_scope_times_out_by_one_timer_on_the_loop_clock() -> None:
    """On the event loop's clock a runner keeps one timer: a later deadline leaves it
    where it is, a timer that fires before the running job's deadline waits for that
    deadline instead of cancelling the job, and an earlier deadline moves it."""
    app, started, gates = gated_app()
    ex = executor_of(app)
    jobs = gated_jobs(started, gates, 30.0, 60.0, 0.01)
    gates[1].set()  # job 1 returns at once, well within its 30 s
    outcomes: list[Outcome] = []
    kept: list[HandlerScope] = []

    async def runner() -> None:
        with HandlerScope() as scopes:
            kept.append(scopes)
            for running in jobs:
                outcomes.append((await ex.attempt(running.claimed, running, scopes)).outcome)
        assert scopes._timer is None  # stopped with the runner

    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            await started[2].wait()
            timer = kept[0]._timer
            assert timer is not None
            first = timer.when()
            assert first < anyio.current_time() + 31  # job 1's; job 2's 60 s left it
            kept[0]._expire()  # as if it fired now: job 2's deadline has not passed
            await anyio.wait_all_tasks_blocked()
            scope = jobs[1].scope
            assert scope is not None
            assert not scope.cancel_called
            rearmed = kept[0]._timer
            assert rearmed is not None
            assert rearmed.when() > first + 25  # job 2's deadline
            gates[2].set()
            # Job 3's 0.01 s moves the timer earlier, and it times out on it.
    assert outcomes[:2] == [completed(1), completed(2)]
    assert isinstance(outcomes[2], Fail)
    assert outcomes[2].record.reason is FailureReason.TIMEOUT


async def test_a_cancel_from_outside_goes_through_a_kept_scope() -> None:
    app, started, gates = gated_app()
    ex = executor_of(app)
    jobs = gated_jobs(started, gates, -1, -1)
    outcomes: list[Outcome] = []
    outer = anyio.CancelScope()
    caught: list[bool] = []

    async def runner() -> None:
        with outer:
            await run_in_one_scope(ex, jobs[:1], outcomes)
        caught.append(outer.cancelled_caught)
        gates[2].set()
        await run_in_one_scope(ex, jobs[1:], outcomes)  # the task goes on unharmed

    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            await started[1].wait()
            outer.cancel()  # the runner's own cancellation (a shutdown's), not its job's
    assert caught == [True]
    assert outcomes == [completed(2)]
