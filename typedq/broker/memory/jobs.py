"""The job table: every job the embedded broker holds, its counts per state, and versions.

A job's ``version`` changes at every move. Entries in the waiting lines and the due-time
heap carry the version they were pushed with: an entry is live only while it matches its
job's, so a job that moves on leaves a stale entry behind to be skipped (lazy deletion).
Versions come from one broker-wide counter, never restart per job: a job re-created
under the id of a removed one can never match an entry its predecessor left behind.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import msgspec

from ...errors import QueueFull
from ..base import ERROR_HISTORY, JobMessage, JobRecord, JobState

__all__ = ["Entry", "Job", "JobTable", "encode"]

#: A waiting job's place: (-priority, order, version, id); the smallest runs first.
Entry = tuple[int, int, int, str]

#: Encodes a failure record (records.broker_failure) as a job's error bytes.
encode = msgspec.msgpack.Encoder().encode

# Hot-path constants: an enum member read off its class costs an attribute lookup each time.
WAITING = JobState.WAITING
SCHEDULED = JobState.SCHEDULED
ACTIVE = JobState.ACTIVE
COMPLETED = JobState.COMPLETED
FAILED = JobState.FAILED
CANCELLED = JobState.CANCELLED


class Job(msgspec.Struct, gc=False):
    """A job as the broker holds it.

    A Struct rather than a class with ``__slots__``: built in C (a stored job costs a
    fraction of a Python ``__init__``), and ``gc=False`` keeps the stored jobs out of the
    cyclic garbage collector, whose full passes would otherwise walk every one of them
    (a job refers to nothing that refers back to it, so no cycle can go through one).
    """

    message: JobMessage
    enqueued_at: float
    order: int
    version: int = 0
    state: JobState = WAITING
    attempt: int = 0
    run_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    result: bytes | None = None
    error: bytes | None = None
    #: Every failed attempt's record, oldest first, at most ERROR_HISTORY.
    errors: tuple[bytes, ...] = ()
    progress: bytes | None = None
    stalls: int = 0
    cancel_requested: bool = False
    worker_id: str | None = None
    active_token: str | None = None
    #: The token whose finish/fail last took effect.
    done_token: str | None = None
    #: When the lease ends, on the broker clock's monotonic time.
    lease_until: float = 0.0
    #: The workflow this job belongs to, and its place: member index or step index.
    flow_id: str | None = None
    flow_member: int = -1
    flow_step: int = -1
    #: Failed with a park (a deploy's undecodable payload): its flow still waits for it.
    parked: bool = False
    #: On a flow's own job: (steps, members), for inspect after the flow ended.
    flow_shape: tuple[int, int] | None = None
    #: The concurrency slot (task, key) this job holds while active, if any.
    slot: tuple[str, str] | None = None

    def snapshot(self) -> JobRecord:
        return JobRecord(
            message=self.message,
            state=self.state,
            attempt=self.attempt,
            enqueued_at=self.enqueued_at,
            run_at=self.run_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            result=self.result,
            error=self.error,
            progress=self.progress,
            stalls=self.stalls,
            cancel_requested=self.cancel_requested,
            worker_id=self.worker_id,
            errors=self.errors,
        )

    def add_error(self, record: bytes) -> None:
        """A failed attempt's record: the job's error, and the last of its history."""
        self.error = record
        self.errors = (*self.errors, record)[-ERROR_HISTORY:]


class JobTable:
    """The jobs by id, how many of each queue are in each state, and the two counters:
    ``seq`` orders jobs within a priority level, ``versions`` stamps every move.

    Hot paths read the counters into locals and store them back once per batch.
    """

    __slots__ = ("counts", "jobs", "seq", "versions")

    def __init__(self) -> None:
        self.jobs: dict[str, Job] = {}
        self.counts: defaultdict[str, dict[JobState, int]] = defaultdict(
            lambda: dict.fromkeys(JobState, 0)
        )
        self.seq = 0
        self.versions = 0

    def next_order(self) -> int:
        """A new order, above every order given before."""
        self.seq += 1
        return self.seq

    def move(self, job: Job, state: JobState) -> None:
        """Put ``job`` in ``state``: counted there, with a new version."""
        counts = self.counts[job.message.queue]
        counts[job.state] -= 1
        counts[state] += 1
        job.state = state
        # Broker-wide, so no later incarnation of this id reuses a version (D-stale).
        self.versions += 1
        job.version = self.versions

    def check_room(self, adding: Mapping[str, int], limit: int, what: str) -> None:
        """Raise QueueFull when adding ``adding[queue]`` jobs would pass ``limit`` pending
        (waiting + scheduled) jobs in a queue; ``what`` names them (``{extra}``: how many)."""
        for queue, extra in adding.items():
            counts = self.counts[queue]
            pending = counts[JobState.WAITING] + counts[JobState.SCHEDULED]
            if pending + extra > limit:
                raise QueueFull(
                    f"queue {queue!r} holds {pending} pending jobs; "
                    f"{what.format(extra=extra)} would pass max_queue_length={limit}"
                )

    def live(self, job_id: str, version: int, state: JobState) -> Job | None:
        """The job an entry (``job_id``, ``version``) pushed for ``state`` stands for,
        or None when the entry is stale."""
        job = self.jobs.get(job_id)
        if job is not None and job.version == version and job.state is state:
            return job
        return None
