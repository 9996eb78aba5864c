"""The Redis broker's schedule operations (typedq.schedule), mixed into RedisBroker.

Each schedule's state is one field of the app's ``schedules`` hash (see
:mod:`typedq.broker.keys`). Reconciling and firing are one Lua script each
(``schedule_sync.lua``, ``schedule_fire.lua``); firing enqueues a tick's jobs in the
same script that moves the state on, compare-and-set, so a tick is enqueued once
however many workers fire it. On Redis Cluster the states and the jobs are in different
slots: firing checks the state, stores the jobs (ids derived from schedule and tick: a
racing scheduler's copies are the same jobs) and then moves the state, compare and set
(``schedule_commit.lua``). Time is Redis ``TIME``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from ...errors import BrokerUnavailable, QueueFull
from ...names import check_job_id, check_name
from ..base import FireOutcome, ScheduleState, TickFiring
from .codec import MICRO, as_int, encode_body, text
from .core import RedisCore

__all__ = ["FIRING_SHIELD", "ScheduleOps", "parse_state"]

#: Seconds a firing on Redis Cluster may go on after a cancel (shutdown): enough for its two
#: calls against a live Redis, short enough that an outage does not hold a shutdown long.
FIRING_SHIELD = 10.0


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


class ScheduleOps(RedisCore):
    """Schedule methods of the Redis broker."""

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
        if self.cluster:
            return [await self._fire_on_cluster(f) for f in firings]
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
            keys = [self.keys.schedules]
            if f.messages:
                keys.append(self.keys.seq(f.messages[0].queue))
            calls.append(("schedule_fire", keys, args))
        await self._note_queues([m.queue for f in firings for m in f.messages])
        replies = await self._eval_pipelined(calls)
        return [
            (FireOutcome(text(outcome)), parse_state(f.name, raw))
            for f, (outcome, raw) in zip(firings, replies, strict=True)
        ]

    async def _fire_on_cluster(self, f: TickFiring) -> tuple[FireOutcome, ScheduleState | None]:
        """One firing on Redis Cluster, where the schedule states (the app's slot) and the
        ticks' jobs (their queue's slot) cannot change in one script: check the state
        (compare), apply the overlap policy, store the jobs (ids derived from schedule and
        tick, so a racing scheduler's copies are the same jobs), then move the state
        (compare and set): exactly one scheduler's move wins, the others answer stale."""
        name = check_name("schedule", f.name)
        n = len(f.messages)
        for m in f.messages:
            check_job_id(m.id)
            check_name("queue", m.queue)

        async def commit(mode: str) -> tuple[str, Any]:
            args = [self.keys.prefix, name, f.digest, f.expected_last_us, f.new_last_us]
            args += [f.skipped, mode, n, f.messages[-1].id if f.messages else ""]
            outcome, raw = await self._eval("schedule_commit", [self.keys.schedules], args)
            return text(outcome), raw

        outcome, raw = await commit("check")
        if outcome == "stale":
            return FireOutcome.STALE, parse_state(f.name, raw)
        if n and f.overlap != "allow":
            last_job = text(raw).rsplit("|", 1)[-1]
            if last_job:
                (record,) = await self.get([last_job], queue=f.messages[0].queue)
                if record is not None and not record.state.is_final:
                    if f.overlap == "queue":
                        return FireOutcome.HELD, parse_state(f.name, raw)
                    outcome, raw = await commit("overlap_skipped")
                    return FireOutcome(outcome), parse_state(f.name, raw)
        # Storing the jobs and moving the state are two calls here: a cancel between them
        # (a worker's shutdown cancels its scheduler) would leave a tick's jobs stored while
        # the state says the tick never fired (`fired` one short; the next scheduler counts
        # it as missed or fires it again, which re-runs its job once retention dropped it).
        # So both run shielded, bounded so that an outage cannot hold a shutdown for long.
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + FIRING_SHIELD):
            if n:
                try:
                    await self.enqueue(list(f.messages))
                except QueueFull:
                    outcome, raw = await commit("full")
                    return FireOutcome(outcome), parse_state(f.name, raw)
            outcome, raw = await commit("fired")
            return FireOutcome(outcome), parse_state(f.name, raw)
        raise BrokerUnavailable(
            f"schedule {name!r}: Redis did not store tick {f.new_last_us} within"
            f" {FIRING_SHIELD:g} s; the next firing retries it (same job ids)"
        )

    async def schedule_states(self) -> list[ScheduleState]:
        raw: dict[Any, Any] = await self._hgetall(self.keys.schedules)
        states = [parse_state(text(name), value) for name, value in raw.items()]
        return sorted((s for s in states if s is not None), key=lambda s: s.name)
