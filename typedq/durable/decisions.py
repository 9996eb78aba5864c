"""What a replay decides (:data:`Decision`, returned by :func:`typedq.durable.replay.replay`):
schedule steps, sleep, wait for a signal, or the run's end, each with the log entries the
replay recorded for the host to append first. Plain data: the host carries them out."""

from __future__ import annotations

import dataclasses
from typing import Generic, TypeAlias, TypeVar

from ..taskbase import TOut
from .log import LogEntry

__all__ = [
    "Completed",
    "Decision",
    "Failed",
    "ScheduleSteps",
    "SleepUntil",
    "StepRequest",
    "WaitForSignal",
]

T_co = TypeVar("T_co", covariant=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepRequest:
    """A step the host must run: a job of ``task`` with this input, id ``key``.

    :param position: the step's call position (its log entries are keyed by it)
    :param task: the task's registered name
    :param payload: the encoded input
    :param key: the job id, ``run_id:position``: stable across replays, so a step
        scheduled twice (a crash between enqueue and log write) is one job
    """

    position: int
    task: str
    payload: bytes
    key: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Decided:
    #: New entries, in position order, to append to the log before acting on the decision.
    append: tuple[LogEntry, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleSteps(_Decided):
    """Suspended on steps: enqueue ``schedule``; replay when every awaited step has an outcome.

    :param schedule: steps asked for the first time (their ``StepScheduled`` is in ``append``)
    :param pending: positions of awaited steps scheduled by an earlier replay, still running
    """

    schedule: tuple[StepRequest, ...]
    pending: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True, kw_only=True)
class SleepUntil(_Decided):
    """Suspended in ``run.sleep``: replay once the clock passes ``until`` (epoch seconds)."""

    position: int
    until: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class WaitForSignal(_Decided):
    """Suspended in ``run.wait_for``: deliver ``signal`` at ``position`` (append a
    ``SignalReceived``, the oldest one sent first), or replay at ``deadline``, when the
    replay records the timeout itself."""

    position: int
    signal: str
    deadline: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Completed(_Decided, Generic[T_co]):
    """The function returned ``result``: the run is done."""

    result: T_co


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failed(_Decided):
    """The function raised ``error`` (a step's failure it did not catch, or its own)."""

    error: Exception


#: What :func:`replay` returns.
Decision: TypeAlias = ScheduleSteps | SleepUntil | WaitForSignal | Completed[TOut] | Failed
