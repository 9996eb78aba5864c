"""The embedded broker's durable runs (capability ``Runs``; values in
:mod:`typedq.broker.runs`): each run's record, and the turns it enqueues.

A turn is a job of the run's turn task on its queue (see :mod:`typedq.broker.runs`). The
store enqueues one when a run is created, when a job it waits on reaches a final state
(:meth:`RunStore.job_finished`, called where the job path finishes a job), when a signal
it waits for arrives, and at its timer (a turn job with an ``eta``). At most one
immediate turn of a run waits at a time; a turn that finds nothing to do (a timer that
a signal beat) replays to the same decision and appends nothing.

Ended runs are kept as finished jobs are (:class:`~typedq.broker.settings.Retention`):
completed ones within ``completed_ttl``/``completed_max``, failed and cancelled ones
within ``failed_ttl``/``failed_max`` (each final state counted on its own), the oldest
dropped first; a run past its age bound reads as none.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

import anyio
import msgspec

from ...errors import FailureRecord
from ..base import JobMessage, JobState
from ..runs import (
    AppendOutcome,
    RunAppend,
    RunRecord,
    RunSignal,
    RunSpec,
    RunState,
    SignalOutcome,
    StepOutcome,
)

if TYPE_CHECKING:
    from .core import JobPath
    from .jobs import Job

__all__ = ["RunStore"]


class StoredRun:
    """One run as the embedded broker holds it (mutable; snapshots are RunRecords)."""

    __slots__ = (
        "created_at",
        "failure",
        "finished_at",
        "inbox",
        "log",
        "outcomes",
        "recorded",
        "result",
        "spec",
        "state",
        "turn",
        "turns",
        "wait_jobs",
        "wait_signal",
        "wake_at",
    )

    def __init__(self, spec: RunSpec, now: float) -> None:
        self.spec = spec
        self.state = RunState.RUNNING
        self.log: list[bytes] = []
        self.inbox: dict[str, deque[bytes]] = {}
        self.created_at = now
        self.finished_at = 0.0
        self.result: bytes | None = None
        self.failure: FailureRecord | None = None
        self.wait_jobs: tuple[str, ...] = ()
        self.wait_signal: str | None = None
        self.wake_at: float | None = None
        self.outcomes: dict[str, StepOutcome] = {}
        #: Step jobs whose outcomes an append recorded before they ended (a fenced
        #: append, RunAppend.fence): their end is not kept again (Redis: the '' marks).
        self.recorded: set[str] = set()
        #: The id of the last immediate turn enqueued (skip another while it waits).
        self.turn: str | None = None
        #: Turns enqueued so far: the next turn's id suffix.
        self.turns = 0

    def snapshot(self) -> RunRecord:
        return RunRecord(
            spec=self.spec,
            state=self.state,
            log=tuple(self.log),
            inbox={name: tuple(q) for name, q in self.inbox.items() if q},
            created_at=self.created_at,
            finished_at=self.finished_at,
            result=self.result,
            failure=self.failure,
            wait_jobs=self.wait_jobs,
            wait_signal=self.wait_signal,
            wake_at=self.wake_at,
            outcomes=dict(self.outcomes),
        )


class RunStore:
    """Every run of an embedded broker, and which run waits on which job."""

    def __init__(self, broker: JobPath) -> None:
        self._broker = broker
        self.runs: dict[str, StoredRun] = {}
        #: job id -> the runs waiting on it (see :meth:`job_finished`).
        self.by_job: dict[str, set[str]] = {}
        #: Ended runs per final state, run id -> when it ended, oldest first (retention).
        self.ended: dict[RunState, OrderedDict[str, float]] = {
            state: OrderedDict()
            for state in (RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)
        }
        #: run id -> the event its waiters (:meth:`wait`) wait on: set when its log grows
        #: or it ends.
        self.watchers: dict[str, anyio.Event] = {}

    # -- the capability's operations (MemoryBroker checks the connection) ----------------

    def create(self, spec: RunSpec) -> tuple[bool, RunRecord]:
        self.expire()
        run = self.runs.get(spec.id)
        if run is not None:
            return False, run.snapshot()
        run = self.runs[spec.id] = StoredRun(spec, self._broker.clock.time())
        self.wake(run, 0.0)
        return True, run.snapshot()

    def get(self, run_id: str) -> RunRecord | None:
        self.expire()
        run = self.runs.get(run_id)
        if run is None:
            return None
        # The broker's µs clock (floored, as broker_time_us reads it).
        read_at = math.floor(self._broker.clock.time() * 1_000_000) / 1_000_000
        return msgspec.structs.replace(run.snapshot(), read_at=read_at)

    def append(self, item: RunAppend) -> AppendOutcome:
        self.expire()
        run = self.runs.get(item.run_id)
        if run is None:
            return AppendOutcome.NOT_FOUND
        if run.state.is_final:
            return AppendOutcome.FINISHED
        if item.fence is not None and not self.holds(item.fence):
            return AppendOutcome.FENCED
        if len(run.log) != item.expected:
            return AppendOutcome.CONFLICT
        if item.take_signal is not None:
            waiting = run.inbox.get(item.take_signal)
            if not waiting:
                return AppendOutcome.CONFLICT  # only appends take: cannot happen when fenced
            waiting.popleft()
        run.log.extend(item.entries)
        if item.entries:
            self._changed(run)
        self._unwait(run)
        if item.state.is_final:
            self._finish(run, item.state, item.result, item.failure)
            return AppendOutcome.APPENDED
        run.wait_jobs, run.wait_signal, run.wake_at = item.wait_jobs, item.wait_signal, item.wake_at
        # The outcomes this append records are in the log now; the others stay (a job
        # that ended after the turn's read).
        jobs = self._broker.table.jobs
        for job_id in item.recorded_jobs:
            run.outcomes.pop(job_id, None)
            recorded = jobs.get(job_id)
            if recorded is None or not recorded.state.is_final:
                run.recorded.add(job_id)  # it ends later: not kept then
        for job_id in item.wait_jobs:
            self.by_job.setdefault(job_id, set()).add(run.spec.id)
        now = self._broker.clock.time()
        # A wait already over when it is set wakes the run at once (a step: a job that
        # carries its run's queue, see job_finished).
        if (
            any(
                (job := jobs.get(job_id)) is not None
                and job.state.is_final
                and job.message.run_queue
                for job_id in item.wait_jobs
            )
            or (item.wait_signal is not None and run.inbox.get(item.wait_signal))
            or (item.wake_at is not None and item.wake_at <= now)
        ):
            self.wake(run, 0.0)
        elif item.wake_at is not None:
            self.wake(run, item.wake_at)
        return AppendOutcome.APPENDED

    def holds(self, fence: tuple[str, str, str]) -> bool:
        """Whether job ``fence[0]`` is active under token ``fence[1]`` (RunAppend.fence)."""
        job = self._broker.table.jobs.get(fence[0])
        return job is not None and job.state is JobState.ACTIVE and job.active_token == fence[1]

    def signal(self, item: RunSignal) -> SignalOutcome:
        self.expire()
        run = self.runs.get(item.run_id)
        if run is None:
            return SignalOutcome.NOT_FOUND
        if run.state.is_final:
            return SignalOutcome.FINISHED
        run.inbox.setdefault(item.signal, deque()).append(item.payload)
        if run.wait_signal == item.signal:
            self.wake(run, 0.0)
        return SignalOutcome.DELIVERED

    def wake_run(self, run_id: str, at: float) -> bool:
        self.expire()
        run = self.runs.get(run_id)
        if run is None or run.state.is_final:
            return False
        self.wake(run, at)
        return True

    def cancel(self, run_id: str, failure: FailureRecord) -> tuple[str, ...] | None:
        """Cancel a running run: the jobs it waited on (to cancel), or None."""
        self.expire()
        run = self.runs.get(run_id)
        if run is None or run.state.is_final:
            return None
        waited = run.wait_jobs
        self._unwait(run)
        self._finish(run, RunState.CANCELLED, None, failure)
        return waited

    async def wait(self, run_id: str, seen: int, timeout: float | None) -> RunRecord | None:
        """The run once its log has more than ``seen`` entries or it has ended, or after
        ``timeout`` seconds (see ``Runs.wait_run``); None: no such run."""
        with anyio.move_on_after(timeout):
            while True:
                record = self.get(run_id)
                if record is None or record.state.is_final or len(record.log) > seen:
                    return record
                event = self.watchers.get(run_id)
                if event is None:
                    event = self.watchers[run_id] = anyio.Event()
                await event.wait()
        return self.get(run_id)

    def _changed(self, run: StoredRun) -> None:
        """Its log grew or it ended: wake its waiters."""
        event = self.watchers.pop(run.spec.id, None)
        if event is not None:
            event.set()

    # -- retention ------------------------------------------------------------------

    def _bounds(self, state: RunState) -> tuple[float, int]:
        retention = self._broker.settings.retention
        if state is RunState.COMPLETED:
            return retention.completed_ttl, retention.completed_max
        return retention.failed_ttl, retention.failed_max

    def trim(self, state: RunState, now: float) -> None:
        """Drop the oldest ended runs of ``state`` past its count or age bound."""
        ttl, cap = self._bounds(state)
        ended = self.ended[state]
        for _ in range(len(ended) - cap):
            self.runs.pop(ended.popitem(last=False)[0], None)
        expired = now - ttl
        while ended:
            run_id, finished_at = next(iter(ended.items()))
            if finished_at > expired:
                break
            del ended[run_id]
            self.runs.pop(run_id, None)

    def expire(self) -> None:
        """Drop the ended runs past their age bound (before any operation reads one)."""
        now = self._broker.clock.time()
        for state, ended in self.ended.items():
            if ended:
                self.trim(state, now)

    # -- the job path's hook -----------------------------------------------------------

    def job_finished(self, job: Job) -> None:
        """A job reached a final state: if it is a step of a running run (id
        ``run_id:position``, carrying the run's queue: ``JobMessage.run_queue``, which
        the Redis broker needs to find the run), keep its outcome with the run, so that
        the job's own record may go before a turn reads it; wake every run waiting on it.
        Any other job is no run's business."""
        message = job.message
        if not message.run_queue:
            if job.state is JobState.FAILED:
                self._turn_failed(job)
            return
        job_id = message.id
        run_id, _, position = job_id.rpartition(":")
        run = self.runs.get(run_id) if position.isdigit() else None
        if run is not None and not run.state.is_final:
            if job_id in run.recorded:
                run.recorded.discard(job_id)  # its outcome is in the log already
                return
            run.outcomes[job_id] = StepOutcome(state=job.state, result=job.result, error=job.error)
        for waiting_id in self.by_job.pop(job_id, ()):
            waiting = self.runs.get(waiting_id)
            if waiting is not None and not waiting.state.is_final:
                self.wake(waiting, 0.0)

    def _turn_failed(self, job: Job) -> None:
        """A job that is no step failed for good: when it is a turn of a running run (id
        ``run_id:t<n>``, of the run's turn task), no turn comes again, so the run fails
        with the turn's failure record."""
        run_id, _, tail = job.message.id.rpartition(":")
        if not (tail[:1] == "t" and tail[1:].isdigit()):
            return
        run = self.runs.get(run_id)
        if run is None or run.state.is_final or job.message.task != run.spec.turn_task:
            return
        try:
            failure = msgspec.msgpack.decode(job.error or b"", type=FailureRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            failure = None
        self._unwait(run)
        self._finish(run, RunState.FAILED, None, failure)

    # -- internals ---------------------------------------------------------------------

    def wake(self, run: StoredRun, at: float) -> None:
        """Enqueue a turn of ``run``: now (``at`` 0 or past) or at ``at``."""
        broker = self._broker
        now = broker.clock.time()
        immediate = at <= now
        if immediate and run.turn is not None:
            queued = broker.table.jobs.get(run.turn)
            if queued is not None and queued.state is JobState.WAITING:
                return
        run.turns += 1
        turn_id = f"{run.spec.id}:t{run.turns}"
        # Past max_queue_length too: a turn is the run's own continuation (as a flow's
        # hand-off is), never refused (the Redis broker's run scripts do the same).
        broker.lines.add(
            [
                JobMessage(
                    id=turn_id,
                    task=run.spec.turn_task,
                    queue=run.spec.queue,
                    payload=run.spec.turn_payload,
                    eta=0.0 if immediate else at,
                )
            ],
            now,
        )
        if immediate:
            run.turn = turn_id
        broker.wake()

    def _unwait(self, run: StoredRun) -> None:
        for job_id in run.wait_jobs:
            waiting = self.by_job.get(job_id)
            if waiting is not None:
                waiting.discard(run.spec.id)
                if not waiting:
                    del self.by_job[job_id]
        run.wait_jobs, run.wait_signal, run.wake_at = (), None, None

    def _finish(
        self,
        run: StoredRun,
        state: RunState,
        result: bytes | None,
        failure: FailureRecord | None,
    ) -> None:
        run.state = state
        run.result = result
        run.failure = failure
        run.outcomes = {}  # an ended run replays no more
        run.finished_at = now = self._broker.clock.time()
        self.ended[state][run.spec.id] = now
        self.trim(state, now)
        self._changed(run)
