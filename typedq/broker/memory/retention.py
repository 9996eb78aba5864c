"""Finished jobs and their retention: how many of each final state are kept, how long.

Finished jobs are kept per final state in finishing order, so the oldest go first when a
state passes its count bound (``Retention.*_max``) or its age bound (``*_ttl``).

A parked job (failed with a deploy's undecodable payload, its flow waiting for an
operator retry) is failed like any other and goes with the failed bound; its flow then
fails (``on_parked_trimmed``), or it would wait for a job that no longer exists (the
Redis twin: ``trim`` in redis/lua/common/bookkeeping.lua).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable

from ..base import BrokerSettings, JobState
from .jobs import COMPLETED, Job, JobTable

__all__ = ["Finished"]


class Finished:
    """The finished jobs' ids per final state (id -> when it finished), oldest first,
    and how many of each queue and state retention deleted (QueueStats.trimmed)."""

    __slots__ = ("_orphans", "by_state", "on_parked_trimmed", "settings", "table", "trimmed")

    def __init__(self, table: JobTable, settings: BrokerSettings) -> None:
        self.table = table
        self.settings = settings
        self.by_state: dict[JobState, OrderedDict[str, float]] = {
            state: OrderedDict()
            for state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
        }
        self.trimmed: dict[str, dict[JobState, int]] = {}
        #: Called with each parked job retention deleted (and the time), once the trim
        #: that deleted it is done: its flow ends (set by the broker).
        self.on_parked_trimmed: Callable[[Job, float], None] | None = None
        #: Parked jobs deleted and not yet handed to ``on_parked_trimmed``; None while
        #: none is being handed (a flow's end finalises jobs, and trims again: those
        #: wait here rather than recurse).
        self._orphans: deque[Job] | None = None

    def trim(self, state: JobState, now: float) -> None:
        """Drop the oldest finished jobs of ``state`` past its count or age bound."""
        retention = self.settings.retention
        if state is COMPLETED:
            ttl, cap = retention.completed_ttl, retention.completed_max
        else:
            ttl, cap = retention.failed_ttl, retention.failed_max
        finished = self.by_state[state]
        jobs = self.table.jobs
        # Jobs deleted per queue, counted once per queue after the loops (a trim runs
        # per completed batch, deleting about a job per job completed).
        gone: dict[str, int] = {}
        # Past the count bound: the oldest go, without looking at their age.
        parked: list[Job] = []
        for _ in range(len(finished) - cap):
            job = jobs.pop(finished.popitem(last=False)[0])
            queue = job.message.queue
            gone[queue] = gone.get(queue, 0) + 1
            if job.parked:
                parked.append(job)
        expired = now - ttl
        while finished:
            job_id, finished_at = next(iter(finished.items()))
            if finished_at > expired:
                break
            del finished[job_id]
            job = jobs.pop(job_id)
            queue = job.message.queue
            gone[queue] = gone.get(queue, 0) + 1
            if job.parked:
                parked.append(job)
        if gone:
            all_counts, trimmed = self.table.counts, self.trimmed
            for queue, count in gone.items():
                all_counts[queue][state] -= count
                counted = trimmed.setdefault(queue, {})
                counted[state] = counted.get(state, 0) + count
        if parked:
            self._parked_gone(parked, now)

    def _parked_gone(self, parked: list[Job], now: float) -> None:
        """Hand the parked jobs a trim deleted to ``on_parked_trimmed``, one at a time:
        a flow's end that trims again adds to the list the outer call is draining."""
        if self._orphans is not None:
            self._orphans.extend(parked)
            return
        self._orphans = deque(parked)
        try:
            while self._orphans:
                job = self._orphans.popleft()
                job.parked = False
                if self.on_parked_trimmed is not None:
                    self.on_parked_trimmed(job, now)
        finally:
            self._orphans = None

    def trim_all(self, now: float) -> None:
        """Apply every final state's bounds (the age bounds pass with time alone)."""
        for state in self.by_state:
            self.trim(state, now)
