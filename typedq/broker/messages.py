"""The values the broker seam speaks: envelopes, claims, settles, outcomes, snapshots.

:class:`~typedq.broker.base.Broker` takes and answers these; so does every backend, and
the runtime above it builds and reads them. They are plain frozen ``msgspec`` structs
and enums, with no behaviour beyond a derived value or two, so a backend can store them
as they are (the Redis broker encodes them with :mod:`typedq.broker.redis.codec`).

In order: the constants a backend honours, claim ids, the job's states and envelope,
what a claim hands out and a settle sends back, the answers of the fenced transitions
and of ``cancel`` / ``retry``, a job's snapshot and a queue's counts; then the values of
the capabilities: schedules (typedq.schedule), throughput history and the worker
registry (observability), and event streams (typedq.events). The broker-wide settings
are in :mod:`typedq.broker.settings`.
"""

from __future__ import annotations

import secrets
from enum import IntEnum, StrEnum

import msgspec

__all__ = [
    "CLAIM_RECORD_TTL",
    "ERROR_HISTORY",
    "HISTORY_MINUTES",
    "MAX_SPAN_LINKS",
    "CancelOutcome",
    "ClaimedJob",
    "Completion",
    "EnqueueOutcome",
    "EventRead",
    "Failure",
    "FireOutcome",
    "FinishOutcome",
    "JobList",
    "JobMessage",
    "JobRecord",
    "JobState",
    "LeaseStatus",
    "MinuteRollup",
    "QueueEvent",
    "QueueStats",
    "Release",
    "RetryOutcome",
    "ScheduleState",
    "TickFiring",
    "WorkerInfo",
    "check_claim_id",
    "new_claim_id",
]

#: Seconds a broker remembers a claim by its id (longer than any client's retries).
CLAIM_RECORD_TTL = 60.0


#: How many attempts' FailureRecords a job keeps (``JobRecord.errors``), newest last.
ERROR_HISTORY = 10

#: How many members a fan-in callback's span links to, the first by index (the
#: OpenTelemetry SDK's default limit of links per span; MAX_SPAN_LINKS, generated into the Lua by broker/redis/constants.py).
MAX_SPAN_LINKS = 128

#: How many minutes of throughput rollups a broker keeps per queue (24 hours).
HISTORY_MINUTES = 1440


def new_claim_id() -> str:
    """A fresh claim id: 16 random hex digits."""
    return secrets.token_hex(8)


_HEX_DIGITS = frozenset("0123456789abcdef")


def check_claim_id(claim_id: str) -> str:
    """Return ``claim_id`` if it is 8 to 64 lowercase hex digits, else raise ValueError."""
    # A set test, not a generator over the characters: it runs once per claim call.
    if not (8 <= len(claim_id) <= 64 and set(claim_id) <= _HEX_DIGITS):
        raise ValueError(f"claim id {claim_id!r} must be 8 to 64 lowercase hex digits")
    return claim_id


# -- jobs: the core store ---------------------------------------------------------


class JobState(StrEnum):
    """Where a job is in its life."""

    WAITING = "waiting"
    SCHEDULED = "scheduled"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """True for completed, failed and cancelled."""
        return self in _FINAL


