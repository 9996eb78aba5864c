"""What a worker counts: :class:`WorkerStats`, also the source of its metrics."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["WorkerStats"]


@dataclass
class WorkerStats:
    """Counters of what a worker did (also the source of its metrics)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    released: int = 0
    lease_lost: int = 0
    #: Finishes the broker refused because the lease was no longer ours.
    finish_rejected: int = 0
    #: Attempts that ended (timeout, lost lease, shutdown) while their sync handler's
    #: thread still ran; each kept a slot taken until the thread returned.
    orphaned_threads: int = 0
    #: Jobs left at shutdown with their handler thread still running (back by lease expiry).
    abandoned: int = 0
    #: Outcomes shutdown stopped re-sending because the broker did not take them.
    settles_given_up: int = 0
    #: Jobs whose producer's schema fingerprint differed but whose payload validated.
    fingerprint_mismatches: Counter[tuple[str, str]] = field(default_factory=Counter)
