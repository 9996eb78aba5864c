"""The lease keeper: renews the leases of a worker's jobs, recovers stalled jobs, and
listens for cancel requests.

Every running job's lease is renewed in one call, every third of the lease. A lease
reported lost cancels the handler and its result is never written; a cancel request
(``job.cancel()``) cancels it and records ``cancelled``. Sync handlers run in threads,
which cannot be killed: their lease is renewed for as long as any code of the attempt
can still run (only a lease the broker reports lost stops renewal).

The reaper recovers jobs whose lease expired (their worker died), never this worker's
own: it renews first, and recovers nothing while its own renewals fail.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..broker.base import Broker, LeaseStatus
from ..clock import Clock
from ..observe import Observers
from .jobs import RunningJobs

__all__ = ["LeaseKeeper"]

log = logging.getLogger("typedq.worker")


class LeaseKeeper:
    """Keeps a worker's leases: renewal, the reaper of stalled jobs, cancel requests.

    :param broker: the app's broker (a callable: read at each call)
    :param worker_id: names the worker in log lines
    :param lease: seconds of lease a renewal grants
    :param jobs: the worker's table of running jobs
    :param clock: what the loops sleep on and renewals are timed by
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        *,
        worker_id: str,
        lease: float,
        jobs: RunningJobs,
        clock: Clock,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.lease = lease
        self.jobs = jobs
        self.clock = clock
        #: Seconds between renewals (and the cancel listener's longest wait).
        self.renew_interval = lease / 3
        #: Seconds between recoveries of stalled jobs.
        self.reaper_interval = min(lease / 2, 5.0)
        #: Told about broker errors and recoveries (set before the worker starts).
        self.observer: Observers | None = None
        #: When the leases were last known renewed (monotonic, on ``clock``).
        self._renewed_at = clock.monotonic()
        # A renewal failed and none has succeeded since (its failures are told once).
        self._renew_failing = False

    async def renew_loop(self) -> None:
        """Renew every third of a lease; warn when the event loop was blocked so long
        that renewals were missed."""
        clock = self.clock
        while True:
            before = clock.monotonic()
            await clock.sleep(self.renew_interval)
            lag = clock.monotonic() - before - self.renew_interval
            if lag > self.renew_interval:
                log.warning(
                    "worker %s: event loop blocked for %.1fs; lease renewals missed "
                    "(a handler blocks the loop: make it a sync `def` or await in it)",
                    self.worker_id,
                    lag,
                )
            await self.renew()

    async def renew(self) -> bool:
        """Renew the leases of every attempt whose code may still run or whose outcome is
        not recorded yet, in one call; act on lost leases and cancels.

        Only the broker saying a lease is lost stops its renewal: a cancelled or shut
        down attempt whose sync thread still runs keeps its lease, so nobody else starts
        the job meanwhile. Returns False when the broker could not be asked.
        """
        running = [r for r in self.jobs.running.values() if not r.lost]
        if not running:
            self._renewed_at = self.clock.monotonic()
            return True
        sent = self.clock.monotonic()
        try:
            statuses = await self.broker().renew(
                [(r.claimed.message.id, r.claimed.token) for r in running], self.lease
            )
        except Exception as exc:
            if self.observer is not None:
                self.observer.broker_error("renew", exc)
            # Once per outage (the claim loop tells when it ends); each time at DEBUG.
            (log.debug if self._renew_failing else log.warning)(
                "worker %s: lease renewal failed: %s", self.worker_id, exc
            )
            self._renew_failing = True
            if self.clock.monotonic() - self._renewed_at > self.lease:
                # Our leases may have expired by now and another worker may hold these
                # jobs: stop the async handlers (they can be stopped). Threads cannot be,
                # and outcomes waiting to be recorded are fenced by their token: those
                # keep trying, and keep asking for their leases.
                for holder in running:
                    if holder.in_handler:
                        holder.cancel("lease_lost")
            return False
        self._renewed_at = max(self._renewed_at, sent)
        self._renew_failing = False
        for holder, status in zip(running, statuses, strict=True):
            if status is LeaseStatus.LOST:
                holder.mark_lost()
            elif status is LeaseStatus.CANCEL_REQUESTED:
                holder.cancel("cancel")
        return True

    async def reaper_loop(self) -> None:
        """Recover stalled jobs (others' expired leases) every ``reaper_interval``."""
        while True:
            # Renew our own leases first: after the loop was blocked, this worker must
            # not recover (and run a second time) jobs that it is itself still running.
            if not await self.renew():
                # Our own leases are not renewed: recovering now could take (and run a
                # second time) jobs this worker holds but could not renew in an outage.
                await self.clock.sleep(self.reaper_interval)
                continue
            try:
                # Never our own running jobs, even if our renewal was late (the loop
                # was blocked, or this process not scheduled in time): recovering them
                # would run them a second time here. A live view, read when the call
                # is sent: a job claimed while this call waited (its handler may then
                # block the loop past its lease) is left alone too.
                recovered = await self.broker().recover_stalled(holding=self.jobs.by_job.keys())
            except Exception as exc:
                if self.observer is not None:
                    self.observer.broker_error("recover", exc)
                log.warning("worker %s: stalled-job recovery failed: %s", self.worker_id, exc)
            else:
                if recovered and self.observer is not None:
                    self.observer.stalled_recovered(recovered)
                if recovered:
                    log.warning(
                        "worker %s: recovered %d jobs whose lease expired",
                        self.worker_id,
                        recovered,
                    )
            await self.clock.sleep(self.reaper_interval)

    async def cancel_loop(self) -> None:
        """Cancel the running jobs whose cancel was requested, as soon as it is."""
        broker = self.broker()
        jobs = self.jobs
        while True:
            try:
                # The broker's own wait (woken by a request), bounded by its own clock.
                await broker.wait_cancel_requests(self.renew_interval)
                ids = {
                    r.claimed.message.id for r in jobs.running.values() if r.cancel_reason is None
                }
                if ids:
                    for job_id in await broker.cancel_requests(sorted(ids)):
                        for holder in jobs.holders(job_id):
                            holder.cancel("cancel")
            except Exception as exc:
                log.warning("worker %s: cancel listener failed: %s", self.worker_id, exc)
                await self.clock.sleep(self.renew_interval)
