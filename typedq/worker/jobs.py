"""The table of jobs a worker holds, and how far its shutdown has gone.

:class:`RunningJobs` is the one place that knows which attempts run, which handler
threads outlive their attempt, and how many slots are free; it hands claimed jobs to
the runners and wakes whoever waits for a change (the claim loop for a free slot,
shutdown for no job left). :class:`Phase` is what shutdown tells the other parts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from ..broker.base import ClaimedJob
from ..execution import Running
from ..logs import job_fields
from .stats import WorkerStats

__all__ = ["Phase", "RunningJobs"]

log = logging.getLogger("typedq.worker")


@dataclass
class Phase:
    """How far a worker's shutdown has gone: set by its shutdown, read by every part."""

    #: Shutdown began: no more claims, and every change in running jobs is told.
    stopping: bool = False
    #: The grace period is over and running jobs were cancelled: a claim that was in
    #: flight meanwhile is cancelled (handed back) as it arrives.
    cancelling: bool = False
    #: ``stop(force=True)``: no waiting for jobs at all.
    forced: bool = False


class RunningJobs:
    """The attempts a worker runs, by claim token and by job id, and the slots they take.

    :param concurrency: how many slots the worker has
    :param worker_id: names the worker in log lines
    :param stats: the worker's counters (claimed, orphaned threads)
    :param phase: the worker's shutdown phase
    """

    def __init__(
        self, concurrency: int, *, worker_id: str, stats: WorkerStats, phase: Phase
    ) -> None:
        self.concurrency = concurrency
        self.worker_id = worker_id
        self.stats = stats
        self.phase = phase
        #: Running jobs by claim token (one job id may briefly have two claims: a retry
        #: claimed again before the previous attempt finished cleaning up).
        self.running: dict[str, Running] = {}
        #: The attempts in ``running`` by job id (normally one; more when a lease was
        #: lost and the broker handed the job back to this worker).
        self.by_job: dict[str, list[Running]] = {}
        #: Attempts already settled whose handler thread still runs (timed out, lease
        #: lost): each holds a slot until its thread returns.
        self.orphans: dict[str, Running] = {}
        #: Claimed jobs on their way to the runners. Never longer than a few: at most
        #: `concurrency` jobs run, and a refill claims only for slots its completions
        #: free (their runners take the new jobs next).
        self.queued: deque[tuple[ClaimedJob, Running]] = deque()
        #: What wakes each runner waiting for a job (a plain deque and events: an anyio
        #: memory stream costs several times more per blocked receive).
        self.idle: list[anyio.Event | asyncio.Future[None]] = []
        #: Set when a job leaves ``running`` or a thread returns, made only while someone
        #: waits for that (the claim loop for a free slot, shutdown for no jobs left):
        #: a finishing job then costs nothing when nobody waits.
        self._changed: anyio.Event | None = None

    @property
    def free_slots(self) -> int:
        """``concurrency`` minus running jobs minus threads of ended attempts."""
        return self.concurrency - len(self.running) - len(self.orphans)

    def in_flight(self) -> list[tuple[str, str]]:
        """``(job id, task name)`` of each job still held: running, or its outcome not
        yet recorded."""
        return [(r.claimed.message.id, r.claimed.message.task) for r in self.running.values()]

    def holders(self, job_id: str) -> list[Running]:
        """The attempts of ``job_id`` this worker runs (a copy)."""
        return list(self.by_job.get(job_id, ()))

    def start(self, jobs: Sequence[ClaimedJob]) -> None:
        """Hand newly claimed jobs to the runners."""
        self.stats.claimed += len(jobs)
        by_job = self.by_job
        for claimed in jobs:
            # The broker handed us a job this worker still runs under an older claim:
            # that claim's lease was lost (the loop was blocked, say).
            job_id = claimed.message.id
            running = self.running[claimed.token] = Running(claimed)
            holders = by_job.get(job_id)
            if holders is None:
                by_job[job_id] = [running]  # the usual case: one list made, full
            else:
                for stale in holders:
                    stale.mark_lost()
                holders.append(running)
            if self.phase.cancelling:
                # A claim that was in flight when shutdown cancelled the rest: hand back.
                running.cancel("shutdown")
            self.queued.append((claimed, running))
            while self.idle:
                wake = self.idle.pop()
                if not isinstance(wake, asyncio.Future):
                    wake.set()
                    break
                if not wake.done():  # done: its runner was cancelled (shutdown)
                    wake.set_result(None)
                    break

    def finished(self, claimed: ClaimedJob, running: Running) -> None:
        """An attempt is over (settled or not): free its slot, unless its handler's
        thread still runs."""
        job_id = claimed.message.id
        del self.running[claimed.token]
        holders = self.by_job[job_id]
        if len(holders) == 1:  # the usual case: this attempt alone (no remove's search)
            del self.by_job[job_id]
        else:
            holders.remove(running)
        if running.thread_alive:
            # The attempt is over but its thread is not: keep its slot taken.
            self.orphans[claimed.token] = running
            self.stats.orphaned_threads += 1
            log.warning(
                "worker %s: job %s (%s) attempt %d: its attempt ended but its sync "
                "handler's thread still runs (threads cannot be stopped); it holds a slot "
                "until it returns, and its result will be discarded",
                self.worker_id,
                job_id,
                claimed.message.task,
                claimed.attempt,
                extra=job_fields(claimed, self.worker_id),
            )
        if self._changed is not None:  # someone waits (notify's first test, inline: per job)
            self.notify()

    def thread_exited(self, running: Running) -> None:
        """A handler thread returned (in the event loop): free its slot if it held one."""
        if self.orphans.pop(running.claimed.token, None) is not None:
            log.info(
                "worker %s: the thread of job %s (%s) attempt %d returned after its attempt "
                "ended; its result was discarded",
                self.worker_id,
                running.claimed.message.id,
                running.claimed.message.task,
                running.claimed.attempt,
                extra=job_fields(running.claimed, self.worker_id),
            )
        self.notify()

    async def until(self, done: Callable[[], bool]) -> None:
        """Wait until ``done()`` holds, looking again at each change."""
        while not done():
            await self.changed().wait()

    def changed(self) -> anyio.Event:
        """An event set at the next change worth telling (see :meth:`notify`)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def notify(self) -> None:
        """Wake whoever waits for a change in running jobs, if it may be the one it
        waits for: a free slot (the claim loop) or any change while stopping."""
        changed = self._changed
        # free_slots, inline: this runs per job while the claim loop waits for a slot.
        if changed is not None and (
            self.phase.stopping or self.concurrency - len(self.running) - len(self.orphans) > 0
        ):
            self._changed = None
            changed.set()
