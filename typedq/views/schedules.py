"""A schedule as inspection shows it (:class:`ScheduleView`): the broker's state of it
next to the app's declaration (``typedq inspect``, the dashboard); draws nothing."""

from __future__ import annotations

from typing import Any

import msgspec

from ..broker.base import ScheduleState
from ..schedule import Schedule

__all__ = ["ScheduleView", "schedule_view"]


class ScheduleView(msgspec.Struct, frozen=True, kw_only=True):
    """One schedule as ``inspect`` shows it (times: epoch seconds, broker clock).

    ``status`` is ``"ok"``; ``"changed"`` when the broker's state belongs to another
    definition (workers of another version run it); ``"not started"`` when no worker
    has reconciled it yet; ``"not declared"`` for a state the inspected app does not
    declare (left by a removed schedule until a worker prunes it), or when no app was
    given to compare with.
    """

    name: str
    task: str | None
    every: float | None
    cron: str | None
    tz: str | None
    status: str
    #: The next tick (None: unknown without the app's declaration).
    next_fire: float | None
    #: The newest tick handled (fired or skipped).
    last_tick: float | None
    #: When the newest fired tick was enqueued.
    last_fired: float | None
    last_job: str | None
    fired: int
    skipped: int


def _seconds(us: int) -> float | None:
    return us / 1_000_000 if us else None


def schedule_view(
    name: str,
    state: ScheduleState | None,
    declared: Schedule[Any] | None,
    now_us: int,
) -> ScheduleView:
    if declared is None:
        status = "not declared"
    elif state is None:
        status = "not started"
    elif state.digest != declared.digest:
        status = "changed"
    else:
        status = "ok"
    next_fire = None
    if declared is not None:
        start = now_us if state is None or status != "ok" else max(state.last_tick_us, now_us)
        next_fire = declared.next_tick(start) / 1_000_000
    return ScheduleView(
        name=name,
        task=declared.task.name if declared is not None else None,
        every=declared.every if declared is not None else None,
        cron=declared.cron if declared is not None else None,
        tz=str(declared.tz) if declared is not None and declared.cron else None,
        status=status,
        next_fire=next_fire,
        last_tick=_seconds(state.last_tick_us) if state is not None else None,
        last_fired=_seconds(state.last_fired_us) if state is not None else None,
        last_job=(state.last_job or None) if state is not None else None,
        fired=state.fired if state is not None else 0,
        skipped=state.skipped if state is not None else 0,
    )
