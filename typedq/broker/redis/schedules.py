"""The Redis broker's schedule operations (typedq.schedule), mixed into RedisBroker.

Each schedule's state is one field of the app's ``schedules`` hash (see
:mod:`typedq.broker.redis.keys`). Reconciling and firing are one Lua script each
(``schedule_sync.lua``, ``schedule_fire.lua``); firing enqueues a tick's jobs in the
same script that moves the state on, compare-and-set, so a tick is enqueued once
however many workers fire it. On Redis Cluster the app-wide states and the jobs are in
different slots: each schedule also keeps a firing state in the slot of its ticks' queue
(every tick of a schedule goes to one queue), where the same script fires it, and the
app-wide state is moved up to it after (``schedule_commit.lua``). Time is Redis ``TIME``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from ...errors import BrokerError, BrokerUnavailable
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
        n = len(schedules)
        states = [
            parse_state(name, raw) for (name, _), raw in zip(schedules, reply[:n], strict=True)
        ]
        pruned = [text(name) for name in reply[n:]]
        if pruned and self.cluster:
            await self._prune_firing_states(pruned)
        return [s for s in states if s is not None]

    async def _prune_firing_states(self, names: Sequence[str]) -> None:
        """Redis Cluster: delete the firing states of pruned schedules, kept in the slot
        of the queue their ticks go to (``Q S``); which queue that was is not recorded,
        so every known queue's hash is cleaned (one single-slot HDEL each)."""
        queues = await self.known_queues()
        if not queues:
            return
        with self._translate("schedule prune"):
            pipe = self._conn().pipeline(transaction=False)
            for queue in queues:
                pipe.hdel(self.keys.schedule_firing(queue), *names)
            await pipe.execute()

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
                self.queue_cap(m.queue for m in f.messages),
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
        """One firing on Redis Cluster, where the app-wide states (the app's slot) and the
        ticks' jobs (their queue's slot) cannot change in one script. Every tick of a
        schedule goes to one queue, which keeps the schedule's firing state (``Q S``):
        check the app-wide state (compare), then fire in the queue's slot with
        schedule_fire.lua against the firing state (compare and set, overlap policy,
        enqueue and move: one script, so a scheduler that stalls after its check and
        wakes after the tick's job ran and was dropped by retention finds the firing
        state moved on and stores nothing), then move the app-wide state up to it."""
        name = check_name("schedule", f.name)
        n = len(f.messages)
        queue = f.queue or (f.messages[0].queue if f.messages else "")
        for m in f.messages:
            check_job_id(m.id)
            check_name("queue", m.queue)
            if m.queue != queue:
                raise BrokerError(
                    f"schedule {name!r}: on Redis Cluster every tick's job of a firing must "
                    f"go to the schedule's queue {queue!r}, not {m.queue!r} (one slot)"
                )

        async def commit(mode: str, last: str = "") -> tuple[str, Any]:
            args = [self.keys.prefix, name, f.digest, f.expected_last_us, f.new_last_us]
            args += [f.skipped, mode, n, last]
            outcome, raw = await self._eval("schedule_commit", [self.keys.schedules], args)
            return text(outcome), raw

        outcome, raw = await commit("check")
        if outcome == "stale":
            return FireOutcome.STALE, parse_state(f.name, raw)
        if not queue:
            # No job and no queue named (only a caller other than the Scheduler): the
            # state moves here, compare and set; nothing is stored, nothing can run twice.
            outcome, raw = await commit("fired")
            return FireOutcome(outcome), parse_state(f.name, raw)
        check_name("queue", queue)
        args: list[Any] = [
            self.keys.prefix,
            self.queue_cap([queue]),
            name,
            f.digest,
            f.expected_last_us,
            f.new_last_us,
            f.skipped,
            f.overlap,
            n,
        ]
        for m in f.messages:
            args += (m.id, m.queue, str(int(m.priority)), encode_body(m))
        args.append(text(raw))  # adopted by a firing state missing or behind it
        await self._note_queues([queue])
        # Firing and moving the app-wide state up are two calls: a cancel between them (a
        # worker's shutdown cancels its scheduler) would leave the app-wide state behind
        # the firing state until the next firing moves it up (it answers stale and does).
        # Both run shielded, bounded so that an outage cannot hold a shutdown for long.
        with anyio.CancelScope(shield=True, deadline=anyio.current_time() + FIRING_SHIELD):
            keys = [self.keys.schedule_firing(queue), self.keys.seq(queue)]
            fired, state = await self._eval("schedule_fire", keys, args)
            if state is None or state is False:
                return FireOutcome(text(fired)), parse_state(f.name, raw)
            _, raw = await commit("up", text(state))
            return FireOutcome(text(fired)), parse_state(f.name, raw)
        raise BrokerUnavailable(
            f"schedule {name!r}: Redis did not answer the firing of tick {f.new_last_us}"
            f" within {FIRING_SHIELD:g} s; the next firing finds out whether it was stored"
        )

    async def schedule_states(self) -> list[ScheduleState]:
        raw: dict[Any, Any] = await self._hgetall(self.keys.schedules)
        states = [parse_state(text(name), value) for name, value in raw.items()]
        return sorted((s for s in states if s is not None), key=lambda s: s.name)
