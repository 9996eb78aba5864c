"""The claim loop: ask the broker for at most as many jobs as there are free slots.

Capacity first, then claim, so a claimed job starts at once. A claim whose answer was
lost is re-sent with the same id (it may have taken effect); an unreachable broker is
retried with a capped backoff, told once when the outage begins and once when it ends.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import anyio
import anyio.lowlevel

from ..broker.base import Broker, Release, new_claim_id
from ..clock import Clock
from ..errors import BrokerUnavailable
from ..observe import Observers
from ..settling import QueueRotation
from .jobs import Phase, RunningJobs

__all__ = ["Claimer"]

log = logging.getLogger("typedq.worker")


class Claimer:
    """Claims jobs for a worker's free slots until shutdown, and hands them to its table.

    :param broker: the app's broker (a callable: read when the loop starts)
    :param worker_id: names the worker in claims and log lines
    :param queues: the queues to claim from
    :param lease: seconds of lease for claimed jobs
    :param jobs: the worker's table of running jobs
    :param phase: the worker's shutdown phase (stopping ends the loop)
    :param clock: what backoffs sleep on
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        *,
        worker_id: str,
        queues: list[str],
        lease: float,
        jobs: RunningJobs,
        phase: Phase,
        clock: Clock,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = queues
        self.lease = lease
        self.jobs = jobs
        self.phase = phase
        self.clock = clock
        #: Told about failed claims (set before the worker starts; None: nobody listens).
        self.observer: Observers | None = None
        #: The wait the loop is in (cancelled by :meth:`interrupt`); None: not waiting.
        self._wait_scope: anyio.CancelScope | None = None

    @functools.cached_property
    def done(self) -> anyio.Event:
        """Set when the claim loop has ended (made at first use, in the event loop)."""
        return anyio.Event()

    def interrupt(self) -> None:
        """Cut the loop's current wait short (shutdown: it then sees ``stopping``)."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

    async def _wait(self, seconds: float | None, *, for_jobs: bool = False) -> None:
        """Sleep, for a change in running jobs, or for new jobs; cut short by shutdown."""
        with anyio.CancelScope() as scope:
            self._wait_scope = scope
            if self.phase.stopping:
                scope.cancel()
            if for_jobs:
                await self._wait_for_jobs(seconds or 5.0)
            elif seconds is not None:
                await self.clock.sleep(seconds)
            elif self.jobs.free_slots <= 0:
                await self.jobs.changed().wait()
        self._wait_scope = None

    async def _wait_for_jobs(self, seconds: float) -> None:
        """Wait for work after a claim that came up short. Jobs the broker hands over
        directly (:meth:`~typedq.broker.base.Broker.wait_for_handoff`) start at once, and
        the wait goes on for the slots left without a claim (while the broker may hand
        jobs to those slots, a claim of them could take more jobs than there are slots);
        a wait that brings no job ends, and the loop claims."""
        broker = self.broker()
        first = True
        while not self.phase.stopping:
            free = self.jobs.free_slots
            if free <= 0 and not first:
                return  # all slots taken by handed jobs (their registration is over)
            first = False
            try:
                handed = await broker.wait_for_handoff(
                    self.queues, free, seconds, worker_id=self.worker_id, lease=self.lease
                )
            except Exception as exc:
                # An outage must not end the worker: the next claim reports it.
                log.debug("worker %s: waiting for jobs failed: %s", self.worker_id, exc)
                await self.clock.sleep(min(seconds, 1.0))
                return
            if not handed:
                return
            self.jobs.start(handed)
            # The handed jobs' runners go before the wait resumes (as after a claim).
            await anyio.lowlevel.checkpoint()

    async def run(self) -> None:
        """Claim until shutdown; then hand back what a claim with a lost answer took."""
        broker = self.broker()
        jobs_table = self.jobs
        phase = self.phase
        backoff = 0.0
        # A claim whose answer was lost (id, limit): it may have taken effect, so it is
        # re-sent with the same id, which returns the jobs its first copy claimed and
        # claims nothing more. A fresh claim instead would leave those jobs claimed and
        # unrun until their lease expired (a stall without a dead worker).
        pending: tuple[str, int, list[str]] | None = None
        # Each claim starts at the next queue (fair across queues and partitions).
        rotation = QueueRotation(self.queues)
        # When claims started failing because the broker was unreachable (None: they
        # do not), so the first claim answered afterwards can say the outage is over.
        outage_since: float | None = None
        try:
            while not phase.stopping:
                if pending is None:
                    free = jobs_table.free_slots
                    if free <= 0:
                        await self._wait(None)
                        continue
                    pending = (new_claim_id(), free, rotation.next())
                claim_id, limit, queues = pending
                try:
                    jobs = await broker.claim(
                        queues, limit, worker_id=self.worker_id, lease=self.lease, claim_id=claim_id
                    )
                except Exception as exc:
                    if self.observer is not None:
                        self.observer.broker_error("claim", exc)
                    # An outage is told once when it begins (its retries at DEBUG), and
                    # once when it ends; other errors each time.
                    report = log.warning
                    if not isinstance(exc, BrokerUnavailable):
                        pending = None  # the broker answered: nothing was claimed
                    elif outage_since is None:
                        outage_since = self.clock.monotonic()
                    else:
                        report = log.debug
                    backoff = min(5.0, backoff * 2 or 0.05)
                    report(
                        "worker %s: claim failed (%s); retrying in %.2fs",
                        self.worker_id,
                        exc,
                        backoff,
                    )
                    await self._wait(backoff)
                    continue
                pending = None
                backoff = 0.0
                if outage_since is not None:
                    log.warning(
                        "worker %s: reconnected: the broker answers again after %.1fs; "
                        "claiming jobs",
                        self.worker_id,
                        self.clock.monotonic() - outage_since,
                    )
                    outage_since = None
                if not jobs:
                    await self._wait(5.0, for_jobs=True)
                    continue
                jobs_table.start(jobs)
                if len(jobs) < limit:
                    # The broker had no more due jobs when it answered: claiming again for
                    # the slots left would come back empty. Wait for work published since
                    # this claim was sent (or a scheduled job falling due) instead. The
                    # jobs just claimed start first (the checkpoint lets their runners,
                    # woken by start, go before this loop sets up its wait).
                    await anyio.lowlevel.checkpoint()
                    await self._wait(5.0, for_jobs=True)
            if pending is not None:
                await self._hand_back_lost_claim(broker, *pending)
        finally:
            try:
                # Jobs handed to this worker's wait but not taken yet go back.
                await broker.end_handoff(self.worker_id)
            except Exception as exc:
                log.warning(
                    "worker %s: could not end its direct hand-off (%s); jobs handed to it "
                    "come back when their lease expires",
                    self.worker_id,
                    exc,
                )
            finally:
                self.done.set()

    async def _hand_back_lost_claim(
        self, broker: Broker, claim_id: str, limit: int, queues: list[str]
    ) -> None:
        """At shutdown, a claim whose answer was lost may hold jobs: fetch them by
        re-sending it and hand them straight back (bounded; else they come back when
        their lease expires)."""
        # Real time: this bounds broker calls (network I/O), not a wait of the worker's.
        with anyio.move_on_after(min(self.lease, 5.0)):
            try:
                jobs = await broker.claim(
                    queues, limit, worker_id=self.worker_id, lease=self.lease, claim_id=claim_id
                )
                if jobs:
                    await broker.release([Release(j.message.id, j.token) for j in jobs])
                    log.info(
                        "worker %s: handed back %d jobs of a claim whose answer was lost",
                        self.worker_id,
                        len(jobs),
                    )
            except Exception as exc:
                log.warning(
                    "worker %s: could not hand back the jobs of a claim whose answer was lost "
                    "(%s); they come back when their lease expires",
                    self.worker_id,
                    exc,
                )
