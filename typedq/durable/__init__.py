"""Durable runs (preview): the replay core, and ``@app.durable`` on the embedded broker.

A durable run is ``async def f(run: Run, inp: TIn) -> TOut``, re-run from the top after
every suspension or crash against its log (:mod:`typedq.durable.log`); :func:`replay`
(:mod:`typedq.durable.replay`) runs it once and says what the host does next;
:mod:`typedq.durable.host` is the host (``@app.durable``, :class:`DurableTask`,
:class:`RunHandle`, the run's turns). See docs/durable.md. :mod:`typedq` exports
``Run``, ``RunHandle``, ``Signal``, ``RunTimeout`` and ``NonDeterministic``.
"""

from __future__ import annotations

from .host import DurableTask, RunHandle
from .log import (
    DoRecorded,
    Emitted,
    Entry,
    LogEntry,
    PatchMarked,
    RunLog,
    SignalReceived,
    SignalTimedOut,
    SleepStarted,
    StepCompleted,
    StepFailed,
    StepScheduled,
    WaitStarted,
    decode_entries,
    encode_entries,
)
from .replay import (
    Completed,
    Decision,
    DurableFunction,
    Failed,
    Run,
    ScheduleSteps,
    SleepUntil,
    StepCall,
    StepRequest,
    WaitForSignal,
    replay,
)
from .types import NonDeterministic, RunTimeout, Signal

__all__ = [
    # the typed surface
    "Run",
    "StepCall",
    "Signal",
    "RunTimeout",
    "NonDeterministic",
    "DurableFunction",
    # on an app: @app.durable
    "DurableTask",
    "RunHandle",
    # the engine and its decisions
    "replay",
    "Decision",
    "ScheduleSteps",
    "StepRequest",
    "SleepUntil",
    "WaitForSignal",
    "Completed",
    "Failed",
    # the log
    "RunLog",
    "Entry",
    "LogEntry",
    "StepScheduled",
    "StepCompleted",
    "StepFailed",
    "DoRecorded",
    "SleepStarted",
    "WaitStarted",
    "SignalReceived",
    "SignalTimedOut",
    "Emitted",
    "PatchMarked",
    "encode_entries",
    "decode_entries",
]
