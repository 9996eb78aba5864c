"""Schedule states (:mod:`typedq.schedule`): which tick of each schedule was handled last.

A scheduler fires a tick by compare-and-set on the state it read (:class:`TickFiring`),
so two schedulers never fire one tick twice. Times are integer microseconds of the
broker clock's wall time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from ...errors import QueueFull
from ..base import FireOutcome, JobMessage, ScheduleState, TickFiring
from .jobs import Job

__all__ = ["Schedules"]


class Schedules:
    """Schedule states by name."""

    __slots__ = ("states",)

    def __init__(self) -> None:
        self.states: dict[str, ScheduleState] = {}

    def sync(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool, now_us: int
    ) -> list[ScheduleState]:
        """The states of ``schedules`` (name, digest): a new schedule, or one whose
        digest changed, starts over at ``now_us``; ``prune`` drops the others."""
        if prune:
            keep = {name for name, _ in schedules}
            for name in [n for n in self.states if n not in keep]:
                del self.states[name]
        states = []
        for name, digest in schedules:
            state = self.states.get(name)
            if state is None or state.digest != digest:
                state = self.states[name] = ScheduleState(
                    name=name, digest=digest, last_tick_us=now_us
                )
            states.append(state)
        return states

    def fire(
        self,
        f: TickFiring,
        now_us: int,
        job: Callable[[str], Job | None],
        enqueue: Callable[[Sequence[JobMessage]], object],
    ) -> tuple[FireOutcome, ScheduleState | None]:
        """Fire one tick: ``enqueue`` its messages if the state is still the one the
        scheduler read and its overlap rule lets it (``job`` finds the last fired job)."""
        state = self.states.get(f.name)
        if (
            state is None
            or state.digest != f.digest
            or state.last_tick_us != f.expected_last_us
            or f.new_last_us <= f.expected_last_us
            or f.new_last_us > now_us  # a tick is never fired before its time, by our clock
        ):
            return FireOutcome.STALE, state
        if f.messages and f.overlap != "allow" and state.last_job:
            previous = job(state.last_job)
            if previous is not None and not previous.state.is_final:
                if f.overlap == "queue":
                    return FireOutcome.HELD, state
                state = self.states[f.name] = msgspec.structs.replace(
                    state,
                    last_tick_us=f.new_last_us,
                    skipped=state.skipped + f.skipped + len(f.messages),
                )
                return FireOutcome.OVERLAP_SKIPPED, state
        outcome = FireOutcome.FIRED
        fired = len(f.messages)
        if f.messages:
            try:
                enqueue(f.messages)
            except QueueFull:
                outcome, fired = FireOutcome.FULL, 0
        state = self.states[f.name] = msgspec.structs.replace(
            state,
            last_tick_us=f.new_last_us,
            last_job=f.messages[-1].id if fired else state.last_job,
            last_fired_us=now_us if fired else state.last_fired_us,
            fired=state.fired + fired,
            skipped=state.skipped + f.skipped + len(f.messages) - fired,
        )
        return outcome, state

    def listed(self) -> list[ScheduleState]:
        """Every state, by name."""
        return [self.states[name] for name in sorted(self.states)]
