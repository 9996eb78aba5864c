"""What the embedded broker tells about itself: throughput rollups, event streams, and
the registry of workers and queues."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import anyio

from ...clock import Clock
from ..base import HISTORY_MINUTES, EventRead, JobState, MinuteRollup, QueueEvent, WorkerInfo
from .jobs import COMPLETED, Job

__all__ = ["Events", "Registry", "Rollups"]


class Rollups:
    """Throughput per queue and minute: queue -> minute (minutes since the epoch) ->
    [completed, failed, retried]; minutes older than HISTORY_MINUTES are pruned as new
    ones start."""

    __slots__ = ("minutes",)

    def __init__(self) -> None:
        self.minutes: dict[str, dict[int, list[int]]] = {}

    def roll(self, queue: str, field: int, now: float, count: int = 1) -> None:
        """Count ``count`` completions (0), final failures (1) or retries (2) in ``now``'s
        minute."""
        minute = int(now // 60)
        minutes = self.minutes.setdefault(queue, {})
        row = minutes.get(minute)
        if row is None:
            for old in [m for m in minutes if m <= minute - HISTORY_MINUTES]:
                del minutes[old]
            row = minutes[minute] = [0, 0, 0]
        row[field] += count

    def history(self, queues: Sequence[str], minutes: int, now: float) -> list[list[MinuteRollup]]:
        """The last ``minutes`` minutes up to ``now``'s, oldest first, per queue."""
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        current = int(now // 60)
        out = []
        for queue in queues:
            rows = self.minutes.get(queue, {})
            out.append(
                [
                    MinuteRollup(m * 60, *rows.get(m, (0, 0, 0)))
                    for m in range(current - minutes + 1, current + 1)
                ]
            )
        return out


class Events:
    """Event streams (typedq.events) by queue: a ring of the last ``events_max`` events,
    the last event number, and the readers waiting for the next event. Only queues whose
    stream was enabled have a ring."""

    __slots__ = ("events_max", "rings", "seq", "waiters")

    def __init__(self, events_max: int) -> None:
        self.events_max = events_max
        self.rings: dict[str, deque[QueueEvent]] = {}
        self.seq: dict[str, int] = {}
        self.waiters: dict[str, anyio.Event] = {}

    def enable(self, queue: str) -> int:
        """Start ``queue``'s stream (if not yet); its last event number."""
        self.rings.setdefault(queue, deque())
        return self.seq.setdefault(queue, 0)

    def emit(self, ring: deque[QueueEvent], job: Job, state: JobState) -> None:
        """``job`` reached final ``state``: an event on its queue's ``ring``."""
        queue = job.message.queue
        seq = self.seq[queue] = self.seq[queue] + 1
        data = job.result if state is COMPLETED else job.error
        ring.append(
            QueueEvent(
                seq=seq,
                id=job.message.id,
                task=job.message.task,
                state=state,
                data=data or b"",
                attempt=job.attempt,
            )
        )
        while len(ring) > self.events_max:
            ring.popleft()
        waiter = self.waiters.pop(queue, None)
        if waiter is not None:
            waiter.set()

    def has_after(self, queue: str, after: int) -> bool:
        return self.seq.get(queue, 0) > after

    async def wait(self, queue: str, timeout: float) -> None:
        """Wait up to ``timeout`` for ``queue``'s next event."""
        waiter = self.waiters.get(queue)
        if waiter is None:
            waiter = self.waiters[queue] = anyio.Event()
        with anyio.move_on_after(timeout):
            await waiter.wait()

    def read(self, queue: str, after: int, limit: int) -> EventRead:
        """Up to ``limit`` events of ``queue`` after number ``after``, and how many of
        those the ring no longer holds."""
        ring = self.rings.get(queue)
        if not ring or ring[-1].seq <= after:
            return EventRead(events=[])
        # The ring's numbers are consecutive: the first one after `after` is found by index.
        start = max(0, after + 1 - ring[0].seq)
        events = [ring[i] for i in range(start, min(len(ring), start + limit))]
        return EventRead(events=events, missed=max(0, events[0].seq - after - 1))

    def wake_all(self) -> None:
        """Wake every waiting reader (the broker closes)."""
        for event in self.waiters.values():
            event.set()
        self.waiters.clear()


class Registry:
    """The live workers (id -> (expiry on the clock's monotonic time, info)) and the
    queues ever named by a job or a worker."""

    __slots__ = ("clock", "queues", "workers")

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.workers: dict[str, tuple[float, WorkerInfo]] = {}
        self.queues: set[str] = set()

    def live(self) -> dict[str, tuple[float, WorkerInfo]]:
        """The workers whose registration has not expired (the others go)."""
        now = self.clock.monotonic()
        for worker_id in [w for w, (until, _) in self.workers.items() if until <= now]:
            del self.workers[worker_id]
        return self.workers

    def register(self, info: WorkerInfo, ttl: float) -> None:
        self.live()[info.id] = (self.clock.monotonic() + ttl, info)
        self.queues.update(info.queues)

    def unregister(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)

    def list_workers(self) -> list[WorkerInfo]:
        return [info for _, (_, info) in sorted(self.live().items())]
