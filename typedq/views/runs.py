"""A durable run as inspection shows it: :class:`RunView` (its state, input, what it
waits for and its timeline) and :class:`RunEntryView` (one entry of its log), with how
tools word them (``typedq inspect --run``, the dashboard's run page); draws nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ..broker.runs import RunRecord, RunState
from ..durable import log as durable_log
from ..errors import FailureRecord
from .jobs import plain_data

__all__ = [
    "RUN_ENTRY_LABELS",
    "RunEntryView",
    "RunView",
    "entry_view",
    "run_detail",
    "run_view",
    "run_waiting",
]


class RunEntryView(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a durable run's log, as plain data.

    :param kind: the entry's tag in the log: ``step`` (scheduled), ``step_ok``,
        ``step_failed``, ``do``, ``sleep``, ``wait``, ``signal``, ``signal_timeout``,
        ``emit``, ``patch``
    :param name: the task, ``do`` block, signal, event model or patch id (``""`` for a sleep)
    :param value: the step's output, the ``do`` value, the signal's payload or the event,
        decoded as plain data (None for the other kinds)
    :param at: a sleep's end or a wait's deadline (epoch seconds)
    """

    position: int
    kind: str
    name: str
    value: Any = None
    at: float | None = None
    failure: FailureRecord | None = None
    #: The scheduled step's input digest (a replay with another input diverges).
    digest: str = ""
    #: A step's job id (``run_id:position``): ``typedq inspect --job`` shows it.
    job: str = ""


class RunView(msgspec.Struct, frozen=True, kw_only=True):
    """A durable run in full: its state, input, what it waits for, its timeline (every
    log entry, oldest first) and its result or failure (``typedq inspect --run``, the
    dashboard's run page)."""

    id: str
    name: str
    queue: str
    state: RunState
    created_at: float
    finished_at: float
    input: Any
    #: What the running run waits for: any of these step jobs to end, this signal, the
    #: clock to pass ``wake_at`` (a sleep's end, a wait's deadline); none: a turn is due.
    wait_jobs: list[str]
    wait_signal: str | None
    wake_at: float | None
    #: Signals sent and not yet taken by a wait, how many per name.
    inbox: dict[str, int]
    entries: list[RunEntryView]
    result: Any = None
    failure: FailureRecord | None = None
    #: Its step jobs that have ended and that no turn has logged yet.
    unlogged_steps: list[str] = []


def entry_view(run_id: str, entry: durable_log.LogEntry) -> RunEntryView:
    kind = type(entry).__struct_config__.tag
    view = RunEntryView(position=entry.position, kind=str(kind), name="")
    if isinstance(
        entry, durable_log.StepScheduled | durable_log.StepCompleted | durable_log.StepFailed
    ):
        view = msgspec.structs.replace(view, job=f"{run_id}:{entry.position}")
    if isinstance(entry, durable_log.StepScheduled):
        return msgspec.structs.replace(view, name=entry.task, digest=entry.digest)
    if isinstance(entry, durable_log.StepCompleted):
        return msgspec.structs.replace(view, name=entry.task, value=plain_data(entry.output))
    if isinstance(entry, durable_log.StepFailed):
        return msgspec.structs.replace(view, name=entry.task, failure=entry.failure)
    if isinstance(entry, durable_log.DoRecorded):
        return msgspec.structs.replace(view, name=entry.name, value=plain_data(entry.value))
    if isinstance(entry, durable_log.SleepStarted):
        return msgspec.structs.replace(view, at=entry.until)
    if isinstance(entry, durable_log.WaitStarted):
        return msgspec.structs.replace(view, name=entry.signal, at=entry.deadline)
    if isinstance(entry, durable_log.SignalReceived):
        return msgspec.structs.replace(view, name=entry.signal, value=plain_data(entry.payload))
    if isinstance(entry, durable_log.SignalTimedOut):
        return msgspec.structs.replace(view, name=entry.signal)
    if isinstance(entry, durable_log.Emitted):
        return msgspec.structs.replace(view, name=entry.event, value=plain_data(entry.payload))
    assert isinstance(entry, durable_log.PatchMarked)
    return msgspec.structs.replace(view, name=entry.patch)


#: How tools name each kind of run log entry.
RUN_ENTRY_LABELS = {
    "step": "step scheduled",
    "step_ok": "step completed",
    "step_failed": "step failed",
    "do": "do",
    "sleep": "sleep",
    "wait": "wait for signal",
    "signal": "signal received",
    "signal_timeout": "signal timed out",
    "emit": "emitted",
    "patch": "patched",
}


def run_waiting(view: RunView, when: Callable[[float], str]) -> str:
    """What a running run waits for, in words (``when`` formats an epoch time); ``""``
    once it has ended."""
    if view.state.is_final:
        return ""
    parts = []
    if view.wait_jobs:
        parts.append("step jobs " + ", ".join(view.wait_jobs))
    if view.wait_signal is not None:
        parts.append(f"signal {view.wait_signal!r}")
    if view.wake_at is not None:
        if parts:
            parts[-1] += f" until {when(view.wake_at)}"
        else:
            parts.append(f"the clock to pass {when(view.wake_at)}")
    return "; ".join(parts) if parts else "its next turn"


def run_detail(entry: RunEntryView, when: Callable[[float], str]) -> str:
    """An entry's detail in one line: the value as JSON, the time, the error."""
    if entry.failure is not None:
        failure = entry.failure
        return f"{failure.error_type}: {failure.message}" if failure.message else failure.error_type
    if entry.kind == "step":
        return f"job {entry.job}, input {entry.digest}"
    if entry.kind == "sleep" and entry.at is not None:
        return f"until {when(entry.at)}"
    if entry.kind == "wait":
        return "no deadline" if entry.at is None else f"deadline {when(entry.at)}"
    if entry.value is not None:
        return msgspec.json.encode(entry.value).decode()
    return ""


def run_view(record: RunRecord) -> RunView:
    """A run as :class:`RunView` (its log decoded; an unreadable entry raises
    :class:`~typedq.errors.BrokerDataError`)."""
    run_id = record.spec.id
    entries = [
        entry_view(run_id, e) for blob in record.log for e in durable_log.decode_entries(blob)
    ]
    return RunView(
        id=record.spec.id,
        name=record.spec.name,
        queue=record.spec.queue,
        state=record.state,
        created_at=record.created_at,
        finished_at=record.finished_at,
        input=plain_data(record.spec.input),
        wait_jobs=[] if record.state.is_final else list(record.wait_jobs),
        wait_signal=None if record.state.is_final else record.wait_signal,
        wake_at=None if record.state.is_final else record.wake_at,
        inbox={name: len(kept) for name, kept in sorted(record.inbox.items()) if kept},
        entries=entries,
        result=plain_data(record.result),
        failure=record.failure,
        unlogged_steps=sorted(record.outcomes),
    )
