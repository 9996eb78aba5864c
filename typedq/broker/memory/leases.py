"""Leases and claim records: how long a claimed job stays its worker's, on which clock.

A lease measures whether a worker is alive, so it runs on the clock's monotonic time;
everything a user reads (delays, ETAs, timestamps, retention) runs on its wall time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

from ...clock import SYSTEM_CLOCK, Clock
from ..base import CLAIM_RECORD_TTL
from .jobs import Job

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
    """Lease deadlines on ``clock``'s monotonic time, and the recent claims by claim id
    (a re-sent claim answers what its first copy took)."""

    __slots__ = ("claims", "clock")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        #: Recent claims by claim id: (when, job ids), oldest first.
        self.claims: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()

    def until(self, lease: float) -> float:
        """The deadline of a lease of ``lease`` seconds taken now."""
        return self.clock.monotonic() + lease

    def left(self, job: Job) -> float:
        """Seconds until ``job``'s lease ends (negative: it has)."""
        return job.lease_until - self.clock.monotonic()

    def remember(self, claim_id: str, ids: Iterable[str]) -> None:
        """Keep the ids a claim took, for CLAIM_RECORD_TTL."""
        # A tuple of strings: the GC stops tracking it, though it is kept a minute.
        self.claims[claim_id] = (self.clock.monotonic(), tuple(ids))

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

    def expired(self, active: Iterable[Job], holding: Collection[str], limit: int) -> list[Job]:
        """Up to ``limit`` of the ``active`` jobs whose lease has ended, except those
        whose ids are in ``holding`` (the caller's own, which it still runs)."""
        deadline = self.clock.monotonic()
        mine = set(holding)
        return [job for job in active if job.lease_until < deadline and job.message.id not in mine][
            :limit
        ]
