"""The Redis broker's schedule operations (typedq.schedule), mixed into RedisBroker.

Each schedule's state is one field of the app's ``schedules`` hash (see
:mod:`typedq.broker.keys`). Reconciling and firing are one Lua script each
(``schedule_sync.lua``, ``schedule_fire.lua``); firing enqueues a tick's jobs in the
same script that moves the state on, compare-and-set, so a tick is enqueued once
however many workers fire it. Time is Redis ``TIME``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from ...names import check_job_id, check_name
from ..base import BrokerSettings, FireOutcome, ScheduleState, TickFiring
from ..keys import Keys
from .codec import MICRO, as_int, encode_body, text

__all__ = ["ScheduleOps", "parse_state"]


def parse_state(name: str, raw: Any) -> ScheduleState | None:
    """A state as the scripts store it (``digest|last|fired_at|fired|skipped|last_job``)."""
    if raw is None or raw is False:
        return None
    parts = text(raw).split("|", 5)
    if len(parts) != 6:
        return None
    digest, last, fired_at, fired, skipped, last_job = parts
    return ScheduleState(
        name=name,
        digest=digest,
        last_tick_us=as_int(last),
        last_job=last_job,
        last_fired_us=as_int(fired_at),
        fired=as_int(fired),
        skipped=as_int(skipped),
    )


class ScheduleOps:
    """Schedule methods of the Redis broker (it provides what is declared here)."""

    keys: Keys
    settings: BrokerSettings

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        raise NotImplementedError  # pragma: no cover - RedisBroker's own

    async def _eval_pipelined(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        raise NotImplementedError  # pragma: no cover - RedisBroker's own

    async def _redis_time_us(self) -> int:
        raise NotImplementedError  # pragma: no cover - RedisBroker's own

    async def broker_time_us(self) -> int:
        return await self._redis_time_us()

    async def sleep_until_us(self, when_us: int) -> None:
        delta = (when_us - await self._redis_time_us()) / MICRO
        if delta > 0:
            await anyio.sleep(delta)

    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]:
        args: list[Any] = [self.keys.prefix, "1" if prune else "0", len(schedules)]
        for name, digest in schedules:
            args += (check_name("schedule", name), digest)
        reply = await self._eval("schedule_sync", [self.keys.schedules], args)
        states = [parse_state(name, raw) for (name, _), raw in zip(schedules, reply, strict=True)]
        return [s for s in states if s is not None]

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        if not firings:
            return []
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        for f in firings:
            args: list[Any] = [
                self.keys.prefix,
                self.settings.max_queue_length,
                check_name("schedule", f.name),
                f.digest,
                f.expected_last_us,
                f.new_last_us,
                f.skipped,
                f.overlap,
                len(f.messages),
            ]
            for m in f.messages:
                check_job_id(m.id)
                check_name("queue", m.queue)
                args += (m.id, m.queue, str(int(m.priority)), encode_body(m))
            calls.append(("schedule_fire", [self.keys.schedules, self.keys.seq], args))
        replies = await self._eval_pipelined(calls)
        return [
            (FireOutcome(text(outcome)), parse_state(f.name, raw))
            for f, (outcome, raw) in zip(firings, replies, strict=True)
        ]

    async def schedule_states(self) -> list[ScheduleState]:
        raw: dict[Any, Any] = await self._hgetall(self.keys.schedules)
        states = [parse_state(text(name), value) for name, value in raw.items()]
        return sorted((s for s in states if s is not None), key=lambda s: s.name)

    async def _hgetall(self, key: str) -> dict[Any, Any]:
        raise NotImplementedError  # pragma: no cover - RedisBroker's own
