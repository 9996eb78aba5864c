"""Job handles: what ``enqueue`` returns, typed by the task's output model."""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Generic, cast

import anyio
import msgspec
import pydantic
from typing_extensions import TypeVar

from .broker.base import Broker, CancelOutcome, JobRecord, JobState
from .errors import (
    BrokerDataError,
    BrokerUnavailable,
    ConfigError,
    FailureReason,
    FailureRecord,
    JobCancelled,
    JobFailed,
    JobNotFound,
    ResultTimeout,
)
from .serde import Codec, codec_for
from .streams import POLL, JobStream

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Job", "JobInfo", "JobStatus", "StreamJob"]

TOut = TypeVar("TOut")
#: What the job's task emits (``@app.task(emits=Token)``: ``StreamJob[Out, Token]``,
#: whose ``stream()`` yields ``Token``).
TEmit_co = TypeVar("TEmit_co", bound=msgspec.Struct | pydantic.BaseModel, covariant=True)

#: The status of a job: ``waiting``, ``scheduled``, ``active``, ``completed``, ``failed``,
#: ``cancelled``.
JobStatus = JobState

log = logging.getLogger("typedq.job")

#: Backoff between looks at an unreachable broker while waiting for a result: it starts
#: at the first and doubles up to the second (seconds), never past the caller's timeout.
OUTAGE_BACKOFF = (0.1, 2.0)
#: Seconds a look at the broker may run past the caller's timeout before it is abandoned.
_LOOK_GRACE = 1.0

_record_decoder = msgspec.msgpack.Decoder(FailureRecord)
_any_decoder = msgspec.msgpack.Decoder()


class JobInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A readable snapshot of a job (``Job.info()``)."""

    id: str
    task: str
    queue: str
    status: JobStatus
    attempt: int
    priority: int
    enqueued_at: float
    run_at: float
    started_at: float
    finished_at: float
    progress: Any
    error: FailureRecord | None
    stalls: int


def decode_failure(data: bytes | None, job_id: str) -> FailureRecord:
    """Decode a stored FailureRecord; raise BrokerDataError naming the job if it is garbage."""
    if data is None:
        raise BrokerDataError(f"job {job_id} is failed but has no error record")
    try:
        return _record_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BrokerDataError(f"job {job_id}: unreadable error record: {exc}") from None


class Job(Generic[TOut]):
    """A handle on one enqueued job (of an emitting task: :class:`StreamJob`).

    :ivar id: the job id
    :ivar task: the task name
    :ivar created: False when an enqueue was deduplicated onto an existing job
    :ivar queue: the job's queue when known (the task's): the broker looks for the job
        only there (a job id is unique per queue); None looks in every queue
    """

    __slots__ = ("_client", "_emits", "_errors", "_out", "created", "id", "queue", "task")

    def __init__(
        self,
        client: Client,
        job_id: str,
        task: str,
        output: Codec[TOut],
        errors: tuple[type[Any], ...] = (),
        *,
        created: bool = True,
        queue: str | None = None,
        emits: Codec[Any] | None = None,
    ) -> None:
        self._client = client
        self._emits = emits
        self.queue = queue
        self.id = job_id
        self.task = task
        self._out = output
        self._errors = errors
        self.created = created

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, task={self.task!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Job) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def _record(self) -> JobRecord:
        broker = self._client.broker
        (record,) = await broker.get([self.id], queue=self.queue)
        if record is None:
            raise JobNotFound(await self._missing(broker))
        return record

    async def _missing(self, broker: Broker) -> str:
        """Why the job is not in the broker, as far as the broker can tell."""
        gone = f"job {self.id} of task {self.task!r} is not in the broker"
        trimmed = ""
        if self.queue is not None:
            (stats,) = await broker.queue_stats([self.queue])
            trimmed = ", ".join(f"{n} {s.value}" for s, n in stats.trimmed.items() if n)
        if not trimmed:
            return f"{gone}: it was never enqueued there, or was purged or removed"
        r = broker.settings.retention
        return (
            f"{gone}: most likely trimmed by result retention, which has deleted {trimmed} "
            f"finished jobs of queue {self.queue!r} (keeping at most {r.completed_max} "
            f"completed for {r.completed_ttl:g} s and {r.failed_max} failed for "
            f"{r.failed_ttl:g} s), or it was purged or removed; read results before "
            "retention drops them, or raise App(retention=Retention(...))"
        )

    async def status(self) -> JobStatus:
        """The job's current state; raises JobNotFound if it is gone."""
        return (await self._record()).state

    async def info(self) -> JobInfo:
        """A full snapshot: status, attempts, timestamps, progress and last error."""
        record = await self._record()
        return JobInfo(
            id=self.id,
            task=record.message.task,
            queue=record.message.queue,
            status=record.state,
            attempt=record.attempt,
            priority=record.message.priority,
            enqueued_at=record.enqueued_at,
            run_at=record.run_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
            progress=_any_decoder.decode(record.progress) if record.progress else None,
            error=decode_failure(record.error, self.id) if record.error else None,
            stalls=record.stalls,
        )

    async def result(self, timeout: float | None = None) -> TOut:
        """Wait for the job to finish and return its result, validated as the output model.

        An outage of the broker shorter than ``timeout`` is ridden out: the wait looks
        again with a bounded backoff (0.1 s doubling to 2 s), logging one warning when
        the broker becomes unreachable and one when it answers again. Time is the event
        loop's clock (:func:`anyio.current_time`).

        :param timeout: seconds to wait; ``None`` waits as long as it takes (through
            outages of any length)
        :raises JobFailed: the job failed (``JobCancelled`` if it was cancelled)
        :raises ResultTimeout: ``timeout`` ran out first (a ``TimeoutError``)
        :raises BrokerUnavailable: ``timeout`` ran out while the broker was unreachable
            (the message says for how long it was tried)
        :raises JobNotFound: there is no such job
        """
        started = anyio.current_time()
        deadline = math.inf if timeout is None else started + max(0.0, timeout)
        delay = OUTAGE_BACKOFF[0]
        outage: BrokerUnavailable | None = None  # the error that began the current outage
        outage_since = 0.0
        while True:
            left = None if timeout is None else max(0.0, deadline - anyio.current_time())
            try:
                # Bounded even when a look hangs (a broker that does not refuse but never
                # answers): at most a little past the caller's timeout.
                with anyio.fail_after(None if left is None else left + _LOOK_GRACE):
                    record = await self._client.broker.wait_finished(
                        self.id, left, queue=self.queue
                    )
                    current = await self._record() if record is None else None
            except BrokerUnavailable as exc:
                now = anyio.current_time()
                if outage is None:
                    outage, outage_since = exc, now
                    log.warning(
                        "job %s (%s): the broker is unreachable while waiting for the result "
                        "(%s); retrying %s",
                        self.id,
                        self.task,
                        exc,
                        "until it answers" if timeout is None else f"for up to {timeout} s",
                    )
                if now >= deadline:
                    raise self._gave_up(exc, now - started, timeout) from exc
                await anyio.sleep(min(delay, deadline - now))
                delay = min(OUTAGE_BACKOFF[1], delay * 2)
                continue
            except TimeoutError:
                # The deadline passed during a look that had not answered yet.
                if outage is not None:
                    raise self._gave_up(outage, anyio.current_time() - started, timeout) from None
                raise ResultTimeout(
                    f"job {self.id} of task {self.task!r} has not finished after {timeout} s"
                ) from None
            if outage is not None:
                log.warning(
                    "job %s (%s): the broker answers again after %.1f s; still waiting for "
                    "the result",
                    self.id,
                    self.task,
                    anyio.current_time() - outage_since,
                )
                outage = None
                delay = OUTAGE_BACKOFF[0]
            if record is not None:
                return self._outcome(record)
            assert current is not None
            if current.state.is_final:
                # It finished after the wait's last look, before this read (the wait's
                # time ran out first): the outcome, not "still cancelled after 5 s".
                return self._outcome(current)
            if anyio.current_time() >= deadline:
                raise ResultTimeout(
                    f"job {self.id} of task {self.task!r} is still {current.state.value} after "
                    f"{timeout} s"
                )
            # Not finished and time left: the wait ended early (it followed an outage).

    def _gave_up(self, exc: BrokerUnavailable, tried: float, timeout: float | None) -> Exception:
        return BrokerUnavailable(
            f"{exc} (waited {tried:.1f} s for job {self.id} of task {self.task!r}, through "
            f"the result's timeout of {timeout} s; the job itself may still finish: call "
            "result() again)"
        )

    def _outcome(self, record: JobRecord) -> TOut:
        if record.state is JobState.COMPLETED:
            if record.result is None:
                raise BrokerDataError(f"job {self.id} is completed but has no result")
            return self._out.decode(record.result)
        failure = decode_failure(record.error, self.id)
        if record.state is JobState.CANCELLED or failure.reason is FailureReason.CANCELLED:
            raise JobCancelled(self.id, self.task, failure)
        raise JobFailed(self.id, self.task, failure, self._domain_error(failure))

    def _domain_error(self, failure: FailureRecord) -> Any:
        if failure.domain_type is None or failure.domain_payload is None:
            return None
        for error_type in self._errors:
            if f"{error_type.__module__}.{error_type.__qualname__}" == failure.domain_type:
                return codec_for(error_type).decode(failure.domain_payload)
        return None

    async def cancel(self) -> bool:
        """Cancel the job: a waiting one is removed, a running one has its handler cancelled.

        :return: False when the job had already finished (or does not exist)
        """
        outcome = await self._client.broker.cancel(self.id, queue=self.queue)
        return outcome in (CancelOutcome.CANCELLED, CancelOutcome.REQUESTED)


class StreamJob(Job[TOut], Generic[TOut, TEmit_co]):
    """A handle on a job of a task that emits ``TEmit_co`` (``@app.task(emits=...)``):
    a :class:`Job` with :meth:`stream`."""

    __slots__ = ()

    def stream(self, *, poll: float = POLL) -> JobStream[TEmit_co]:
        """The items the job emits (``ctx.emit``), in order, as they come: an async
        iterator that ends once the job is final (a finished job's stream replays, while
        it is kept: as long as the job's record). It holds the items of the job's current
        attempt: a retry starts it over (:class:`~typedq.errors.StreamRestarted`). See
        docs/streams.md.

        :param poll: seconds between looks at the job's state while the stream is quiet
            (the end normally comes as an entry of the stream; the looks end the stream
            of a job whose worker died or that was cancelled before it ran)
        :raises ConfigError: the job's task declares no ``emits=``, or ``poll`` is not > 0
        :raises JobNotFound: (iterating) there is no such job
        :raises StreamRestarted, StreamTruncated: (iterating) see docs/streams.md
        """
        if self._emits is None:
            raise ConfigError(
                f"task {self.task!r} declares no stream: job.stream() needs a task "
                "registered with @app.task(emits=Model)"
            )
        # Checked as a number: callers mypy does not check may pass anything.
        if not (isinstance(cast(object, poll), int | float) and 0 < poll < math.inf):
            raise ConfigError(
                f"job.stream(poll={poll!r}): poll must be a number of seconds > 0 (how "
                "often a quiet stream looks at the job's state)"
            )
        return JobStream(self, self._emits, poll=poll)
