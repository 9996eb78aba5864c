"""The run's next turn taken by the worker of the step it waited on
(:meth:`typedq.durable.host.DurableTask.after_step`; docs/durable.md, "A step's worker
takes the run's next turn").

When a step returns in the worker process that keeps its run paused at that step, that
worker goes on with the run before the step's job is completed: the step's outcome and
what the replay decides next (the next steps' jobs with it) are one append fenced by the
step's lease (:attr:`~typedq.broker.runs.RunAppend.fence`), so no turn job is needed
between two steps. Crash safety is the step's: killed before the append, the step runs
again (its lease runs out: at least once); after it, the step's completion finds its
outcome recorded already and wakes no turn. Anything unexpected (the run is not paused
here at this step, its log grew meanwhile, the lease is gone) leaves the usual way: the
step's completion keeps its outcome and wakes a turn job. So does a decision that reads
the clock (a sleep, a wait, a timeout: their times are the broker's, not read here) or
that fails the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ..broker.base import ClaimedJob
from ..broker.runs import AppendOutcome, RunState
from ..errors import ConfigError
from ..task import TOut
from .decisions import Completed, Decision, ScheduleSteps
from .log import (
    LogEntry,
    RunLog,
    SignalTimedOut,
    SleepStarted,
    StepCompleted,
    StepFailed,
    StepScheduled,
    WaitStarted,
)
from .resume import _Paused
from .types import NonDeterministic

if TYPE_CHECKING:
    from .host import DurableTask

__all__ = ["after_step"]


async def after_step(durable: DurableTask[Any, Any], claimed: ClaimedJob, result: bytes) -> bool:
    """Step ``claimed`` of a run of ``durable`` returned ``result``: take the run's next
    turn here if this process keeps the run paused (one turn of a run at a time: a step
    whose run is at work here waits for it). Whether its append was applied."""
    run_id = claimed.message.id.rpartition(":")[0]
    while (appending := durable._appending.get(run_id)) is not None:
        # The turn that scheduled this step, or the one after another step of a gather,
        # is still at work here: the run is kept paused once it is done.
        await appending.wait()
    kept = durable._paused.pop(run_id, None)
    if kept is None:
        return False
    durable._appending[run_id] = done = anyio.Event()
    try:
        return await turn_after_step(durable, claimed, result, kept)
    finally:
        durable._appending.pop(run_id, None)
        done.set()


async def turn_after_step(
    durable: DurableTask[Any, TOut], claimed: ClaimedJob, result: bytes, kept: _Paused
) -> bool:
    """:meth:`DurableTask.after_step <typedq.durable.host.DurableTask.after_step>` with
    the run ``durable`` keeps paused (``kept``, taken from its paused runs)."""
    message = claimed.message
    run_id, _, tail = message.id.rpartition(":")
    entries, resumable = kept.entries, kept.resumable
    position = int(tail)
    step = next(
        (e for e in entries if isinstance(e, StepScheduled) and e.position == position),
        None,
    )
    if (
        step is None
        or step.task != message.task
        or any(
            isinstance(e, StepCompleted | StepFailed) and e.position == position for e in entries
        )
    ):
        resumable.close()
        return False
    try:
        fresh: list[LogEntry] = [StepCompleted(position=position, task=step.task, output=result)]
        # The broker's time when the step became claimable: no decision taken here
        # records it (see below).
        now = claimed.due_at()
        try:
            decision: Decision[TOut] | None = await resumable.advance(
                RunLog([*entries, *fresh]), now
            )
        except NonDeterministic:
            decision = None
        if not isinstance(decision, ScheduleSteps | Completed) or any(
            isinstance(e, SleepStarted | WaitStarted | SignalTimedOut) for e in decision.append
        ):
            # Timed or failing: the step's completion wakes a turn, which replays with
            # the broker's time.
            resumable.close()
            return False
        appended = [*fresh, *decision.append]
        try:
            append, _ = durable._decide(
                run_id, len(kept.blobs), message.run_queue, {}, decision, appended, now
            )
        except ConfigError:
            resumable.close()
            return False
        append = msgspec.structs.replace(append, fence=(message.id, claimed.token, message.queue))
        outcome = await durable._app.client.append_run(append)
    except BaseException:
        resumable.close()
        raise
    applied = outcome is AppendOutcome.APPENDED
    if applied and resumable.paused and append.state is RunState.RUNNING:
        durable._keep(
            resumable, kept.created_at, kept.input, kept.blobs, entries, appended,
            append.entries,
        )  # fmt: skip
    else:
        resumable.close()
    return applied
