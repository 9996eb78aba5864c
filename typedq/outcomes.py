"""What one attempt of a job comes to: the outcome types the executor returns and the
settler records, and the helpers that keep a failure record storable.

:class:`~typedq.execution.Executor` turns a claimed job into an :data:`Outcome`
(wrapped in an :class:`Attempt`); :class:`~typedq.settling.Settler` records it with
the broker. Neither module needs the other: both need these.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from .broker.base import ClaimedJob
from .errors import FailureReason, FailureRecord

__all__ = [
    "MAX_RETRY_DELAY",
    "MESSAGE_LIMIT",
    "Abandon",
    "Attempt",
    "Complete",
    "Drop",
    "Fail",
    "HandBack",
    "Outcome",
    "describe",
    "minimal_failure",
    "qualified",
    "safe_retry_delay",
]

#: Longest message kept in a failure record (longer ones are cut, marked "...").
MESSAGE_LIMIT = 4096

#: The longest retry delay sent to a broker (ten years): every delay is clamped to a
#: finite number in [0, MAX_RETRY_DELAY] before it leaves the worker.
MAX_RETRY_DELAY = 10 * 365 * 86400.0


# Frozen msgspec Structs rather than frozen dataclasses: every attempt makes an outcome
# and an Attempt, and a frozen dataclass's __init__ (object.__setattr__ per field) costs
# several times more.


class Complete(msgspec.Struct, frozen=True):
    """The handler returned: the encoded result."""

    result: bytes
    #: The attempt's process span (W3C traceparent) for a traced fan-out member: its
    #: fan-in callback links to it (typedq.tracing); "" = none.
    span: str = ""


class Fail(msgspec.Struct, frozen=True):
    """The attempt failed: retry after ``retry_delay``, or finally (``None``), or cancelled."""

    record: FailureRecord
    retry_delay: float | None = None
    cancelled: bool = False
    #: Put back without spending the attempt (the handler raised RateLimited).
    refund: bool = False
    #: As :attr:`Complete.span`.
    span: str = ""


class HandBack(msgspec.Struct, frozen=True):
    """Shutdown interrupted the attempt: hand the job back unspent."""


class Drop(msgspec.Struct, frozen=True):
    """Lease lost: write nothing; the job belongs to someone else now."""


class Abandon(msgspec.Struct, frozen=True):
    """Shutdown gave up waiting for the handler's thread: write nothing, keep nothing.

    The job's lease is no longer renewed, so it comes back once the lease expires.
    """


Outcome = Complete | Fail | HandBack | Drop | Abandon


class Attempt(msgspec.Struct, frozen=True):
    """What one attempt came to: its outcome, and what the worker should count."""

    outcome: Outcome
    #: (the producer's, the worker's) input schema fingerprints, when they differ but
    #: the payload validated (the job ran).
    fingerprint_mismatch: tuple[str, str] | None = None


def describe(exc: BaseException) -> str:
    """``str(exc)``, or a stand-in when its ``__str__`` raises; bounded in length."""
    try:
        text = str(exc)
    except Exception as inner:
        try:
            text = f"<unprintable {type(exc).__qualname__}: its __str__ raised {type(inner).__qualname__}>"
        except Exception:
            text = "<unprintable exception>"
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT] + "..."


def minimal_failure(
    claimed: ClaimedJob,
    *,
    worker_id: str,
    error_type: str,
    message: str,
    failed_at: float,
    reason: FailureReason = FailureReason.ERROR,
    retryable: bool = False,
) -> FailureRecord:
    """A failure record built from plain strings only: the last resort when building a
    full record (or encoding it) failed. Strings are made encodable (lone surrogates
    escaped) and bounded."""

    def clean(text: str) -> str:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")[:MESSAGE_LIMIT]

    return FailureRecord(
        reason=reason,
        error_type=clean(error_type),
        message=clean(message),
        attempt=claimed.attempt,
        retryable=retryable,
        worker_id=worker_id,
        failed_at=failed_at,
    )


def safe_retry_delay(delay: float | None) -> float | None:
    """A retry delay a broker can store: None stays None, anything else becomes a finite
    number in [0, MAX_RETRY_DELAY] (NaN becomes 0)."""
    if delay is None:
        return None
    try:
        value = float(delay)
    except (TypeError, ValueError, OverflowError):
        return 0.0
    if math.isnan(value) or value < 0:
        return 0.0
    return min(value, MAX_RETRY_DELAY)


def qualified(tp: type[Any]) -> str:
    """``module.Qualname`` of a type; builtins without the module."""
    if tp.__module__ == "builtins":
        return tp.__qualname__
    return f"{tp.__module__}.{tp.__qualname__}"
