"""Classifying what went wrong in an attempt: failure records and whether to retry.

:class:`Failures` turns each way an attempt can go wrong (a handler's exception, a
timeout, a cancel, a payload that does not validate, a result that does not encode, a
domain error) into a :class:`~typedq.errors.FailureRecord` and, with the task's retry
policy, into a :class:`~typedq.outcomes.Fail` (retry after a delay, or finally). It
never raises for what the job did: a record that cannot be built whole (an exception
whose traceback cannot be formatted, domain data that does not encode) is built with a
note in its place. Running the attempt is :mod:`typedq.execution`'s business; the
outcome types and the helpers keeping a record storable are :mod:`typedq.outcomes`'.
"""

from __future__ import annotations

import math
import traceback
from typing import TYPE_CHECKING, Any

import msgspec

from .broker.base import ClaimedJob
from .clock import SYSTEM_CLOCK, Clock
from .errors import Abort, FailureReason, FailureRecord, Reject, Retry
from .limits import RateLimited
from .outcomes import Drop, Fail, HandBack, Outcome, describe, qualified, safe_retry_delay
from .serde import codec_for

if TYPE_CHECKING:
    from .execution import CancelReason
    from .task import Task

__all__ = ["Failures", "type_name"]

_TRACEBACK_LIMIT = 8192


def type_name(exc: BaseException) -> str:
    """The qualified name of ``exc``'s type, or ``"Exception"`` if even that fails."""
    try:
        return qualified(type(exc))
    except Exception:
        return "Exception"


