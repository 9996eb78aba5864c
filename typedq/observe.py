"""Watching a worker: the events it reports, for metrics and other observers.

A :class:`WorkerObserver` subscribes to one or more workers (``worker.observe(obs)``)
and is told what happens: a job started, a job's attempt ended with a
:class:`JobOutcome` and a duration, a producer's schema fingerprint differed, a
broker call failed, stalled jobs were recovered. :class:`typedq.metrics.Metrics` is
one; a user's own (a StatsD client, say) is another.

Observers are called in the worker's event loop, synchronously: they must be quick
and must not block (no I/O). An observer that raises is logged once and its error
is otherwise ignored: it never breaks the worker. A worker with no observer pays one
``is None`` test per event.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from .broker.base import ClaimedJob
from .outcomes import Abandon, Complete, Drop, Fail, HandBack, Outcome

if TYPE_CHECKING:
    from .worker import Worker

__all__ = ["JobOutcome", "WorkerObserver", "outcome_of"]

log = logging.getLogger("typedq.worker")


class JobOutcome(StrEnum):
    """How one attempt of a job ended, as a worker saw it (the ``outcome`` label)."""

    #: The handler returned; the result was recorded.
    COMPLETED = "completed"
    #: The attempt failed and no retry is left (or the error is not retryable).
    FAILED = "failed"
    #: The attempt failed and a retry was scheduled.
    RETRIED = "retried"
    #: ``job.cancel()`` stopped it while it ran.
    CANCELLED = "cancelled"
    #: Shutdown handed it back to the queue unspent.
    RELEASED = "released"
    #: Its lease was lost (the worker was too slow to renew it, or the broker recovered
    #: it as stalled); its result was discarded.
    LEASE_LOST = "lease_lost"
    #: Shutdown gave up waiting for its sync handler's thread; it comes back when its
    #: lease expires.
    ABANDONED = "abandoned"


def outcome_of(outcome: Outcome) -> JobOutcome:
    """The :class:`JobOutcome` of an executor outcome."""
    if isinstance(outcome, Complete):
        return JobOutcome.COMPLETED
    if isinstance(outcome, Fail):
        if outcome.cancelled:
            return JobOutcome.CANCELLED
        return JobOutcome.FAILED if outcome.retry_delay is None else JobOutcome.RETRIED
    if isinstance(outcome, HandBack):
        return JobOutcome.RELEASED
    if isinstance(outcome, Drop):
        return JobOutcome.LEASE_LOST
    assert isinstance(outcome, Abandon)
    return JobOutcome.ABANDONED


class WorkerObserver:
    """What a worker reports; override the methods you need (each does nothing here).

    Called in the worker's event loop: be quick, do no I/O, do not block.
    """

    def worker_started(self, worker: Worker[Any, Any]) -> None:
        """``worker`` started (its broker is connected; called in its event loop)."""

    def worker_stopped(self, worker: Worker[Any, Any]) -> None:
        """``worker`` finished its shutdown."""

    def job_started(self, job: ClaimedJob) -> None:
        """An attempt of ``job`` starts (the worker just claimed it)."""

    def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
        """The attempt of ``job`` ended with ``outcome`` after ``duration`` seconds (from
        its start to its outcome; recording the outcome with the broker not included)."""

    def schema_mismatch(self, job: ClaimedJob) -> None:
        """``job``'s producer had another schema fingerprint for its task's input (its
        payload validated, so it ran)."""

    def lease_lost(self, job: ClaimedJob) -> None:
        """The worker lost ``job``'s lease: while it ran, or when the broker refused
        its outcome because another lease owns the job now."""

    def broker_error(self, operation: str, error: BaseException) -> None:
        """A broker call failed: ``operation`` is ``claim``, ``renew``, ``recover``,
        ``settle`` or ``heartbeat`` (the worker retries each)."""

    def stalled_recovered(self, count: int) -> None:
        """This worker's reaper put ``count`` jobs whose lease had expired back."""


class Observers(WorkerObserver):
    """Several observers as one; an observer that raises is logged once and skipped.

    The per-job methods are written out (no dispatch by name): they run twice per job.
    """

    def __init__(self, observers: Sequence[WorkerObserver] = ()) -> None:
        self.observers = list(observers)
        self._complained: set[int] = set()

    def _failed(self, observer: WorkerObserver, method: str) -> None:
        if id(observer) not in self._complained:
            self._complained.add(id(observer))
            log.exception(
                "observer %r raised in %s (logged once; its errors are ignored)", observer, method
            )

    def job_started(self, job: ClaimedJob) -> None:
        for observer in self.observers:
            try:
                observer.job_started(job)
            except Exception:
                self._failed(observer, "job_started")

    def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
        for observer in self.observers:
            try:
                observer.job_finished(job, outcome, duration)
            except Exception:
                self._failed(observer, "job_finished")

    def _each(self, method: str, *args: Any) -> None:
        for observer in self.observers:
            try:
                getattr(observer, method)(*args)
            except Exception:
                self._failed(observer, method)

    def worker_started(self, worker: Worker[Any, Any]) -> None:
        self._each("worker_started", worker)

    def worker_stopped(self, worker: Worker[Any, Any]) -> None:
        self._each("worker_stopped", worker)

    def schema_mismatch(self, job: ClaimedJob) -> None:
        self._each("schema_mismatch", job)

    def lease_lost(self, job: ClaimedJob) -> None:
        self._each("lease_lost", job)

    def broker_error(self, operation: str, error: BaseException) -> None:
        self._each("broker_error", operation, error)

    def stalled_recovered(self, count: int) -> None:
        self._each("stalled_recovered", count)