_FINAL = frozenset({JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


class JobMessage(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The envelope: everything a worker needs to run a job, as the producer made it.

    ``payload`` is the encoded input model; the broker never looks inside it.
    """

    id: str
    task: str
    queue: str
    payload: bytes
    #: Fingerprint of the producer's view of the task's input schema.
    fingerprint: str = ""
    #: Higher runs first among waiting jobs of a queue.
    priority: int = 0
    #: Absolute run time (broker clock, epoch seconds); 0 = now, unless ``delay`` > 0.
    eta: float = 0.0
    #: Seconds after enqueue (broker clock); ignored when ``eta`` is set.
    delay: float = 0.0
    #: Retries allowed after the first attempt; ``-1`` means "the task's default".
    max_retries: int = -1
    #: Per-attempt timeout in seconds; ``-1`` means "the task's default", 0 none.
    timeout: float = -1.0
    #: The rate-limit bucket of the job within its task (``""``: the task-wide one);
    #: computed by the producer from ``RateLimit(key=...)`` (see typedq.limits).
    rate_key: str = ""
    #: The concurrency-limit bucket of the job within its task (``""``: task-wide).
    concurrency_key: str = ""
    #: The tick (epoch seconds) of the schedule that enqueued this job; 0 = not scheduled.
    scheduled_for: float = 0.0
    #: The producer's trace context (typedq.tracing): the propagator's carrier as
    #: ``key=value`` lines (W3C ``traceparent``/``tracestate`` by default); "" = none.
    trace_context: str = ""
    #: A fan-in callback's links to its members' process spans: their W3C
    #: ``traceparent`` values, comma-separated, in member order (at most
    #: :data:`MAX_SPAN_LINKS`); set by the broker at the fan-in, when the callback
    #: carries a trace context and its members' attempts were traced. "" = none.
    trace_links: str = ""


class ClaimedJob(msgspec.Struct, frozen=True, kw_only=True):
    """A job handed to a worker under a lease."""

    message: JobMessage
    token: str
    #: 1 for the first run, bumped by every claim (retries and stall recoveries).
    attempt: int
    enqueued_at: float
    #: How often the job's lease has expired so far.
    stalls: int = 0
    #: When the job became claimable this time (broker clock, epoch seconds), when it
    #: was not its enqueue: a retry's due time, a hand-back or stall recovery, a
    #: workflow hand-off, a scheduled job's due time; 0.0 = since its enqueue, or the
    #: time its own ``eta``/``delay`` named (see :meth:`due_at`).
    run_at: float = 0.0

    def due_at(self) -> float:
        """When this attempt's wait for a worker began (its queue wait counts from it)."""
        if self.run_at > 0:
            return self.run_at
        message = self.message
        if message.eta > 0:
            return max(self.enqueued_at, message.eta)
        return self.enqueued_at + message.delay


class JobList(msgspec.Struct, frozen=True):
    """One page of :meth:`Broker.page_jobs`: ``ids`` in the state's order, and the
    ``cursor`` that continues after them (None when the state has no more jobs)."""

    ids: list[str]
    cursor: str | None


class EnqueueOutcome(msgspec.Struct, frozen=True):
    """``created`` is False when a job with that id already existed (deduplicated)."""

    id: str
    created: bool


class Completion(msgspec.Struct, frozen=True):
    """A successful attempt: the encoded result."""

    id: str
    token: str
    result: bytes
    #: The attempt's process span (W3C ``traceparent``), for a traced fan-out member:
    #: its fan-in callback's span links to it (:attr:`JobMessage.trace_links`). "" = none.
    span: str = ""


class Failure(msgspec.Struct, frozen=True, kw_only=True):
    """A failed attempt: the encoded FailureRecord, and whether to run it again.

    ``retry_delay`` is None for a final failure; otherwise the job is scheduled again
    after that many seconds (0 = waiting at once). ``cancelled`` ends the job in the
    ``cancelled`` state instead of ``failed``. ``refund`` (with a ``retry_delay``) gives
    the attempt back: the next run has the same attempt number (a handler that raised
    :class:`~typedq.limits.RateLimited`).
    """

    id: str
    token: str
    error: bytes
    retry_delay: float | None = None
    cancelled: bool = False
    refund: bool = False
    #: As :attr:`Completion.span` (a collecting fan-in links to failed members too).
    span: str = ""


class Release(msgspec.Struct, frozen=True):
    """Hand a claimed job back unrun (worker shutdown): waiting again, attempt not spent."""

    id: str
    token: str


class FinishOutcome(IntEnum):
    """The answer to a fenced transition (complete, fail, release)."""

    OK = 0
    #: The same token already finished this job: a re-sent request; nothing changed.
    ALREADY_FINISHED = 1
    #: The job belongs to another lease (expired and reclaimed) or is not active.
    LEASE_LOST = 2
    #: No such job (never existed or removed by retention).
    NOT_FOUND = 3


class LeaseStatus(IntEnum):
    """The answer to ``renew`` for one lease."""

    OK = 0
    #: The token is no longer the job's own: stop the handler, write nothing.
    LOST = 1
    #: ``cancel()`` was asked for this running job: cancel the handler.
    CANCEL_REQUESTED = 2


class CancelOutcome(StrEnum):
    """The answer to ``cancel``."""

    CANCELLED = "cancelled"  # was waiting or scheduled: now cancelled
    REQUESTED = "requested"  # is running: its worker was asked to cancel it
    ALREADY_FINAL = "already_final"  # had already completed, failed or been cancelled
    NOT_FOUND = "not_found"


class RetryOutcome(StrEnum):
    """The answer to ``retry`` for one job."""

    RETRIED = "retried"  # was failed or cancelled: waiting again, with a fresh attempt count
    NOT_RETRYABLE = "not_retryable"  # is waiting, scheduled, active or completed: unchanged
    NOT_FOUND = "not_found"
    #: A workflow's job that cannot run again on its own (unchanged): a fan-out member,
    #: a step that never ran, or a job of a flow that is running; re-enqueue the flow.
    #: (The step of an ended flow that failed or was cancelled is retried, and resumes
    #: its flow: see typedq.broker.flow.)
    IN_FLOW = "in_flow"


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one job as the broker holds it."""

    message: JobMessage
    state: JobState
    attempt: int
    enqueued_at: float
    #: When the job becomes claimable (scheduled jobs), or became so last (kept once due:
    #: a delayed job's due time, a retry's, a hand-back's or stall recovery's, a workflow
    #: step's hand-off); 0 for a job claimable since its enqueue.
    run_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    #: Encoded result (completed) or FailureRecord (failed / cancelled / last retried error).
    result: bytes | None = None
    error: bytes | None = None
    progress: bytes | None = None
    stalls: int = 0
    cancel_requested: bool = False
    worker_id: str | None = None
    #: Every failed attempt's encoded FailureRecord, oldest first, the last
    #: :data:`ERROR_HISTORY` of them (kept across ``retry``). A job stored before the
    #: history existed has only its ``error`` here.
    errors: tuple[bytes, ...] = ()


class QueueStats(msgspec.Struct, frozen=True, kw_only=True):
    """A queue at a glance (``queue_stats``): jobs per state, and how long the job that
    has waited longest has been waiting."""

    queue: str
    counts: dict[JobState, int]
    #: Seconds (broker clock) the longest-waiting claimable job has waited: since it
    #: became due (its enqueue, its eta or delay, a retry's due time, a hand-back or
    #: stall recovery, a workflow hand-off), also for a due scheduled job not yet moved
    #: to waiting. 0 when nothing waits.
    oldest_waiting: float = 0.0
    #: Finished jobs that retention (:class:`Retention`) has deleted from this queue,
    #: per final state, since the queue's first job: they are gone for good.
    trimmed: dict[JobState, int] = msgspec.field(default_factory=dict)


# -- schedules (capability Schedules) ---------------------------------------------


class ScheduleState(msgspec.Struct, frozen=True, kw_only=True):
    """What the broker keeps of one schedule (bounded: one record per declared schedule).

    Times are integer microseconds of the broker's clock.
    """

    name: str
    #: The hash of the definition this state belongs to.
    digest: str
    #: The newest tick handled (fired or skipped); at a (re)start, the broker's now.
    last_tick_us: int
    #: The job of the newest fired tick ("" before the first).
    last_job: str = ""
    #: When (broker clock) the newest tick was fired; 0 = never.
    last_fired_us: int = 0
    fired: int = 0
    skipped: int = 0


class FireOutcome(StrEnum):
    """The answer to one :class:`TickFiring`."""

    #: The jobs were enqueued (if any) and the state moved to ``new_last_us``.
    FIRED = "fired"
    #: The state no longer held ``expected_last_us`` / ``digest`` (another worker fired
    #: these ticks, or another definition reset it): nothing changed.
    STALE = "stale"
    #: overlap="skip" and the previous tick's job is unfinished: the ticks are counted
    #: as skipped and the state moved on.
    OVERLAP_SKIPPED = "overlap_skipped"
    #: overlap="queue" and the previous tick's job is unfinished: nothing changed.
    HELD = "held"
    #: The queue is at max_queue_length: the ticks are counted as skipped, state moved on.
    FULL = "full"


class TickFiring(msgspec.Struct, frozen=True, kw_only=True):
    """Fire some ticks of a schedule, atomically, if its state is still as read.

    The broker checks the state's digest and ``last_tick_us`` against ``digest`` and
    ``expected_last_us`` (compare and set), applies the overlap policy against the job
    of the newest fired tick, enqueues ``messages`` (deterministic ids: an existing id
    is not replaced) and records ``new_last_us``, all in one step.
    """

    name: str
    digest: str
    expected_last_us: int
    new_last_us: int
    messages: list[JobMessage]
    #: Due ticks the scheduler's policies dropped (added to the skipped count).
    skipped: int = 0
    overlap: str = "allow"
    #: The queue of the schedule's tick jobs (every tick of a schedule goes to one):
    #: where Redis Cluster fires it, atomically. "" = the messages' queue.
    queue: str = ""


# -- observability (capability Observability) -------------------------------------


class MinuteRollup(msgspec.Struct, frozen=True):
    """What one queue did in one minute (``Broker.history``), by the broker's clock."""

    #: The minute's start, epoch seconds (a multiple of 60).
    minute: int
    #: Jobs that completed, failed for good, and failed an attempt and were retried.
    completed: int = 0
    failed: int = 0
    retried: int = 0


class WorkerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A live worker as the broker's worker registry holds it (``typedq inspect --workers``)."""

    id: str
    host: str
    pid: int
    queues: list[str]
    concurrency: int
    #: Jobs it ran at its last heartbeat.
    in_flight: int
    #: When it started and when it last reported (epoch seconds, the worker's clock).
    started_at: float
    heartbeat_at: float
    #: The typedq version it runs.
    version: str


# -- event streams (capability EventStreams) --------------------------------------


class QueueEvent(msgspec.Struct, frozen=True, kw_only=True):
    """One job of a queue reached a final state (typedq.events), as the broker wrote it.

    :ivar seq: the event's number in its queue's stream (1, 2, ...; never reused)
    :ivar id: the job's id
    :ivar task: the job's task
    :ivar state: completed, failed or cancelled
    :ivar data: the encoded result (completed) or FailureRecord (failed, cancelled);
        ``b""`` when the job has none
    :ivar attempt: the attempt that ended it (0: none ran)
    """

    seq: int
    id: str
    task: str
    state: JobState
    data: bytes = b""
    attempt: int = 0


class EventRead(msgspec.Struct, frozen=True, kw_only=True):
    """What one read of a queue's event stream found.

    :ivar events: the events after the position asked for, oldest first
    :ivar missed: events after that position that the stream no longer holds (it is
        capped: a reader fell behind by more than the cap); they come before ``events``
    """

    events: list[QueueEvent]
    missed: int = 0
