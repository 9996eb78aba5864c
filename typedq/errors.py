"""Every exception typedq raises, and the failure record a failed job carries.

The tree::

    TypedqError
    ├── ConfigError             bad App/Worker/broker configuration
    │   ├── InvalidName         a queue, task, app or job name outside the key grammar
    │   └── InvalidOption       a task or enqueue option outside its range (NaN, inf, ...)
    ├── NotConnected            the App was used outside ``async with app``
    ├── JobNotFound             no job with that id (never enqueued, or retention removed it)
    ├── PayloadError
    │   ├── EncodeError         a payload or result could not be serialized
    │   ├── InvalidPayload      bytes that do not validate against the declared model
    │   └── PayloadTooLarge     a payload over the size limit (checked before any I/O)
    ├── BrokerError             the broker misbehaved or is out of reach
    │   ├── BrokerUnavailable   could not reach it within the bounded time
    │   ├── BrokerDataError     bytes in the broker that typedq cannot read
    │   ├── QueueFull           the queue is at its max_queue_length
    │   ├── RedisDataLost       Redis lost its data (restart without persistence, flush)
    │   └── Unsupported         the broker lacks a capability (also a NotImplementedError)
    ├── PartialEnqueue          ``enqueue_many`` stored some chunks, others were refused
    ├── JobFailed               what ``Job.result()`` raises for a failed job
    │   └── JobCancelled        ... for a cancelled job
    └── ResultTimeout           ``Job.result(timeout=...)`` ran out (also a TimeoutError)

Handlers raise these to steer the runtime (they are not errors of typedq's):

    Retry       retry this job, optionally after ``delay`` seconds
    Abort       fail permanently now, without using the retries left
    Reject      fail permanently with a declared domain error model (typed data)

This module depends on nothing else in typedq.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

if TYPE_CHECKING:  # annotations only: this module imports nothing of typedq at run time
    from .broker.base import EnqueueOutcome, JobMessage
    from .job import Job

__all__ = [
    "Abort",
    "BrokerDataError",
    "BrokerError",
    "BrokerUnavailable",
    "ConfigError",
    "EncodeError",
    "FailureReason",
    "FailureRecord",
    "InvalidName",
    "InvalidOption",
    "InvalidPayload",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "NotConnected",
    "PartialEnqueue",
    "PayloadError",
    "PayloadTooLarge",
    "QueueFull",
    "RedisDataLost",
    "Reject",
    "ResultTimeout",
    "Retry",
    "StreamInterrupted",
    "StreamRestarted",
    "StreamTruncated",
    "TypedqError",
    "Unsupported",
]

_E = TypeVar("_E")


class TypedqError(Exception):
    """Base of every exception typedq raises."""


class ConfigError(TypedqError, ValueError):
    """The App, a task, a worker or a broker URL is configured wrongly."""


class InvalidName(ConfigError):
    """A name that becomes part of a broker key breaks the name grammar."""


class InvalidOption(ConfigError):
    """A task option or a per-enqueue option is outside its allowed range.

    Raised before anything is sent: ``delay=nan``, ``eta=inf``, ``priority=2**64``,
    ``retries=-1``, ``timeout=0``... The message names the option, the value and the
    allowed range.
    """


class NotConnected(TypedqError, RuntimeError):
    """The App's broker is not connected."""


class JobNotFound(TypedqError, LookupError):
    """No job has that id: it was never enqueued, was purged, or retention removed it."""


class PayloadError(TypedqError, ValueError):
    """A payload or result could not cross the queue."""


class EncodeError(PayloadError):
    """A value could not be serialized (NaN, an unsupported type, ...)."""


class InvalidPayload(PayloadError):
    """Bytes that do not decode into, or validate against, the declared model."""


class PayloadTooLarge(PayloadError):
    """An encoded payload is over the configured size limit."""

    def __init__(self, size: int, limit: int, what: str = "payload") -> None:
        super().__init__(
            f"{what} is {size} bytes, over the limit of {limit} bytes; pass an id or a "
            "reference to stored data instead, or raise App(max_payload_bytes=...)"
        )
        self.size = size
        self.limit = limit


class BrokerError(TypedqError):
    """The broker failed; the message says which operation."""


