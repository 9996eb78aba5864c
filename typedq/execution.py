"""Running one claimed job: from an envelope to an outcome.

:class:`Executor` decodes the payload, calls the handler under its cancel scope and
timeout, and turns whatever happened into an :data:`Outcome` with a structured
:class:`~typedq.errors.FailureRecord`. It never raises for anything the job did: bad
payloads, unknown tasks and handler errors are all outcomes. Settling the outcome with
the broker is the worker's business.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import anyio.to_thread
import msgspec

from .broker.base import ClaimedJob
from .context import JobContext
from .errors import (
    Abort,
    EncodeError,
    FailureReason,
    FailureRecord,
    InvalidPayload,
    PayloadTooLarge,
    Reject,
    Retry,
)
from .serde import codec_for
from .task import Task

__all__ = [
    "CancelReason",
    "Complete",
    "Drop",
    "Executor",
    "Fail",
    "HandBack",
    "Outcome",
    "Running",
]

log = logging.getLogger("typedq.worker")

_TRACEBACK_LIMIT = 8192

#: Why a running job's scope was cancelled: ``job.cancel()``, a lost lease, or shutdown.
CancelReason = Literal["cancel", "lease_lost", "shutdown"]


class Running:
    """A claimed job this worker runs: its claim, cancel scope, and why it was cancelled."""

    __slots__ = ("cancel_reason", "claimed", "scope")

    def __init__(self, claimed: ClaimedJob) -> None:
        self.claimed = claimed
        self.scope: anyio.CancelScope | None = None
        self.cancel_reason: CancelReason | None = None

    def cancel(self, reason: CancelReason) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.scope is not None:
            self.scope.cancel()


@dataclass(frozen=True)
class Complete:
    """The handler returned: the encoded result."""

    result: bytes


@dataclass(frozen=True)
class Fail:
    """The attempt failed: retry after ``retry_delay``, or finally (``None``), or cancelled."""

    record: FailureRecord
    retry_delay: float | None = None
    cancelled: bool = False


@dataclass(frozen=True)
class HandBack:
    """Shutdown interrupted the attempt: hand the job back unspent."""


@dataclass(frozen=True)
class Drop:
    """Lease lost: write nothing; the job belongs to someone else now."""


Outcome = Complete | Fail | HandBack | Drop


class Executor:
    """Runs claimed jobs of a set of tasks (one per worker).

    :param tasks: the handlers by task name
    :param worker_id: recorded in failure records
    :param threads: bounds how many sync handlers run in threads at once
    :param progress: stores a running job's progress with the broker
    :param mismatches: counts (task, producer fingerprint) of payloads that validated
        although the producer's schema differed
    """

    def __init__(
        self,
        tasks: dict[str, Task[Any, Any]],
        *,
        worker_id: str,
        threads: anyio.CapacityLimiter,
        progress: Callable[[ClaimedJob, bytes], Coroutine[Any, Any, None]],
        mismatches: Counter[tuple[str, str]],
    ) -> None:
        self.tasks = tasks
        self.worker_id = worker_id
        self._threads = threads
        self._progress = progress
        self.mismatches = mismatches

    def _failure(
        self,
        claimed: ClaimedJob,
        reason: FailureReason,
        error_type: str,
        message: str,
        *,
        retryable: bool,
        exc: BaseException | None = None,
        domain: Any = None,
    ) -> FailureRecord:
        tb = None
        if exc is not None:
            tb = "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:]
        return FailureRecord(
            reason=reason,
            error_type=error_type,
            message=message,
            attempt=claimed.attempt,
            retryable=retryable,
            traceback=tb,
            domain_type=None if domain is None else qualified(type(domain)),
            domain_payload=None if domain is None else codec_for(type(domain)).encode(domain),
            worker_id=self.worker_id,
            failed_at=time.time(),
        )

    async def attempt(self, claimed: ClaimedJob, running: Running) -> Outcome:
        """Run one claimed job to an outcome; never raises for anything the job did."""
        message = claimed.message
        task = self.tasks.get(message.task)
        if task is None:
            return Fail(
                self._failure(
                    claimed,
                    FailureReason.UNKNOWN_TASK,
                    "UnknownTask",
                    f"unknown task {message.task!r} (registered: {', '.join(sorted(self.tasks))})",
                    retryable=False,
                )
            )
        try:
            payload = task.input.decode(message.payload)
        except (InvalidPayload, PayloadTooLarge) as exc:
            return Fail(self._invalid_payload(claimed, task, exc))
        if message.fingerprint and message.fingerprint != task.input.fingerprint:
            key = (task.name, message.fingerprint)
            if key not in self.mismatches:
                log.warning(
                    "task %r: a producer's schema fingerprint %s differs from the worker's %s; "
                    "the payload validated, so it runs (regenerate the producer's stubs)",
                    task.name,
                    message.fingerprint,
                    task.input.fingerprint,
                )
            self.mismatches[key] += 1

        ctx = JobContext(
            job_id=message.id,
            task=task.name,
            queue=message.queue,
            attempt=claimed.attempt,
            enqueued_at=claimed.enqueued_at,
            worker_id=self.worker_id,
            report=lambda data: self._progress(claimed, data),
        )
        timeout = task.options.timeout if message.timeout < 0 else (message.timeout or None)
        outcome: Outcome | None = None
        with anyio.CancelScope() as scope:
            running.scope = scope
            if running.cancel_reason is not None:
                scope.cancel()
            try:
                with anyio.move_on_after(timeout) as deadline:
                    result = await self._call(task, payload, ctx)
                if deadline.cancel_called and running.cancel_reason is None:
                    outcome = self._retry_or_fail(
                        claimed,
                        task,
                        self._failure(
                            claimed,
                            FailureReason.TIMEOUT,
                            "TimeoutError",
                            f"attempt {claimed.attempt} ran longer than its timeout of {timeout} s",
                            retryable=True,
                        ),
                    )
                else:
                    outcome = self._encode_result(claimed, task, result)
            except Retry as exc:
                outcome = self._retry_or_fail(
                    claimed,
                    task,
                    self._failure(
                        claimed, FailureReason.ERROR, "Retry", str(exc), retryable=True, exc=exc
                    ),
                    delay=exc.delay,
                )
            except Abort as exc:
                outcome = Fail(
                    self._failure(
                        claimed, FailureReason.ABORTED, "Abort", str(exc), retryable=False, exc=exc
                    )
                )
            except Reject as exc:
                outcome = Fail(self._rejected(claimed, task, exc))
            except Exception as exc:
                outcome = self._retry_or_fail(
                    claimed,
                    task,
                    self._failure(
                        claimed,
                        FailureReason.ERROR,
                        qualified(type(exc)),
                        str(exc),
                        retryable=True,
                        exc=exc,
                    ),
                )
        reason = running.cancel_reason
        if reason is not None and (outcome is None or scope.cancelled_caught):
            return self._cancelled_outcome(claimed, reason)
        assert outcome is not None
        return outcome

    def _cancelled_outcome(self, claimed: ClaimedJob, reason: CancelReason) -> Outcome:
        if reason == "shutdown":
            return HandBack()
        if reason == "lease_lost":
            return Drop()
        return Fail(
            self._failure(
                claimed,
                FailureReason.CANCELLED,
                "JobCancelled",
                f"cancelled while running (attempt {claimed.attempt})",
                retryable=False,
            ),
            cancelled=True,
        )

    async def _call(self, task: Task[Any, Any], payload: Any, ctx: JobContext) -> Any:
        if task.is_async:
            return await task.invoke(payload, ctx)
        args = (payload, ctx) if task.takes_context else (payload,)
        # Not abandoned on cancel: a thread cannot be stopped, and abandoning it would
        # run more handlers at once than `concurrency` allows. Long sync handlers call
        # ctx.check_cancelled() between steps.
        return await anyio.to_thread.run_sync(task.fn, *args, limiter=self._threads)

    def _encode_result(self, claimed: ClaimedJob, task: Task[Any, Any], result: Any) -> Outcome:
        try:
            return Complete(task.output.encode(result))
        except EncodeError as exc:
            return Fail(
                self._failure(
                    claimed,
                    FailureReason.INVALID_RESULT,
                    "EncodeError",
                    f"task {task.name!r} returned a value its output model rejects: {exc}",
                    retryable=False,
                )
            )

    def _invalid_payload(
        self, claimed: ClaimedJob, task: Task[Any, Any], exc: Exception
    ) -> FailureRecord:
        fingerprint = claimed.message.fingerprint
        if fingerprint and fingerprint != task.input.fingerprint:
            return self._failure(
                claimed,
                FailureReason.SCHEMA_MISMATCH,
                "SchemaMismatch",
                f"task {task.name!r}: the producer's input schema {fingerprint} does not match "
                f"the worker's {task.input.fingerprint}, and the payload does not validate: {exc}",
                retryable=False,
            )
        return self._failure(
            claimed,
            FailureReason.INVALID_PAYLOAD,
            "ValidationError",
            f"task {task.name!r}: invalid payload: {exc}",
            retryable=False,
        )

    def _rejected(self, claimed: ClaimedJob, task: Task[Any, Any], exc: Reject) -> FailureRecord:
        error = exc.error
        if not isinstance(error, task.options.errors):
            declared = ", ".join(e.__qualname__ for e in task.options.errors) or "none"
            return self._failure(
                claimed,
                FailureReason.ERROR,
                "UndeclaredDomainError",
                f"task {task.name!r} rejected with {type(error).__qualname__}, which is not "
                f"among its declared errors ({declared}); add it to @app.task(errors=...)",
                retryable=False,
                exc=exc,
            )
        return self._failure(
            claimed,
            FailureReason.DOMAIN_ERROR,
            qualified(type(error)),
            str(exc),
            retryable=False,
            domain=error,
        )

    def _retry_or_fail(
        self,
        claimed: ClaimedJob,
        task: Task[Any, Any],
        record: FailureRecord,
        *,
        delay: float | None = None,
    ) -> Fail:
        message = claimed.message
        retries = task.options.retries if message.max_retries < 0 else message.max_retries
        failures = claimed.attempt - claimed.stalls  # stall recoveries do not spend retries
        if failures <= retries:
            return Fail(
                record,
                retry_delay=delay if delay is not None else task.options.backoff.delay(failures),
            )
        return Fail(msgspec.structs.replace(record, retryable=False))


def qualified(tp: type[Any]) -> str:
    """``module.Qualname`` of a type; builtins without the module."""
    if tp.__module__ == "builtins":
        return tp.__qualname__
    return f"{tp.__module__}.{tp.__qualname__}"
