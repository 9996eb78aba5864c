"""The PostgreSQL broker's capability Schedules, mixed into PostgresBroker: schedule
states reconciled and fired compare-and-set on the database's clock, a tick's jobs
enqueued in the same call that moves its state on."""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from ..base import FireOutcome, ScheduleState, TickFiring
from .core import PostgresCore
from .rows import FIRE, schedule_of

__all__ = ["ScheduleOps"]


class ScheduleOps(PostgresCore):
    """Schedule methods of the PostgreSQL broker."""

    async def broker_time_us(self) -> int:
        now: int = await self._fetchval("broker_time_us", self._sql["now_us"])
        return now

    async def sleep_until_us(self, when_us: int) -> None:
        delta = (when_us - await self.broker_time_us()) / 1_000_000
        if delta > 0:
            await anyio.sleep(delta)

    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]:
        rows = await self._fetch(
            "sync_schedules",
            self._sql["sync_schedules"],
            self.ns,
            [name for name, _ in schedules],
            [digest for _, digest in schedules],
            prune,
            read=True,  # idempotent: a re-sent call finds the states it made
        )
        return [schedule_of(row) for row in rows]

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        if not firings:
            self._check()
            return []
        messages = [m for f in firings for m in f.messages]
        args = self._enqueue_args(messages)
        starts = []
        at = 1
        for f in firings:
            starts.append(at)
            at += len(f.messages)
        await self._register_queues(args[2])
        rows = await self._fetch(
            "fire_schedules",
            self._sql["fire_schedules"],
            self.ns,
            [f.name for f in firings],
            [f.digest for f in firings],
            [f.expected_last_us for f in firings],
            [f.new_last_us for f in firings],
            [f.skipped for f in firings],
            [f.overlap for f in firings],
            starts,
            [len(f.messages) for f in firings],
            [self.queue_cap({m.queue for m in f.messages}) for f in firings],
            *args[1:7],
            self.channel,
            *args[9:12],
        )
        rows.sort(key=lambda row: row["k"])
        return [
            (FIRE[row["outcome"]], None if row["name"] is None else schedule_of(row))
            for row in rows
        ]

    async def schedule_states(self) -> list[ScheduleState]:
        rows = await self._fetch(
            "schedule_states", self._sql["schedule_states"], self.ns, read=True
        )
        return [schedule_of(row) for row in rows]
