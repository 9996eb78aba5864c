"""A plain-Python reference model of the broker state machine, for the model check.

It knows one queue, no time and no bytes: only which jobs exist, their state, their
place in line, their attempt and stall counts, and which lease token may speak for
them. It encodes the contract of :mod:`typedq.broker.base` and the shared decisions
of issue 7 (D-stale, D-retry-token, D-dup-in-batch), so every broker can be compared
with it step by step (tests/redis/test_model_check.py).

Tokens are model *handles* (small integers): the driver maps each handle to the real
token a broker handed out for that claim. Delays are either 0 (waiting at once) or one
fixed length that comes due only when the test moves a fake clock past it (``advance``;
on Redis, whose clock is real, it never comes due); leases are either long (never
expire) or short (expired at the next ``expire`` step, which then recovers them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from typedq.broker.base import CancelOutcome, FinishOutcome, JobState, LeaseStatus, RetryOutcome

__all__ = ["FailMode", "ModelJob", "QueueFullError", "QueueModel", "Snapshot"]

#: How a failure asks to go on: retry now, retry far in the future, fail, cancel.
FailMode = str  # "retry" | "retry-later" | "final" | "cancelled"

#: (state, attempt, stalls, cancel_requested, priority) of one job, or None if absent.
Snapshot = tuple[JobState, int, int, bool, int] | None


class QueueFullError(Exception):
    """The model's answer for a batch refused by ``max_queue_length``."""


@dataclass
class ModelJob:
    """One job as the model holds it."""

    id: str
    priority: int
    #: Place in line among waiting jobs of the same priority (smaller goes first).
    order: int
    state: JobState
    attempt: int = 0
    stalls: int = 0
    cancel_requested: bool = False
    #: The handle of the lease that owns the job while active.
    token: int | None = None
    #: The handle whose finish (complete, fail, release) last took effect.
    done_token: int | None = None
    #: True when the current lease is short: the next ``expire`` step recovers it.
    short_lease: bool = False
    #: When scheduled: the order of scheduling (ties of run_at go by it), and whether
    #: the clock has passed its run_at (it is promoted by the next claim).
    scheduled_seq: int = 0
    due: bool = False


