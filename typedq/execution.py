"""Running one claimed job: from an envelope to an outcome.

:class:`Executor` decodes the payload, calls the handler under its cancel scope and
timeout, and turns whatever happened into an :data:`~typedq.outcomes.Outcome` with a
structured :class:`~typedq.errors.FailureRecord` (what went wrong is classified by
:class:`~typedq.failures.Failures`). It never raises for anything the job
did: bad payloads, unknown tasks and handler errors are all outcomes, and so is anything
unexpected on the way (a decoder blowing up, an exception whose ``__str__`` raises, a
retry delay that is not a number): every attempt ends in an outcome of its own job.
Settling the outcome with the broker is :mod:`typedq.settling`'s business.

Sync handlers run in threads, which cannot be interrupted. A thread is abandoned when
its attempt ends early (timeout, lost lease): the attempt gets its outcome at once, the
thread runs on, and :class:`Running` says whether it is still alive so that the worker
keeps its slot taken until it really returns (its late result is discarded). A cancel
request or a shutdown instead waits for the thread (the job's lease is still renewed
meanwhile), because handing the job on while its code still runs would run it twice.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from .broker.base import Broker, ClaimedJob
from .clock import SYSTEM_CLOCK, Clock, VirtualClock, VirtualDeadline, move_on_after
from .context import JobContext
from .errors import FailureReason, InvalidPayload, PayloadTooLarge
from .failures import Failures, type_name
from .handlerscope import HandlerScope, run_in_context
from .logs import job_fields
from .outcomes import (
    Abandon,
    Attempt,
    Complete,
    Drop,
    Fail,
    Outcome,
    describe,
    minimal_failure,
)
from .running import CancelReason, Running
from .streams import Emitter
from .task import Task
from .upcast import Upcaster

__all__ = ["CancelReason", "Executor", "HandlerScope", "Running", "run_in_context"]

log = logging.getLogger("typedq.worker")


class Executor:
    """Runs claimed jobs of a set of tasks (one per worker).

    :param tasks: the handlers by task name
    :param worker_id: recorded in failure records
    :param threads: bounds how many sync handlers run in threads at once
    :param progress: stores a running job's progress with the broker
    :param thread_exited: called in the event loop when a handler thread returns (it may
        be long after its attempt ended)
    :param broker: gives the broker emitting tasks' streams go to (``emits=``), read at
        each use; None: no broker (unit tests of the executor: nothing is streamed)
    """

    def __init__(
        self,
        tasks: dict[str, Task[Any, Any]],
        *,
        worker_id: str,
        threads: anyio.CapacityLimiter,
        progress: Callable[[ClaimedJob, bytes], Coroutine[Any, Any, None]],
        thread_exited: Callable[[Running], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        broker: Callable[[], Broker] | None = None,
    ) -> None:
        self.tasks = tasks
        self._broker = broker
        self._clock = clock
        self.worker_id = worker_id
        self._threads = threads
        self._progress = progress
        self._thread_exited = thread_exited
        #: Builds the failure records and failed outcomes of the attempts.
        self.failures = Failures(worker_id, clock)
        #: A virtual clock times the attempts' timeouts (tests); on any other clock the
        #: event loop's own deadline does, at no cost per job.
        self._virtual = clock if isinstance(clock, VirtualClock) else None

    async def attempt(
        self, claimed: ClaimedJob, running: Running, scopes: HandlerScope | None = None
    ) -> Attempt:
        """Run one claimed job to an outcome; never raises for anything the job did.

        Three steps: decode the payload (:meth:`_decode`), call the handler under its
        cancel scope and timeout (:meth:`_call_with_limits`), and classify what happened
        (:meth:`_interrupted`, :meth:`_classify`).

        :param scopes: the scope the calling task's handlers run in, kept across its
            jobs (a worker's runner); None: one of its own for this attempt
        """
        try:
            decoded = self._decode(claimed)
        except Exception as exc:
            return Attempt(self._defect(claimed, exc))
        if isinstance(decoded, Fail):
            return Attempt(decoded)
        task, payload = decoded
        producer = claimed.message.fingerprint
        mismatch = None
        if producer and producer != task.input.fingerprint:
            mismatch = (producer, task.input.fingerprint)
        outcome: Outcome
        try:
            # The steps inline, not a coroutine of their own: this runs per job.
            # -1, "the task's default", the usual case, tested here: a call less per job.
            given = claimed.message.timeout
            timeout = task.options.timeout if given == -1.0 else _timeout_of(task, given)
            got, deadline = await self._call_with_limits(
                claimed, task, payload, running, timeout, scopes
            )
            if got is None:
                ended = await self._interrupted(claimed, task, running, timeout, deadline)
                if isinstance(ended, tuple):
                    outcome = self._classify(claimed, task, running, ended)
                else:
                    outcome = ended
            else:
                outcome = self._classify(claimed, task, running, got)
        except Exception as exc:
            outcome = self._defect(claimed, exc)
        return Attempt(outcome, mismatch)

    def _defect(self, claimed: ClaimedJob, exc: Exception) -> Fail:
        """A defect on the way (ours or a model's): the job still gets a record."""
        log.exception(
            "job %s (%s) attempt %d: unexpected error while running it; recording a failure",
            claimed.message.id,
            claimed.message.task,
            claimed.attempt,
            extra=job_fields(claimed, self.worker_id),
        )
        return Fail(
            minimal_failure(
                claimed,
                worker_id=self.worker_id,
                error_type=type_name(exc),
                message=f"the worker could not run this job: {describe(exc)}",
                failed_at=self.failures.clock.time(),
            )
        )

    def _decode(self, claimed: ClaimedJob) -> tuple[Task[Any, Any], Any] | Fail:
        """The job's task and decoded payload, or the failure of an unknown task or a
        payload that does not decode."""
        message = claimed.message
        task = self.tasks.get(message.task)
        if task is None:
            return Fail(
                self.failures.record(
                    claimed,
                    FailureReason.UNKNOWN_TASK,
                    "UnknownTask",
                    f"unknown task {message.task!r} (registered: {', '.join(sorted(self.tasks))})",
                    retryable=False,
                )
            )
        if task.upcasters:
            upcaster = task.upcasters.get(message.fingerprint)
            if upcaster is not None:
                return self._upcast(claimed, task, upcaster)
        try:
            return task, task.input.decode(message.payload)
        except (InvalidPayload, PayloadTooLarge) as exc:
            return Fail(self.failures.invalid_payload(claimed, task, describe(exc)))
        except Exception as exc:
            # Not a validation error but still the payload's doing: a payload nested too
            # deep (RecursionError), a validator raising TypeError, __post_init__ raising
            # KeyError. The same payload fails the same way again: no retries.
            return Fail(
                self.failures.invalid_payload(
                    claimed, task, f"{type_name(exc)}: {describe(exc)}", exc=exc
                )
            )

    def _upcast(
        self, claimed: ClaimedJob, task: Task[Any, Any], upcaster: Upcaster[Any]
    ) -> tuple[Task[Any, Any], Any] | Fail:
        """A job of an old schema with an upcaster (typedq.upcast): its payload in the
        current model, or a ``schema_mismatch`` failure naming the upcaster."""
        try:
            return task, upcaster.apply(claimed.message.payload)
        except (InvalidPayload, PayloadTooLarge) as exc:
            why = f"upcast by {upcaster.name} failed: {describe(exc)}"
            return Fail(self.failures.invalid_payload(claimed, task, why))

    async def _call_with_limits(
        self,
        claimed: ClaimedJob,
        task: Task[Any, Any],
        payload: Any,
        running: Running,
        timeout: float | None,
        scopes: HandlerScope | None,
    ) -> tuple[tuple[bool, Any] | None, float]:
        """Call the handler in the attempt's cancel scope, within its timeout.

        :return: (True, value) or (False, exception) once the handler finished, or None
            when it was interrupted (timeout, cancel, lost lease, shutdown); and the
            deadline of the timeout
        """
        # A handler that takes no context gets none: nothing to build for it.
        if task.emits is not None and self._broker is not None:
            running.emitter = Emitter(self._broker(), claimed, task.emits, self._clock)
        args = (
            (payload, self._context(claimed, task, running.emitter))
            if task.takes_context
            else (payload,)
        )
        got: tuple[bool, Any] | None = None
        if running.cancel_reason is not None:
            # Cancelled before it started (a prefetched job at shutdown, a cancel request
            # that came first): the handler is not called at all.
            return got, math.inf
        kept = scopes is not None
        if scopes is None:
            scopes = HandlerScope()
        # One scope for both ways an attempt is interrupted: its deadline is the timeout,
        # and cancelling it is a cancel, a lost lease or a shutdown (each sets
        # running.cancel_reason first, which is how _interrupted tells them apart).
        scope = scopes.enter()
        running.scope = scope
        virtual = self._virtual
        expiry: VirtualDeadline | None = None
        if timeout is None:
            deadline = math.inf
        elif virtual is None:
            # On the event loop's clock, by the runner's one timer (HandlerScope.arm).
            deadline = scopes.arm(timeout)
        else:
            # A virtual clock's: the scope is cancelled when the clock is advanced past it
            # (the deadline is on the clock's monotonic time).
            deadline = virtual.monotonic() + timeout
            expiry = virtual.cancel_after(timeout, scope)
        try:
            try:
                if running.emitter is not None:
                    got = (True, await self._call_emitting(task, args, running, running.emitter))
                elif task.is_async:
                    # _call inline (a coroutine less per job).
                    running.in_handler = True
                    got = (True, await task.fn(*args))
                else:
                    got = (True, await self._call_in_thread(task.fn, args, running))
            except Exception as exc:
                got = (False, exc)
            finally:
                # Disarmed: from here on, nothing meant for this job cancels the scope.
                running.in_handler = False
                running.scope = None
                if expiry is not None:
                    assert virtual is not None
                    virtual.withdraw(expiry)
                elif timeout is not None:
                    if kept:
                        scopes.disarm()
                    else:
                        scopes.stop_timer()  # its scope is left below
        except BaseException as exc:
            # A cancellation: the scope's own (the attempt is interrupted, got stays
            # None) or from further out, which goes on (the scope is left either way).
            if not scopes.leave(exc):
                raise
        else:
            if not kept or scope.cancel_called:
                # A cancelled scope stays so (cancelled as the handler returned, or the
                # handler swallowed it): the next job gets a new one.
                scopes.leave()
        return got, deadline

    async def _interrupted(
        self,
        claimed: ClaimedJob,
        task: Task[Any, Any],
        running: Running,
        timeout: float | None,
        deadline: float,
    ) -> Outcome | tuple[bool, Any]:
        """The outcome of an interrupted attempt, or what its sync handler's thread
        returned when the attempt waited for it."""
        reason = running.cancel_reason
        if reason is None:
            # The timeout: the attempt ends now, even if a sync handler's thread
            # runs on (it cannot be killed; its slot stays taken until it returns).
            return self.failures.timed_out(claimed, task, timeout)
        if reason == "lease_lost" or not running.thread_alive:
            return self.failures.cancelled(claimed, reason)
        # A cancel request or a shutdown while a sync handler's thread still runs:
        # wait for it (the lease is still renewed), within the job's timeout.
        if self._virtual is not None and deadline != math.inf:
            with move_on_after(self._virtual, deadline - self._virtual.monotonic()):
                await running.wait_thread()
        elif self._virtual is not None:
            await running.wait_thread()
        else:
            with anyio.CancelScope(deadline=deadline):
                await running.wait_thread()
        if running.lost:
            return Drop()
        got = running.thread_result
        if got is None:
            if reason == "shutdown":
                return Abandon()
            return self.failures.cancelled(claimed, reason)
        if not got[0] and not isinstance(got[1], Exception):
            # It saw check_cancelled() (or ended some other abrupt way).
            return self.failures.cancelled(claimed, reason)
        return got

    def _classify(
        self, claimed: ClaimedJob, task: Task[Any, Any], running: Running, got: tuple[bool, Any]
    ) -> Outcome:
        """The outcome of a handler that finished: its result, or its error."""
        if running.cancel_reason == "lease_lost" or running.lost:
            return Drop()  # never write a result after the lease was lost
        ok, value = got
        if ok:
            try:  # the result encoded here, not in a method of its own: this runs per job
                return Complete(task.output.encode(value))
            except Exception as exc:
                return self.failures.invalid_result(claimed, task, exc)
        return self.failures.handler_error(claimed, task, value)

    async def _call_emitting(
        self, task: Task[Any, Any], args: tuple[Any, ...], running: Running, emitter: Emitter
    ) -> Any:
        """Call an emitting task's handler with its stream's flush loop beside it; the
        items it emitted are all stored when this returns or raises (not when the
        attempt is cancelled: a timed-out, cancelled or lost attempt's last batch may
        be lost), so before the attempt settles."""
        error: Exception | None = None
        value: Any = None
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(emitter.run)
                try:
                    value = await self._call(task, args, running)
                except Exception as exc:
                    # Raised outside the task group, so it stays itself (not a group).
                    error = exc
                try:
                    await emitter.flush()
                except Exception as exc:
                    # Its items could not be stored: the attempt fails (and is retried).
                    error = error or exc
                tg.cancel_scope.cancel()
        finally:
            emitter.close()
        if error is not None:
            raise error
        return value

    async def end_stream(self, running: Running, outcome: Outcome) -> None:
        """After an emitting attempt settled: write its stream's end entry when the
        outcome is final (the broker takes it only if the job is final by this attempt),
        so readers end at once. Best effort: a reader that finds no end entry ends when
        it sees the job final."""
        emitter = running.emitter
        if emitter is None or self._broker is None:
            return
        retention = self._broker().settings.retention
        if isinstance(outcome, Complete):
            ttl = retention.completed_ttl
        elif isinstance(outcome, Fail) and outcome.retry_delay is None:
            ttl = retention.failed_ttl
        else:
            return
        claimed = running.claimed
        try:
            await emitter.end(ttl)
        except Exception as exc:
            log.warning(
                "job %s (%s) attempt %d: could not end its stream (%s); its readers end "
                "when they see the job final",
                claimed.message.id,
                claimed.message.task,
                claimed.attempt,
                describe(exc),
                extra=job_fields(claimed, self.worker_id),
            )

    def _context(
        self, claimed: ClaimedJob, task: Task[Any, Any], emitter: Emitter | None = None
    ) -> JobContext[Any]:
        message = claimed.message
        return JobContext(
            job_id=message.id,
            task=task.name,
            queue=message.queue,
            attempt=claimed.attempt,
            enqueued_at=claimed.enqueued_at,
            worker_id=self.worker_id,
            report=lambda data: self._progress(claimed, data),
            scheduled_for=message.scheduled_for or None,
            emitter=emitter,
        )

    async def _call(self, task: Task[Any, Any], args: tuple[Any, ...], running: Running) -> Any:
        if task.is_async:
            running.in_handler = True
            return await task.fn(*args)
        return await self._call_in_thread(task.fn, args, running)

    async def _call_in_thread(
        self, fn: Callable[..., Any], args: tuple[Any, ...], running: Running
    ) -> Any:
        """Run ``fn`` in a worker thread; abandoned (not stopped) when cancelled.

        The thread reports its return to the event loop without blocking (the loop may
        be gone by then), so the worker knows when the slot it holds is really free.
        ``ctx.check_cancelled()`` in the thread still sees the attempt's cancellation.
        """
        token = anyio.lowlevel.current_token()
        on_exit = self._thread_exited

        def report(result: tuple[bool, Any]) -> None:
            running.thread_exited(result)
            if on_exit is not None:
                on_exit(running)

        # Cancellation may come before the thread picks the call up (then it never runs):
        # the lock settles whether the body started or was skipped, never both.
        gate = threading.Lock()
        started = skipped = False

        def body() -> tuple[bool, Any]:
            nonlocal started
            with gate:
                if skipped:
                    return (False, None)
                started = True
            result: tuple[bool, Any]
            try:
                result = (True, fn(*args))
            except BaseException as exc:
                result = (False, exc)
            # RunFinishedError: the event loop has ended; nobody waits for this thread.
            with contextlib.suppress(RuntimeError):
                token.backend_class.run_sync_soon(report, (result,), token.native_token)
            return result

        running.thread_started()
        # The capacity limiter is released when a thread is abandoned; the worker keeps
        # counting the thread against `concurrency` until it returns (thread_alive).
        try:
            ok, value = await anyio.to_thread.run_sync(
                body, abandon_on_cancel=True, limiter=self._threads
            )
        except BaseException:
            with gate:
                if not started:
                    skipped = True
                    running.thread_skipped()
            raise
        # The handler has returned (whatever the order its report reaches the loop in).
        running.thread_exited((ok, value))
        if ok:
            return value
        raise value


def _timeout_of(task: Task[Any, Any], timeout: float) -> float | None:
    """The attempt's timeout in seconds, or None; odd numbers from a raw envelope mean
    the task's default (negative, NaN) or no limit (0, infinity)."""
    if timeout != timeout or timeout < 0:  # NaN (compared inline: this runs per job)
        return task.options.timeout
    if timeout == 0 or math.isinf(timeout):
        return None
    return timeout
