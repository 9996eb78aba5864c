"""Unique windows and debounce (capability FlowControl): the reference rules.

A keyed enqueue names a marker ``<task>|<key>`` within its job's queue (the Redis
broker keeps it under the queue's hash tag, ``lua/enqueue_controlled.lua``):

- **unique** (``unique_for``): the marker names the job that holds the key. It holds it
  while it exists and is not final (waiting, scheduled, active, between retries), and,
  when it COMPLETED, for ``unique_for`` seconds after it finished, even if retention
  deleted the job sooner. A job that FAILED for good or was CANCELLED frees the key at
  once (the caller wants it to run again, as with Sidekiq's ``until_executed`` and
  BullMQ's deduplication). A marker whose job is gone before it finished (an operator
  removed or purged it) is stale: the next enqueue replaces it.
- **debounce** (``wait``, ``max_wait``): the marker names the job that collects the
  key's enqueues while it is scheduled and not due yet; each takes the new payload and
  pushes the run time to ``min(now + wait, enqueued_at + max_wait)``. Once due (or
  claimed, or gone), the next enqueue makes a new job.

Every rule reads the broker's clock once per call; the job path pays one truthiness
check per finished job (:meth:`Control.finished` runs only while some job is tracked).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from ..base import EnqueueControl, EnqueueOutcome, JobMessage, JobState
from .jobs import COMPLETED, SCHEDULED

if TYPE_CHECKING:
    from .core import JobPath

__all__ = ["Control"]


class Control:
    """The markers of unique and debounced keys, and the jobs that hold them."""

    __slots__ = ("debounced", "path", "sweep_at", "tracked", "unique")

    def __init__(self, path: JobPath) -> None:
        self.path = path
        #: Unique marker -> (job id, until): ``until`` is +inf while the job has not
        #: finished (see the module docstring), its finish + window once it completed.
        self.unique: dict[str, tuple[str, float]] = {}
        #: Debounce marker -> the id of the job collecting the key's enqueues.
        self.debounced: dict[str, str] = {}
        #: Job id -> (marker, window; 0.0 for a debounced job) of the jobs holding a
        #: marker, until they finish.
        self.tracked: dict[str, tuple[str, float]] = {}
        #: How many unique markers trigger the next sweep of ended windows (doubles).
        self.sweep_at = 1024

    def enqueue(self, message: JobMessage, control: EnqueueControl) -> EnqueueOutcome:
        """Store ``message`` under ``control`` (see the module docstring), atomically.

        :raises QueueFull: a new job would pass ``max_queue_length`` (nothing stored)
        """
        marker = f"{message.task}|{control.key}"
        now = self.path.clock.time()
        jobs = self.path.table.jobs
        if control.wait > 0:
            # A debounced job runs `wait` after its last enqueue: its envelope says so.
            message = msgspec.structs.replace(message, eta=0.0, delay=control.wait)
            held_id = self.debounced.get(marker)
            job = jobs.get(held_id) if held_id is not None else None
            # Replaced only while scheduled, never claimed yet (a retry waiting out its
            # backoff is scheduled too) and not due.
            if job is not None and job.state is SCHEDULED and job.attempt == 0 and job.run_at > now:
                run_at = min(now + control.wait, job.enqueued_at + control.max_wait)
                job.message = msgspec.structs.replace(
                    message, id=job.message.id, queue=job.message.queue
                )
                self.path.lines.to_scheduled(job, run_at)
                return EnqueueOutcome(job.message.id, False)
            (outcome,) = self.path._enqueue([message])
            if outcome.created:
                if held_id is not None:
                    self.tracked.pop(held_id, None)
                self.debounced[marker] = outcome.id
                self.tracked[outcome.id] = (marker, 0.0)
            return outcome
        held = self.unique.get(marker)
        if held is not None:
            held_id, until = held
            job = jobs.get(held_id)
            if job is not None and not job.state.is_final:
                return EnqueueOutcome(held_id, False)
            if until != math.inf and now < until:
                return EnqueueOutcome(held_id, False)
            # Expired, or stale (its job is gone without finishing): replaced below.
        if len(self.unique) >= self.sweep_at:
            self.expire(now)
            self.sweep_at = max(1024, 2 * len(self.unique))
        (outcome,) = self.path._enqueue([message])
        if outcome.created:
            if held is not None:
                self.tracked.pop(held[0], None)
            self.unique[marker] = (outcome.id, math.inf)
            self.tracked[outcome.id] = (marker, control.unique_for)
        return outcome

    def finished(self, job_id: str, state: JobState, now: float) -> None:
        """Job ``job_id`` reached final ``state`` at ``now``: its unique key is held for
        its window (completed) or freed (failed, cancelled); its debounce key is freed."""
        entry = self.tracked.pop(job_id, None)
        if entry is None:
            return
        marker, window = entry
        if window > 0:
            if self.unique.get(marker, ("", 0.0))[0] != job_id:
                return
            if state is COMPLETED:
                self.unique[marker] = (job_id, now + window)
            else:
                del self.unique[marker]
        elif self.debounced.get(marker) == job_id:
            del self.debounced[marker]

    def expire(self, now: float) -> None:
        """Forget unique markers whose window ended (memory stays bounded by the live ones)."""
        ended = [m for m, (_, until) in self.unique.items() if until <= now]
        for marker in ended:
            del self.unique[marker]