@dataclass
class QueueModel:
    """The expected answers and states of a broker with one queue."""

    max_stalls: int = 3
    max_queue_length: int = 0
    jobs: dict[str, ModelJob] = field(default_factory=dict)
    _seq: int = 0
    #: The last lease handle handed out (handles count up from 1).
    handles: int = 0
    _scheduled_seq: int = 0

    def _next_order(self) -> int:
        self._seq += 1
        return self._seq

    def _schedule(self, job: ModelJob) -> None:
        self._scheduled_seq += 1
        job.state = JobState.SCHEDULED
        job.scheduled_seq = self._scheduled_seq
        job.due = False

    def _pending(self) -> int:
        return sum(j.state in (JobState.WAITING, JobState.SCHEDULED) for j in self.jobs.values())

    # -- producer side ---------------------------------------------------------------

    def enqueue(self, batch: list[tuple[str, int, bool]]) -> list[bool]:
        """``batch`` of (id, priority, delayed): created flags, or QueueFullError."""
        fresh: list[tuple[str, int, bool]] = []
        seen: set[str] = set()
        for job_id, priority, delayed in batch:
            if job_id not in self.jobs and job_id not in seen:
                fresh.append((job_id, priority, delayed))
            seen.add(job_id)
        limit = self.max_queue_length
        if limit and fresh and self._pending() + len(fresh) > limit:
            raise QueueFullError
        created: set[str] = set()
        out = []
        for job_id, priority, delayed in batch:
            if job_id in created or job_id in self.jobs:
                out.append(False)
                continue
            job = self.jobs[job_id] = ModelJob(
                job_id, priority, self._next_order(), JobState.WAITING
            )
            if delayed:
                self._schedule(job)
            created.add(job_id)
            out.append(True)
        return out

    def cancel(self, job_id: str) -> CancelOutcome:
        job = self.jobs.get(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.state.is_final:
            return CancelOutcome.ALREADY_FINAL
        if job.state is JobState.ACTIVE:
            job.cancel_requested = True
            return CancelOutcome.REQUESTED
        job.state = JobState.CANCELLED
        return CancelOutcome.CANCELLED

    def retry(self, ids: list[str]) -> list[RetryOutcome]:
        out = []
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                out.append(RetryOutcome.NOT_FOUND)
            elif job.state not in (JobState.FAILED, JobState.CANCELLED):
                out.append(RetryOutcome.NOT_RETRYABLE)
            else:
                job.state = JobState.WAITING
                job.order = self._next_order()  # the tail of its level
                job.attempt = job.stalls = 0
                job.cancel_requested = False
                job.token = None
                job.done_token = None  # D-retry-token: old tokens answer LEASE_LOST
                out.append(RetryOutcome.RETRIED)
        return out

    def remove(self, ids: list[str], states: frozenset[JobState] | None) -> list[bool]:
        out = []
        for job_id in ids:
            job = self.jobs.get(job_id)
            ok = job is not None and (states is None or job.state in states)
            if ok:
                del self.jobs[job_id]
            out.append(ok)
        return out

    # -- worker side -------------------------------------------------------------------

    def advance(self) -> None:
        """The clock passed every run_at so far (delays are all equal, and shorter)."""
        for job in self.jobs.values():
            if job.state is JobState.SCHEDULED:
                job.due = True

    def claim(self, limit: int, *, short_lease: bool) -> list[tuple[str, int]]:
        """Claimed (id, handle) pairs: highest priority first, then place in line.

        Due scheduled jobs are promoted first, in run_at order, each to the tail.
        """
        due = sorted(
            (j for j in self.jobs.values() if j.state is JobState.SCHEDULED and j.due),
            key=lambda j: j.scheduled_seq,
        )
        for job in due:
            job.state = JobState.WAITING
            job.order = self._next_order()
        waiting = sorted(
            (j for j in self.jobs.values() if j.state is JobState.WAITING),
            key=lambda j: (-j.priority, j.order),
        )
        out = []
        for job in waiting[:limit]:
            self.handles += 1
            job.state = JobState.ACTIVE
            job.attempt += 1
            job.token = self.handles
            job.short_lease = short_lease
            out.append((job.id, self.handles))
        return out

    def _fenced(self, job_id: str, handle: int) -> tuple[ModelJob | None, FinishOutcome]:
        job = self.jobs.get(job_id)
        if job is None:
            return None, FinishOutcome.NOT_FOUND
        if job.state is JobState.ACTIVE and job.token == handle:
            return job, FinishOutcome.OK
        if job.done_token == handle:
            return None, FinishOutcome.ALREADY_FINISHED
        return None, FinishOutcome.LEASE_LOST

    def _final(self, job: ModelJob, state: JobState) -> None:
        job.state = state
        job.token = None

    def complete(self, job_id: str, handle: int) -> FinishOutcome:
        job, outcome = self._fenced(job_id, handle)
        if job is not None:
            job.done_token = handle
            self._final(job, JobState.COMPLETED)
        return outcome

    def fail(self, job_id: str, handle: int, mode: FailMode) -> FinishOutcome:
        job, outcome = self._fenced(job_id, handle)
        if job is None:
            return outcome
        job.done_token = handle
        if mode == "cancelled" or job.cancel_requested:
            self._final(job, JobState.CANCELLED)
        elif mode == "final":
            self._final(job, JobState.FAILED)
        else:
            job.token = None
            if mode == "retry-later":
                self._schedule(job)
            else:
                job.state = JobState.WAITING
                job.order = self._next_order()
        return outcome

    def release(self, job_id: str, handle: int) -> FinishOutcome:
        job, outcome = self._fenced(job_id, handle)
        if job is None:
            return outcome
        job.done_token = handle
        job.attempt -= 1
        if job.cancel_requested:
            self._final(job, JobState.CANCELLED)
        else:
            job.state = JobState.WAITING  # keeps its place in line
            job.token = None
        return outcome

    def renew(self, leases: list[tuple[str, int]]) -> list[LeaseStatus]:
        """Renewed leases are long from then on."""
        out = []
        for job_id, handle in leases:
            job = self.jobs.get(job_id)
            if job is None or job.state is not JobState.ACTIVE or job.token != handle:
                out.append(LeaseStatus.LOST)
                continue
            job.short_lease = False
            out.append(LeaseStatus.CANCEL_REQUESTED if job.cancel_requested else LeaseStatus.OK)
        return out

    def expire(self) -> int:
        """Every short lease has run out: recover those jobs; how many."""
        expired = [j for j in self.jobs.values() if j.state is JobState.ACTIVE and j.short_lease]
        for job in expired:
            job.stalls += 1
            job.done_token = None
            job.token = None
            if job.cancel_requested:
                job.state = JobState.CANCELLED
            elif job.stalls > self.max_stalls:
                job.state = JobState.FAILED
            else:
                job.state = JobState.WAITING  # keeps its place in line
        return len(expired)

    # -- what a broker must show ------------------------------------------------------

    def snapshot(self, job_id: str) -> Snapshot:
        job = self.jobs.get(job_id)
        if job is None:
            return None
        return (job.state, job.attempt, job.stalls, job.cancel_requested, job.priority)

    def listing(self, state: JobState) -> list[str]:
        """The ids in ``state`` as a walk of ``Broker.page_jobs`` lists them: waiting ones
        in claim order (priority, then place in line); the others sorted by id (their
        orders are times, which the model does not keep)."""
        jobs = [j for j in self.jobs.values() if j.state is state]
        if state is JobState.WAITING:
            return [j.id for j in sorted(jobs, key=lambda j: (-j.priority, j.order))]
        return sorted(j.id for j in jobs)

    def counts(self) -> dict[JobState, int]:
        out = dict.fromkeys(JobState, 0)
        for job in self.jobs.values():
            out[job.state] += 1
        return out