class BrokerUnavailable(BrokerError, ConnectionError):
    """The broker could not be reached within the bounded time."""


class BrokerDataError(BrokerError):
    """The broker holds bytes that are not a typedq record."""


class QueueFull(BrokerError):
    """An enqueue would take a queue past its ``max_queue_length``; nothing was enqueued."""


class RedisDataLost(BrokerError):
    """Redis lost the app's data: its epoch key vanished or changed since it was seen.

    A restart without persistence, a FLUSHALL or a failover to an empty replica; the
    jobs, results and failure records stored before it are gone.
    """


class Unsupported(BrokerError, NotImplementedError):
    """The broker cannot do that: it lacks the capability (schedules, workflows, task
    limits, a worker registry, event streams, operator actions: see
    :mod:`typedq.broker.capabilities`).

    Raised when an app that declares a feature connects to a broker without it (one line
    naming the broker, the capability and what needs it), and by a broker's method for a
    capability it does not implement.

    It is also a :class:`NotImplementedError` for one release, so code that caught the
    NotImplementedError the registry, history and event methods raised before keeps
    working; catch Unsupported instead.
    """


class PartialEnqueue(TypedqError):
    """``enqueue_many`` stored some of its chunks and not others: exactly which is known.

    Jobs are sent in chunks, in input order, each chunk stored atomically (all or
    nothing); a refused chunk (QueueFull, a broker error) does not stop the chunks after
    it. The exception is chained (``__cause__``) to the first refusal. When no chunk at
    all was stored, ``enqueue_many`` raises that refusal itself instead.

    Job ids are fixed before anything is sent, so re-sending :attr:`unsent` (e.g.
    ``await app.client.enqueue_many(exc.unsent)``) is safe: a job that was in fact stored
    (its chunk's answer was lost with the connection) is not stored twice, it answers
    ``created=False``.

    :ivar messages: every input envelope, in input order
    :ivar outcomes: per input, its outcome if stored, else ``None``
    :ivar stored: the input indexes that were stored (or deduplicated onto an existing job)
    :ivar not_stored: the input indexes that were not (refused, or their fate is unknown)
    :ivar errors: the refusals, one per refused chunk, in order
    :ivar jobs: the :class:`~typedq.Job` handles of the stored inputs, in input order
        (filled by ``Task.enqueue_many``; empty when raised by ``Client.enqueue_many``)
    """

    def __init__(
        self,
        messages: Sequence[JobMessage],
        outcomes: Sequence[EnqueueOutcome | None],
        errors: Sequence[Exception],
    ) -> None:
        self.messages = list(messages)
        self.outcomes = list(outcomes)
        self.stored = [i for i, o in enumerate(self.outcomes) if o is not None]
        self.not_stored = [i for i, o in enumerate(self.outcomes) if o is None]
        self.errors = list(errors)
        self.jobs: list[Job[Any]] = []
        first = self.errors[0] if self.errors else None
        super().__init__(
            f"enqueue_many stored {len(self.stored)} of {len(self.messages)} jobs; "
            f"{len(self.not_stored)} were not stored ({len(self.errors)} chunk(s) refused, "
            f"first: {type(first).__name__}: {first}). Their ids are fixed: re-send "
            "`exc.unsent` to store them without duplicates"
        )

    @property
    def unsent(self) -> list[JobMessage]:
        """The envelopes that were not stored, in input order (same ids: safe to re-send)."""
        return [self.messages[i] for i in self.not_stored]


class ResultTimeout(TypedqError, TimeoutError):
    """``Job.result(timeout=...)`` ran out before the job reached a final state."""


class StreamInterrupted(TypedqError):
    """A job's stream (``job.stream()``) did not go on from the last item it gave: the
    iterator stays usable, iterate it again to read on (docs/streams.md)."""


class StreamRestarted(StreamInterrupted):
    """The job was retried while its stream was read: the items after this are those
    of attempt :attr:`attempt`, from its first (drop what the earlier attempt gave)."""

    def __init__(self, job_id: str, task: str, attempt: int) -> None:
        super().__init__(
            f"job {job_id} ({task}) started again (attempt {attempt}) while its stream was "
            "read: its items start over; iterate the stream again to read them"
        )
        self.job_id = job_id
        self.attempt = attempt


