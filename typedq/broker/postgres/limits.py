"""The PostgreSQL broker's capability Limits, mixed into PostgresBroker: the rate and
concurrency limits a worker declares (``set_limits``) go with each of its claims, which
enforce them in the database (the functions of :mod:`.migration_4`; the claim itself as
:mod:`.migration_11` restated it, taking a bucket's jobs in batches).

The rules are the embedded broker's (:mod:`typedq.broker.memory.limits`): concurrency
first, then the sliding window of start times (spaced turns, taken up to ``early`` before
their turn); a job whose limit is closed is *parked* by its gate (``jobs.gate``: still
waiting, listed and counted as waiting, out of the claim's line) and the claim goes on
with other jobs. Times are integer microseconds of the database's clock.

- A job's task and limit keys are columns (``task``, ``rate_key``, ``conc_key``), written
  by the new ``enqueue`` (the old one stays for clients of an older release: their jobs
  have no task and are never limited). ``slot``: the job holds a concurrency slot of
  (task, conc_key) while active (the claim admitted it under a concurrency limit).
- Race-free without waiting: every claim-side read and write of one bucket (a rate
  window, a slot count, the gates of the bucket and the slots they count) is made under
  the bucket's transaction-level advisory lock, taken with ``pg_try_advisory_xact_lock``;
  a claim that cannot take it leaves the bucket's jobs where they are (as ``SKIP LOCKED``
  leaves a locked row), so two claims never wait on each other and never deadlock. Two
  workers claiming at once thus never exceed a concurrency or a rate limit: the second
  counts after the first has committed, or skips the bucket.
- A gate opens at its time (``gates.opens_us``: a rate window's next start, or a ghost's
  end), or when a slot of its bucket is freed: the row leaving ``active`` (complete, fail,
  release, recover) or deleted (remove, purge) leaves a ``freed`` note for the gate
  (inserted, so a finisher never waits on a claim either) and wakes the queue's waiters.
  A finisher that holds the bucket's lock itself notes only an existing gate; one that
  cannot take it notes the gate in any case (a claim may be parking behind it).
- An active slot holder deleted by an operator leaves a ghost holding its place until its
  lease would have ended (its handler may still run), as memory's ``ghost_slot``.
"""

from __future__ import annotations

from collections.abc import Mapping

from ...limits import LimitSpec
from .core import PostgresCore

__all__ = ["LimitArgs", "LimitOps", "limit_args"]

#: The claim function's limit arguments (migration_4's claim): tasks, rates, windows
#: (us), concurrency limits, spacings (us) and how early a spaced start may be taken (us).
LimitArgs = tuple[list[str], list[int], list[int], list[int], list[int], list[int]]

_NONE: LimitArgs = ([], [], [], [], [], [])


def limit_args(limits: Mapping[str, LimitSpec]) -> LimitArgs:
    """The claim's arguments for ``limits`` (task -> spec)."""
    if not limits:
        return _NONE
    specs = sorted(limits.items())
    return (
        [task for task, _ in specs],
        [spec.rate for _, spec in specs],
        [spec.per_us for _, spec in specs],
        [spec.concurrency for _, spec in specs],
        [spec.spacing_us for _, spec in specs],
        [spec.early_us for _, spec in specs],
    )


class LimitOps(PostgresCore):
    """Task limits of the PostgreSQL broker."""

    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """Declare tasks' limits; every later claim of this broker enforces them."""
        self._merge_limits(limits)

    async def _forget_idle(self) -> None:
        """The reaper's pass, with limits: drop the rate windows of this broker's tasks
        with no start left in them (as good as new, as memory's ``forget_idle``), and
        the notes of freed slots whose gate is gone."""
        if self.limits:
            tasks, _, pers, *_ = limit_args(self.limits)
            await self._fetch("forget_idle", self._sql["forget_idle"], self.ns, tasks, pers)
