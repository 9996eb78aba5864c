"""Finished jobs and their retention: how many of each final state are kept, how long.

Finished jobs are kept per final state in finishing order, so the oldest go first when a
state passes its count bound (``Retention.*_max``) or its age bound (``*_ttl``).
"""

from __future__ import annotations

from collections import OrderedDict

from ..base import BrokerSettings, JobState
from .jobs import COMPLETED, JobTable

__all__ = ["Finished"]


class Finished:
    """The finished jobs' ids per final state (id -> when it finished), oldest first,
    and how many of each queue and state retention deleted (QueueStats.trimmed)."""

    __slots__ = ("by_state", "settings", "table", "trimmed")

    def __init__(self, table: JobTable, settings: BrokerSettings) -> None:
        self.table = table
        self.settings = settings
        self.by_state: dict[JobState, OrderedDict[str, float]] = {
            state: OrderedDict()
            for state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
        }
        self.trimmed: dict[str, dict[JobState, int]] = {}

    def trim(self, state: JobState, now: float) -> None:
        """Drop the oldest finished jobs of ``state`` past its count or age bound."""
        retention = self.settings.retention
        if state is COMPLETED:
            ttl, cap = retention.completed_ttl, retention.completed_max
        else:
            ttl, cap = retention.failed_ttl, retention.failed_max
        finished = self.by_state[state]
        jobs = self.table.jobs
        all_counts, trimmed = self.table.counts, self.trimmed
        # Past the count bound: the oldest go, without looking at their age.
        for _ in range(len(finished) - cap):
            job = jobs.pop(finished.popitem(last=False)[0])
            all_counts[job.message.queue][state] -= 1
            counted = trimmed.setdefault(job.message.queue, {})
            counted[state] = counted.get(state, 0) + 1
        expired = now - ttl
        while finished:
            job_id, finished_at = next(iter(finished.items()))
            if finished_at > expired:
                break
            del finished[job_id]
            job = jobs.pop(job_id)
            all_counts[job.message.queue][state] -= 1
            counted = trimmed.setdefault(job.message.queue, {})
            counted[state] = counted.get(state, 0) + 1

    def trim_all(self, now: float) -> None:
        """Apply every final state's bounds (the age bounds pass with time alone)."""
        for state in self.by_state:
            self.trim(state, now)