class StreamTruncated(StreamInterrupted):
    """The reader fell so far behind that the stream (capped at
    :data:`~typedq.broker.streams.STREAM_MAX` items per job) dropped :attr:`missed`
    items it had not read; it goes on with the oldest item kept."""

    def __init__(self, job_id: str, task: str, missed: int) -> None:
        super().__init__(
            f"job {job_id} ({task}): {missed} items of its stream were dropped before they "
            "were read (a stream keeps its last 10,000); iterate the stream again to read "
            "on from the oldest kept"
        )
        self.job_id = job_id
        self.missed = missed


class FailureReason(StrEnum):
    """Why a job attempt failed. Stored with every failure record."""

    ERROR = "error"  # the handler raised an ordinary exception
    TIMEOUT = "timeout"  # the per-job timeout ran out
    ABORTED = "aborted"  # the handler raised Abort: permanent
    DOMAIN_ERROR = "domain_error"  # the handler raised Reject with a declared model
    INVALID_PAYLOAD = "invalid_payload"  # the payload did not validate against the input model
    SCHEMA_MISMATCH = "schema_mismatch"  # ... and the producer's schema fingerprint differs
    UNKNOWN_TASK = "unknown_task"  # no handler is registered under the job's task name
    INVALID_RESULT = "invalid_result"  # the handler returned something its output model rejects
    STALLED = "stalled"  # the job's lease expired too many times (worker lost)
    CANCELLED = "cancelled"  # job.cancel() was called
    DECODE_ERROR = "decode_error"  # the broker held bytes that are not a job envelope
    FLOW_BROKEN = "flow_broken"  # a job of its workflow was removed before it finished


class FailureRecord(msgspec.Struct, frozen=True, kw_only=True):
    """The structured record of a failed attempt; the final one is kept with the job."""

    reason: FailureReason
    error_type: str
    message: str
    attempt: int
    retryable: bool
    traceback: str | None = None
    #: For ``reason == domain_error``: the declared model's qualified name and its encoded data.
    domain_type: str | None = None
    domain_payload: bytes | None = None
    worker_id: str | None = None
    failed_at: float = 0.0


class JobFailed(TypedqError):
    """The job ended in the ``failed`` state; ``record`` says why.

    ``error`` is the decoded domain error model when the handler raised
    :class:`Reject` with one of the task's declared ``errors=``, else ``None``.
    """

    def __init__(self, job_id: str, task: str, record: FailureRecord, error: Any = None) -> None:
        super().__init__(
            f"job {job_id} of task {task!r} failed ({record.reason.value}) on attempt "
            f"{record.attempt}: {record.error_type}: {record.message}"
        )
        self.job_id = job_id
        self.task = task
        self.record = record
        self.error: Any = error

    @property
    def reason(self) -> FailureReason:
        """Shorthand for ``record.reason``."""
        return self.record.reason

    def domain_error(self, error_type: type[_E]) -> _E | None:
        """The domain error as ``error_type`` if it is one, else ``None``.

        :param error_type: one of the models the task declared in ``errors=``
        """
        return self.error if isinstance(self.error, error_type) else None


class JobCancelled(JobFailed):
    """The job was cancelled before it completed."""


class Retry(Exception):
    """Raise from a handler to retry the job.

    :param delay: seconds to wait before the next attempt; ``None`` uses the task's backoff
    :param message: recorded with the attempt
    """

    def __init__(self, delay: float | None = None, message: str = "retry requested") -> None:
        super().__init__(message)
        if delay is not None and delay < 0:
            raise ValueError(f"Retry(delay=...) must be >= 0, got {delay}")
        self.delay = delay


class Abort(Exception):
    """Raise from a handler to fail the job permanently, without spending retries."""


class Reject(Exception):
    """Raise from a handler to fail permanently with a declared domain error model.

    The model must be an instance of one of the task's ``errors=(...)`` types; it is
    stored as data and reaches the producer as ``JobFailed.error``.
    """

    def __init__(self, error: Any) -> None:
        super().__init__(f"{type(error).__qualname__}: {error!r}")
        self.error = error
