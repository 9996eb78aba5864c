"""A worker's graceful shutdown, in four bounded phases.

1. Grace: claiming stops; jobs claimed but not started (prefetched) go back unrun;
   in-flight jobs may finish within ``grace`` seconds.
2. Cancel: async handlers are cancelled and handed back to the queue unspent; sync
   handlers' threads cannot be stopped, so their attempts wait for them.
3. A bounded extra wait (one lease, leases still renewed) for those threads and for
   outcomes the broker has not taken yet (an outage).
4. Give up: no more waiting for threads, no more re-sends; what is left is logged and
   comes back once its lease expires.

``stop(force=True)`` skips the waits of phases 1 and 3.
"""

from __future__ import annotations

import logging

import anyio

from ..clock import Clock, move_on_after
from ..logs import job_fields
from ..outcomes import HandBack
from ..settling import Settler
from .claimer import Claimer
from .jobs import Phase, RunningJobs
from .stats import WorkerStats

__all__ = ["Shutdown"]

log = logging.getLogger("typedq.worker")

#: After giving up on threads and outcomes at shutdown, how long the last broker calls
#: in flight (hand-backs, a final re-send) may take before the worker stops regardless.
_FINAL_WAIT = 5.0


class Shutdown:
    """Stops a worker's parts in order, each wait bounded.

    :param worker_id: names the worker in log lines
    :param lease: seconds of a lease (how long phase 3 waits)
    :param jobs: the worker's table of running jobs
    :param phase: the worker's shutdown phase, which this sets
    :param claimer: the worker's claim loop (stopped first)
    :param settler: the worker's settler (told to give up in phase 4)
    :param stats: the worker's counters (logged at the end)
    :param clock: what the grace and lease waits are measured on
    """

    def __init__(
        self,
        *,
        worker_id: str,
        lease: float,
        jobs: RunningJobs,
        phase: Phase,
        claimer: Claimer,
        settler: Settler,
        stats: WorkerStats,
        clock: Clock,
    ) -> None:
        self.worker_id = worker_id
        self.lease = lease
        self.jobs = jobs
        self.phase = phase
        self.claimer = claimer
        self.settler = settler
        self.stats = stats
        self.clock = clock
        #: The wait of the phase in progress (cancelled by :meth:`force`); None: none.
        self._phase_scope: anyio.CancelScope | None = None

    def force(self) -> None:
        """Skip the waits for jobs (``stop(force=True)``), including one in progress."""
        self.phase.forced = True
        if self._phase_scope is not None:
            self._phase_scope.cancel()

    async def run(self, grace: float) -> None:
        """Stop claiming, then the four phases (see the module's docstring)."""
        jobs = self.jobs
        phase = self.phase
        phase.stopping = True
        self.claimer.interrupt()
        # Jobs claimed but not started (prefetched) go back unrun: stopping starts no job.
        await self._hand_back_queued()
        # 1. Grace: in-flight jobs may finish.
        grace_ends = self.clock.monotonic() + grace
        with anyio.CancelScope() as self._phase_scope:
            if phase.forced:
                self._phase_scope.cancel()
            with move_on_after(self.clock, grace):
                await self.claimer.done.wait()
        # A claim (or hand-off) in flight at the stop may have brought jobs since; they
        # go back at once too, not after the grace (outside its scope: a hand-back cut
        # short by the grace's end would leave its job to its lease).
        await self._hand_back_queued()
        with anyio.CancelScope() as self._phase_scope:
            if phase.forced:
                self._phase_scope.cancel()
            with move_on_after(self.clock, max(0.0, grace_ends - self.clock.monotonic())):
                await jobs.until(lambda: not jobs.running)
        # 2. Cancel: async handlers stop and are handed back; sync handlers' threads
        # cannot be stopped, so their attempts wait for them, leases still renewed.
        phase.cancelling = True
        if jobs.running:
            log.info("worker %s: grace over, cancelling %d jobs", self.worker_id, len(jobs.running))
            for running in list(jobs.running.values()):
                running.cancel("shutdown")
        # 3. A bounded extra wait for those threads and for outcomes the broker has not
        # taken yet (an outage). Threads of attempts that already ended hold no job: they
        # are not waited for (their results are discarded anyway).
        with anyio.CancelScope() as self._phase_scope:
            if phase.forced:
                self._phase_scope.cancel()
            with move_on_after(self.clock, self.lease):
                await jobs.until(lambda: not jobs.running)
        self._phase_scope = None
        # 4. Give up on the rest: no more waiting for threads, no more re-sends.
        self.settler.give_up()
        for running in list(jobs.running.values()):
            running.abandon()
        # Real time: this bounds broker calls in flight (network I/O), not the jobs.
        with anyio.move_on_after(_FINAL_WAIT):
            await jobs.until(lambda: not jobs.running)
        self._report_leftovers()

    async def _hand_back_queued(self) -> None:
        """Hand the jobs claimed but not started back to the queue at once (a runner
        takes them off the table no more), each bounded by a lease: during an outage
        one that could not be handed back comes back when its lease expires."""
        queued = list(self.jobs.queued)
        self.jobs.queued.clear()
        for claimed, running in queued:
            running.cancel("shutdown")
            try:
                with move_on_after(self.clock, self.lease):
                    await self.settler.settle(claimed, HandBack())
            except Exception as exc:
                log.warning(
                    "worker %s: could not hand back job %s (%s), claimed but not started "
                    "(%s); it comes back when its lease expires",
                    self.worker_id,
                    claimed.message.id,
                    claimed.message.task,
                    exc,
                    extra=job_fields(claimed, self.worker_id),
                )
            finally:
                self.jobs.finished(claimed, running)

    def _report_leftovers(self) -> None:
        """Log the jobs left unsettled and the threads still running."""
        for running in self.jobs.running.values():
            log.warning(
                "worker %s: stopped without settling job %s (%s) attempt %d; it comes back "
                "when its lease expires (within %.0fs)",
                self.worker_id,
                running.claimed.message.id,
                running.claimed.message.task,
                running.claimed.attempt,
                self.lease,
                extra=job_fields(running.claimed, self.worker_id),
            )
        orphans = self.jobs.orphans
        if orphans:
            log.warning(
                "worker %s: %d handler threads of ended attempts are still running (%s); "
                "they cannot be stopped and their results will be discarded",
                self.worker_id,
                len(orphans),
                ", ".join(
                    f"{r.claimed.message.id} ({r.claimed.message.task})" for r in orphans.values()
                ),
            )
