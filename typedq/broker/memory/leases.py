"""Claims and leases: which jobs are active, whose, until when; and on which clock.

A lease measures whether a worker is alive, so it runs on the clock's monotonic time;
everything a user reads (delays, ETAs, timestamps, retention) runs on its wall time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence

from ...clock import SYSTEM_CLOCK, Clock
from ...limits import LimitSpec
from ..base import (
    CLAIM_RECORD_TTL,
    ClaimedJob,
    FinishOutcome,
    JobState,
    LeaseStatus,
    check_claim_id,
    new_claim_id,
)
from .jobs import ACTIVE, WAITING, Job, JobTable
from .limits import MICRO, Limiter
from .lines import Lines, best

__all__ = ["Leases", "WallClock", "as_clock"]


class WallClock:
    """A bare ``() -> float`` of wall time made a :class:`~typedq.clock.Clock`: its
    ``time()``; monotonic time and sleeping are the system clock's.

    So a test that moves only the wall clock (:class:`typedq.testing.FakeClock`) moves
    delays, ETAs and retention, while leases still measure real time.
    """

    __slots__ = ("wall",)

    def __init__(self, wall: Callable[[], float]) -> None:
        self.wall = wall

    def time(self) -> float:
        return self.wall()

    def monotonic(self) -> float:
        return SYSTEM_CLOCK.monotonic()

    async def sleep(self, seconds: float) -> None:
        await SYSTEM_CLOCK.sleep(seconds)

    def __repr__(self) -> str:
        return f"WallClock({self.wall!r})"


def as_clock(clock: Clock | Callable[[], float]) -> Clock:
    """``clock`` if it is a Clock, else a bare callable as a :class:`WallClock`."""
    if isinstance(clock, Clock):
        return clock
    return WallClock(clock)


class Leases:
    """The active jobs and their leases, on ``clock``'s monotonic time, and the recent
    claims by claim id (a re-sent claim answers what its first copy took)."""

    __slots__ = ("active", "claims", "clock", "limiter", "lines", "table")

    def __init__(self, clock: Clock, table: JobTable, lines: Lines, limiter: Limiter) -> None:
        self.clock = clock
        self.table = table
        self.lines = lines
        self.limiter = limiter
        #: The active jobs by id.
        self.active: dict[str, Job] = {}
        #: Recent claims by claim id: (when, job ids), oldest first.
        self.claims: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()

    def claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        lease: float,
        claim_id: str | None,
        specs: Mapping[str, LimitSpec],
    ) -> list[ClaimedJob]:
        """Take up to ``limit`` waiting jobs of ``queues``, best first, as ``worker_id``'s
        for ``lease`` seconds; ``specs``: the limits the claim enforces."""
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        record = self.record(claim_id)
        if record is not None:
            # A re-sent claim: the first copy's jobs still held under it, nothing new.
            prefix = claim_id + "."
            return [
                _claimed(job)
                for job_id in record
                if (job := self.active.get(job_id)) is not None
                and (job.active_token or "").startswith(prefix)
            ]
        clock = self.clock
        now = clock.time()
        lines = self.lines
        if lines.scheduled:
            lines.promote_due(now)
        now_us = round(now * MICRO)
        limiter = self.limiter
        if limiter.gates:
            limiter.unpark(queues, now_us, specs)
        lease_until = clock.monotonic() + lease
        # Take the best entry of the queues' lines until `limit` jobs are taken: O(1) per
        # job for one queue, O(queues) for several. A stale entry (the job moved on since
        # it was pushed) is dropped on the way, which is all that lazy deletion asks.
        open_lines = [line for queue in queues if (line := lines.waiting.get(queue))]
        table = self.table
        jobs = table.jobs
        active = self.active
        all_counts = table.counts
        version = table.versions
        claimed: list[ClaimedJob] = []
        ids: list[str] = []
        last_queue = None
        counts: dict[JobState, int] = {}
        while open_lines and len(claimed) < limit:
            line = open_lines[0] if len(open_lines) == 1 else min(open_lines, key=best)
            entry = line.pop()
            if not line.keys:  # emptied (bool(line), without a call per job)
                open_lines = [other for other in open_lines if other is not line]
            if entry is None:
                continue
            job = jobs.get(entry[3])
            if job is None or job.version != entry[2] or job.state is not WAITING:
                continue
            if specs and not limiter.admit(job, entry, now_us, specs):
                continue  # parked by its closed gate; the claim goes on with other jobs
            message = job.message
            if message.queue != last_queue:
                last_queue = message.queue
                counts = all_counts[last_queue]
            counts[WAITING] -= 1
            counts[ACTIVE] += 1
            version += 1
            job.version = version
            job.state = ACTIVE
            job.attempt += 1
            token = job.active_token = f"{claim_id}.{len(claimed) + 1}"
            job.lease_until = lease_until
            job.started_at = now
            job.worker_id = worker_id
            job_id = message.id
            active[job_id] = job
            ids.append(job_id)
            claimed.append(
                ClaimedJob(
                    message=message,
                    token=token,
                    attempt=job.attempt,
                    enqueued_at=job.enqueued_at,
                    stalls=job.stalls,
                    run_at=job.run_at,
                )
            )
        table.versions = version
        if claimed:
            # A tuple of strings: the GC stops tracking it, though it is kept a minute.
            self.claims[claim_id] = (clock.monotonic(), tuple(ids))
        return claimed

    def record(self, claim_id: str) -> tuple[str, ...] | None:
        """The job ids a claim with this id took, while it is remembered; drops the
        records older than CLAIM_RECORD_TTL (oldest first: they are kept in order)."""
        claims = self.claims
        expired = self.clock.monotonic() - CLAIM_RECORD_TTL
        while claims:
            oldest = next(iter(claims.values()))
            if oldest[0] >= expired:
                break
            claims.popitem(last=False)
        record = claims.get(claim_id)
        return None if record is None else record[1]

    def held(self, job_id: str, token: str) -> Job | None:
        """The active job ``job_id`` if ``token`` still holds it."""
        job = self.active.get(job_id)
        return job if job is not None and job.active_token == token else None

    def fenced(self, job_id: str, token: str) -> tuple[Job | None, FinishOutcome]:
        """The active job ``job_id`` if ``token`` holds it (OK), else None and why not."""
        job = self.table.jobs.get(job_id)
        if job is None:
            return None, FinishOutcome.NOT_FOUND
        if job.state is JobState.ACTIVE and job.active_token == token:
            return job, FinishOutcome.OK
        if job.done_token == token:
            return None, FinishOutcome.ALREADY_FINISHED
        return None, FinishOutcome.LEASE_LOST

    def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        """Extend the leases (id, token) still held by ``lease`` seconds from now."""
        lease_until = self.clock.monotonic() + lease
        statuses = []
        for job_id, token in leases:
            job = self.held(job_id, token)
            if job is None:
                statuses.append(LeaseStatus.LOST)
                continue
            job.lease_until = lease_until
            statuses.append(
                LeaseStatus.CANCEL_REQUESTED if job.cancel_requested else LeaseStatus.OK
            )
        return statuses

    def end(self, job: Job) -> None:
        """``job`` stops being active without finishing (a retry, a hand-back, a stall)."""
        self.active.pop(job.message.id, None)
        self.limiter.free_slot(job)
        job.active_token = None

    def left(self, job: Job) -> float:
        """Seconds until ``job``'s lease ends (negative: it has)."""
        return job.lease_until - self.clock.monotonic()

    def expired(self, holding: Collection[str], limit: int) -> list[Job]:
        """Up to ``limit`` active jobs whose lease has ended, except those whose ids are
        in ``holding`` (the caller's own, which it still runs)."""
        deadline = self.clock.monotonic()
        mine = set(holding)
        return [
            job
            for job in self.active.values()
            if job.lease_until < deadline and job.message.id not in mine
        ][:limit]


def _claimed(job: Job) -> ClaimedJob:
    """What a claim answered for active ``job`` (a re-sent claim answers it again)."""
    assert job.active_token is not None
    return ClaimedJob(
        message=job.message,
        token=job.active_token,
        attempt=job.attempt,
        enqueued_at=job.enqueued_at,
        stalls=job.stalls,
        run_at=job.run_at,
    )