class Failures:
    """Builds the failure records and failed outcomes of one worker's attempts.

    :param worker_id: recorded in every failure record
    :param clock: the worker's clock, which dates every failure record
    """

    def __init__(self, worker_id: str, clock: Clock = SYSTEM_CLOCK) -> None:
        self.worker_id = worker_id
        self.clock = clock

    def record(
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
        """The failure record of ``claimed``'s attempt, with ``exc``'s traceback and the
        encoded ``domain`` error when given (a note in their place when they fail)."""
        tb = None
        if exc is not None:
            try:
                tb = _format_traceback(exc)
            except Exception as inner:  # a broken __str__, a recursion too deep to print
                tb = f"<traceback unavailable: formatting it raised {type_name(inner)}>"
        domain_type = domain_payload = None
        if domain is not None:
            try:
                domain_payload = codec_for(type(domain)).encode(domain)
                domain_type = qualified(type(domain))
            except Exception as inner:
                message = f"{message} (its data could not be stored: {describe(inner)})"
        return FailureRecord(
            reason=reason,
            error_type=error_type,
            message=message,
            attempt=claimed.attempt,
            retryable=retryable,
            traceback=tb,
            domain_type=domain_type,
            domain_payload=domain_payload,
            worker_id=self.worker_id,
            failed_at=self.clock.time(),
        )

    def timed_out(self, claimed: ClaimedJob, task: Task[Any, Any], timeout: float | None) -> Fail:
        """The attempt ran past its timeout: retried as the task's policy says."""
        return self.retry_or_fail(
            claimed,
            task,
            self.record(
                claimed,
                FailureReason.TIMEOUT,
                "TimeoutError",
                f"attempt {claimed.attempt} ran longer than its timeout of {timeout} s",
                retryable=True,
            ),
        )

    def handler_error(self, claimed: ClaimedJob, task: Task[Any, Any], exc: Exception) -> Fail:
        """The handler raised ``exc``: ``RateLimited``, ``Retry``, ``Abort``, ``Reject``
        each as documented, anything else retried as the task's policy says."""
        if isinstance(exc, RateLimited):
            # An external rate limit: back to the queue after retry_after, attempt unspent.
            record = self.record(
                claimed, FailureReason.ERROR, "RateLimited", describe(exc), retryable=True, exc=exc
            )
            return Fail(record, retry_delay=safe_retry_delay(exc.retry_after), refund=True)
        if isinstance(exc, Retry):
            record = self.record(
                claimed, FailureReason.ERROR, "Retry", describe(exc), retryable=True, exc=exc
            )
            delay = exc.delay
            if delay is not None and not _valid_delay(delay):
                return Fail(
                    _not_retried(record, f"Retry(delay={delay!r}) is not a finite number >= 0")
                )
            return self.retry_or_fail(claimed, task, record, delay=delay)
        if isinstance(exc, Abort):
            return Fail(
                self.record(
                    claimed,
                    FailureReason.ABORTED,
                    "Abort",
                    describe(exc),
                    retryable=False,
                    exc=exc,
                )
            )
        if isinstance(exc, Reject):
            return Fail(self.rejected(claimed, task, exc))
        return self.retry_or_fail(
            claimed,
            task,
            self.record(
                claimed,
                FailureReason.ERROR,
                type_name(exc),
                describe(exc),
                retryable=True,
                exc=exc,
            ),
        )

    def cancelled(self, claimed: ClaimedJob, reason: CancelReason) -> Outcome:
        """The outcome of an attempt cancelled for ``reason``: a shutdown hands the job
        back, a lost lease writes nothing, a cancel request fails it finally."""
        if reason == "shutdown":
            return HandBack()
        if reason == "lease_lost":
            return Drop()
        return Fail(
            self.record(
                claimed,
                FailureReason.CANCELLED,
                "JobCancelled",
                f"cancelled while running (attempt {claimed.attempt})",
                retryable=False,
            ),
            cancelled=True,
        )

    def invalid_result(self, claimed: ClaimedJob, task: Task[Any, Any], exc: Exception) -> Fail:
        """The handler returned a value its output model rejects (``exc``): no retries."""
        return Fail(
            self.record(
                claimed,
                FailureReason.INVALID_RESULT,
                "EncodeError",
                f"task {task.name!r} returned a value its output model rejects: {describe(exc)}",
                retryable=False,
            )
        )

    def invalid_payload(
        self,
        claimed: ClaimedJob,
        task: Task[Any, Any],
        why: str,
        *,
        exc: BaseException | None = None,
    ) -> FailureRecord:
        """The payload does not decode (``why``): a schema mismatch when the producer's
        input schema differs from the worker's, else an invalid payload."""
        fingerprint = claimed.message.fingerprint
        if fingerprint and fingerprint != task.input.fingerprint:
            return self.record(
                claimed,
                FailureReason.SCHEMA_MISMATCH,
                "SchemaMismatch",
                f"task {task.name!r}: the producer's input schema {fingerprint} does not match "
                f"the worker's {task.input.fingerprint}, and the payload does not validate: {why}",
                retryable=False,
                exc=exc,
            )
        return self.record(
            claimed,
            FailureReason.INVALID_PAYLOAD,
            "ValidationError",
            f"task {task.name!r}: invalid payload: {why}",
            retryable=False,
            exc=exc,
        )

    def rejected(self, claimed: ClaimedJob, task: Task[Any, Any], exc: Reject) -> FailureRecord:
        """The handler raised ``Reject``: a domain error when the task declares it."""
        error = exc.error
        if not isinstance(error, task.options.errors):
            declared = ", ".join(e.__qualname__ for e in task.options.errors) or "none"
            return self.record(
                claimed,
                FailureReason.ERROR,
                "UndeclaredDomainError",
                f"task {task.name!r} rejected with {type(error).__qualname__}, which is not "
                f"among its declared errors ({declared}); add it to @app.task(errors=...)",
                retryable=False,
                exc=exc,
            )
        return self.record(
            claimed,
            FailureReason.DOMAIN_ERROR,
            qualified(type(error)),
            describe(exc),
            retryable=False,
            domain=error,
        )

    def retry_or_fail(
        self,
        claimed: ClaimedJob,
        task: Task[Any, Any],
        record: FailureRecord,
        *,
        delay: float | None = None,
    ) -> Fail:
        """``record`` retried after ``delay`` (None: the task's backoff) while retries
        remain, else final."""
        message = claimed.message
        retries = task.options.retries if message.max_retries < 0 else message.max_retries
        failures = claimed.attempt - claimed.stalls  # stall recoveries do not spend retries
        if failures > retries:
            return Fail(msgspec.structs.replace(record, retryable=False))
        if delay is None:
            try:
                delay = task.options.backoff.delay(failures)
            except Exception as exc:  # an overflowing backoff, say
                return Fail(
                    _not_retried(
                        record,
                        f"its backoff could not compute retry {failures}'s delay: "
                        f"{type_name(exc)}: {describe(exc)}",
                    )
                )
            if not _valid_delay(delay):
                return Fail(
                    _not_retried(record, f"its backoff gave retry {failures} the delay {delay!r}")
                )
        return Fail(record, retry_delay=safe_retry_delay(delay))


def _format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-_TRACEBACK_LIMIT:]


def _valid_delay(delay: object) -> bool:
    return isinstance(delay, int | float) and math.isfinite(delay) and delay >= 0


def _not_retried(record: FailureRecord, why: str) -> FailureRecord:
    """A final version of ``record``: it is not retried, and the message says why."""
    return msgspec.structs.replace(
        record, retryable=False, message=f"{record.message} (not retried: {why})"
    )
