"""Durable runs on a broker: ``@app.durable``, :class:`DurableTask`, :class:`RunHandle`,
and the run's turn, which a worker runs.

A run becomes work as **turns** (see :mod:`typedq.broker.runs`): each is a job of the
internal task ``typedq.run.<name>`` on the run's queue, enqueued by the broker when the
run is created, when a step it waits on finishes, when its timer is due and when a
signal it waits for arrives. A turn reads the run, records the outcomes of its finished
steps (read from the step jobs' records) and a waiting signal's payload, replays the
function (:func:`~typedq.durable.replay`) and appends what the replay decided with one
compare-and-append, which also carries the jobs of the steps it schedules (stored with
it: one call on Redis; a step job's id is ``run_id:position``, so storing it twice is one
job), and the run waits or finishes.
A turn that loses the compare-and-append reads the run again and replays again.
"""

from __future__ import annotations

import sys
import traceback
from collections import OrderedDict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import anyio
import msgspec
import pydantic

from ..broker.base import ClaimedJob, JobMessage, JobState
from ..broker.runs import (
    AppendOutcome,
    RunAppend,
    RunRecord,
    RunSignal,
    RunSpec,
    RunState,
    SignalOutcome,
)
from ..errors import (
    ConfigError,
    FailureReason,
    FailureRecord,
    JobCancelled,
    JobFailed,
    JobNotFound,
    ResultTimeout,
)
from ..failures import type_name
from ..job import decode_failure
from ..names import check_job_id, new_job_id
from ..serde import Codec, codec_for, is_model_type
from ..task import TIn, TOut
from .log import (
    Emitted,
    LogEntry,
    RunLog,
    SignalReceived,
    StepCompleted,
    StepFailed,
    StepScheduled,
    decode_entries,
    encode_entries,
    same_event,
)
from .onward import after_step
from .replay import (
    Completed,
    Decision,
    DurableFunction,
    Failed,
    ScheduleSteps,
    SleepUntil,
    WaitForSignal,
)
from .resume import MAX_PAUSED, Resumable, _Paused
from .types import NonDeterministic, Signal, TPayload

if TYPE_CHECKING:
    from ..app import App
    from ..task import Task

__all__ = ["DurableDecorator", "DurableTask", "RunHandle", "RunTurn", "TURN_PREFIX", "TURN_RETRIES"]

T = TypeVar("T")

#: The models of the events a watcher reads (``RunHandle.emitted``).
E1 = TypeVar("E1", bound=msgspec.Struct | pydantic.BaseModel)
E2 = TypeVar("E2", bound=msgspec.Struct | pydantic.BaseModel)
E3 = TypeVar("E3", bound=msgspec.Struct | pydantic.BaseModel)

#: The prefix of a durable function's turn task: ``typedq.run.<name>``.
TURN_PREFIX = "typedq.run."

#: A turn task's default retries (a turn is a replay: running it again is safe).
TURN_RETRIES = 10

#: How many times a turn reads the run again after losing a compare-and-append, or
#: after recording a signal it found waiting, before it gives up (the turn job fails
#: and is retried).
_MAX_ROUNDS = 100


class RunTurn(msgspec.Struct, frozen=True):
    """The input of a run's turn job: which run to replay."""

    run_id: str


class DurableDecorator(Protocol):
    """What ``@app.durable(...)`` with options returns: the decorator proper."""

    def __call__(self, fn: DurableFunction[TIn, TOut], /) -> DurableTask[TIn, TOut]: ...


class DurableTask(Generic[TIn, TOut]):
    """A durable function of an app (``@app.durable``): start runs of it.

    Its options (``queue``, ``retries``, ``timeout``...) are those of its turn task
    ``typedq.run.<name>``: the queue its turns go to, and how a turn that fails (a
    broker error, a crash) is retried. Its steps keep their own tasks' options.
    """

    def __init__(
        self,
        fn: DurableFunction[TIn, TOut],
        *,
        app: App,
        name: str,
        input_type: type[Any],
        output_type: type[Any],
    ) -> None:
        self.fn = fn
        self.name = name
        self._app = app
        self.input: Codec[TIn] = codec_for(input_type)
        self.output: Codec[TOut] = codec_for(output_type)
        self.turn_task: Task[RunTurn, None]  # set by App.durable, which registers it
        #: Runs paused at their last turn in this process, by run id, oldest first.
        self._paused: OrderedDict[str, _Paused] = OrderedDict()
        #: Runs whose append a step's worker awaits here (after_step), by run id: a step
        #: that append schedules may return before it is answered, and waits for it.
        self._appending: dict[str, anyio.Event] = {}

    def __repr__(self) -> str:
        return f"DurableTask({self.name!r})"

    #: Paused runs kept per process (see :data:`MAX_PAUSED`).
    max_paused = MAX_PAUSED

    @property
    def queue(self) -> str:
        """Where its turns go."""
        return self.turn_task.options.queue

    async def start(self, inp: TIn, *, run_id: str | None = None) -> RunHandle[TOut]:
        """Start a run on ``inp`` (idempotent by ``run_id``: starting an id that exists
        returns the existing run's handle, whatever ``inp``)."""
        run_id = new_job_id() if run_id is None else check_job_id(run_id)
        spec = RunSpec(
            id=run_id,
            name=self.name,
            queue=self.queue,
            turn_task=self.turn_task.name,
            turn_payload=self.turn_task.input.encode(RunTurn(run_id)),
            input=self.input.encode(inp),
            fingerprint=self.input.fingerprint,
        )
        await self._app.client.create_run(spec)
        return self.handle(run_id)

    def handle(self, run_id: str) -> RunHandle[TOut]:
        """The handle of an existing run (no broker call)."""
        return RunHandle(run_id, self)

    # -- the turn (a worker runs it as the job of the turn task) --------------------------

    async def turn(self, run_id: str) -> None:
        """Replay the run once more and carry out the decision (see the module doc).

        A run this process paused at its last turn, whose log is still exactly what that
        turn left, goes on from its pause instead (:mod:`typedq.durable.resume`).
        """
        broker = self._app.broker
        for _ in range(_MAX_ROUNDS):
            record = await self._app.client.read_run(run_id)
            kept = self._paused.pop(run_id, None)
            if record is None or record.state.is_final:
                if kept is not None:
                    kept.resumable.close()
                return
            if kept is not None and not kept.expects(record):
                kept.resumable.close()
                kept = None
            if kept is None:
                entries = [e for blob in record.log for e in decode_entries(blob)]
                resumable = Resumable(
                    self.fn,
                    self.input.decode(record.spec.input),
                    run_id,
                    pause=self.max_paused > 0,
                )
            else:
                entries, resumable = kept.entries, kept.resumable
            try:
                fresh = await self._outcomes(record, entries)
                log = RunLog([*entries, *fresh])
                # The broker's time at the read (one round trip less per turn), else asked.
                now = record.read_at or await broker.broker_time_us() / 1_000_000
                try:
                    decision: Decision[TOut] = await resumable.advance(log, now)
                except NonDeterministic as exc:
                    decision = Failed(error=exc)
                appended = [*fresh, *decision.append]
                try:
                    append, again = self._act(record, decision, appended, now)
                except ConfigError as exc:
                    # A step of a task this app does not have: no turn can ever run it.
                    append, again = self._act(record, Failed(error=exc), appended, now)
                # A step this append schedules may return here before it is answered:
                # its after_step waits for the run kept paused below.
                self._appending[run_id] = answered = anyio.Event()
                try:
                    outcome = await self._app.client.append_run(append)
                finally:
                    self._appending.pop(run_id, None)
                    answered.set()
            except BaseException:
                resumable.close()
                raise
            if (
                outcome is AppendOutcome.APPENDED
                and resumable.paused
                and append.state is RunState.RUNNING
            ):
                self._keep(
                    resumable,
                    record.created_at,
                    record.spec.input,
                    record.log,
                    entries,
                    appended,
                    append.entries,
                )
            else:
                resumable.close()
            if outcome is AppendOutcome.APPENDED and not again:
                return
            if outcome in (AppendOutcome.FINISHED, AppendOutcome.NOT_FOUND):
                return
        raise RuntimeError(f"run {run_id}: no turn settled after {_MAX_ROUNDS} rounds")

    async def after_step(self, claimed: ClaimedJob, result: bytes) -> bool:
        """The run's next turn, taken here by the worker of the step it waited on (the
        run is paused here), as that step returns ``result``, before the step's job is
        completed (:mod:`typedq.durable.onward`).

        :returns: whether its append was applied (else the step's completion wakes a
            turn job, as usual)
        """
        return await after_step(self, claimed, result)

    def close_paused(self) -> None:
        """Close every run this process keeps paused (their next turns replay from the top)."""
        while self._paused:
            _, kept = self._paused.popitem(last=False)
            kept.resumable.close()

    def _keep(
        self,
        resumable: Resumable[TIn, TOut],
        created_at: float,
        input: bytes,
        log: tuple[bytes, ...],
        entries: list[LogEntry],
        appended: list[LogEntry],
        blobs: tuple[bytes, ...],
    ) -> None:
        """Keep a paused run (created at ``created_at`` on ``input``) for its next turn
        here, with the log that turn must read: ``entries`` read (encoded: ``log``), then
        ``appended`` (encoded one per blob in ``blobs``, and a taken signal's entry after
        them, which is decoded)."""
        if self.max_paused <= 0:
            resumable.close()
            return
        self._paused[resumable.run_id] = _Paused(
            resumable=resumable,
            created_at=created_at,
            input=input,
            blobs=(*log, *blobs),
            entries=[
                *entries,
                *appended,
                *(e for blob in blobs[len(appended) :] for e in decode_entries(blob)),
            ],
        )
        while len(self._paused) > self.max_paused:
            _, oldest = self._paused.popitem(last=False)
            oldest.resumable.close()

    async def fail_run(self, run_id: str, error: Exception, *, attempts: int) -> None:
        """End a running run as failed because its turn failed ``attempts`` times (the
        turn job's last attempt): a compare-and-append of the failure, read again on a
        conflict. Nothing when it has ended already."""
        broker = self._app.broker
        for _ in range(_MAX_ROUNDS):
            [record] = await broker.get_runs([run_id])
            if record is None or record.state.is_final:
                return
            now = record.read_at or await broker.broker_time_us() / 1_000_000
            failure = msgspec.structs.replace(
                _failure(error, now),
                message=f"the run's turn failed {attempts} times, the last with: {error}",
            )
            append = RunAppend(
                run_id=run_id, expected=len(record.log), state=RunState.FAILED, failure=failure
            )
            [outcome] = await broker.append_runs([append])
            if outcome is not AppendOutcome.CONFLICT:
                return

    async def _outcomes(self, record: RunRecord, entries: Sequence[LogEntry]) -> list[LogEntry]:
        """The outcomes of the scheduled steps whose jobs have ended, not yet logged: those
        the broker kept with the run, else the jobs' own records."""
        done = {e.position for e in entries if isinstance(e, StepCompleted | StepFailed)}
        open_steps = [e for e in entries if isinstance(e, StepScheduled) and e.position not in done]
        if not open_steps:
            return []
        ids = [f"{record.spec.id}:{e.position}" for e in open_steps]
        unknown = [job_id for job_id in ids if job_id not in record.outcomes]
        read = dict(zip(unknown, await self._app.broker.get(unknown), strict=True))
        out: list[LogEntry] = []
        for step, job_id in zip(open_steps, ids, strict=True):
            kept = record.outcomes.get(job_id)
            if kept is not None:
                out.extend(_outcome(step, job_id, kept.state, kept.result, kept.error))
            elif (job := read.get(job_id)) is not None:
                out.extend(_outcome(step, job_id, job.state, job.result, job.error))
        return out

    def _act(
        self, record: RunRecord, decision: Decision[TOut], entries: list[LogEntry], now: float
    ) -> tuple[RunAppend, bool]:
        """The append that records ``decision`` (with the jobs of the steps it schedules);
        and whether the turn goes on (a waiting signal was taken: replay at once)."""
        return self._decide(
            record.spec.id, len(record.log), record.spec.queue, record.inbox,
            decision, entries, now,
        )  # fmt: skip

    def _decide(
        self,
        run_id: str,
        expected: int,
        queue: str,
        inbox: Mapping[str, tuple[bytes, ...]],
        decision: Decision[TOut],
        entries: list[LogEntry],
        now: float,
    ) -> tuple[RunAppend, bool]:
        """:meth:`_act` for run ``run_id`` on ``queue`` whose log has ``expected``
        entries and whose inbox is ``inbox`` (as far as the caller knows)."""
        blobs = tuple(encode_entries([e]) for e in entries)
        recorded = tuple(
            f"{run_id}:{e.position}" for e in entries if isinstance(e, StepCompleted | StepFailed)
        )
        base = RunAppend(run_id=run_id, expected=expected, entries=blobs, recorded_jobs=recorded)
        if isinstance(decision, ScheduleSteps):
            # The step jobs go with the append (RunAppend.steps): stored in the same
            # call where the broker can, else before it. A step job's id is
            # ``run_id:position``, so storing it twice is one job.
            steps = self._step_jobs(decision, queue)
            waits = [r.key for r in decision.schedule]
            waits += [f"{run_id}:{p}" for p in decision.pending]
            return msgspec.structs.replace(base, wait_jobs=tuple(waits), steps=steps), False
        if isinstance(decision, SleepUntil):
            return msgspec.structs.replace(base, wake_at=decision.until), False
        if isinstance(decision, WaitForSignal):
            kept = inbox.get(decision.signal)
            if kept:
                got = SignalReceived(
                    position=decision.position, signal=decision.signal, payload=kept[0]
                )
                taken = (*blobs, encode_entries([got]))
                return (
                    msgspec.structs.replace(base, entries=taken, take_signal=decision.signal),
                    True,
                )
            return (
                msgspec.structs.replace(
                    base, wait_signal=decision.signal, wake_at=decision.deadline
                ),
                False,
            )
        if isinstance(decision, Completed):
            result = self.output.encode(decision.result)
            return (
                msgspec.structs.replace(base, state=RunState.COMPLETED, result=result),
                False,
            )
        assert isinstance(decision, Failed)
        return (
            msgspec.structs.replace(
                base, state=RunState.FAILED, failure=_failure(decision.error, now)
            ),
            False,
        )

    def _step_jobs(self, decision: ScheduleSteps, run_queue: str) -> tuple[JobMessage, ...]:
        """The jobs of the steps ``decision`` schedules.

        :raises ConfigError: a step of a task the app does not have
        """
        tasks = self._app.tasks
        messages = []
        for request in decision.schedule:
            task = tasks.get(request.task)
            if task is None:
                raise ConfigError(
                    f"run {self.name!r} asks for a step of task {request.task!r}, which app "
                    f"{self._app.name!r} does not have: a step runs a task of the run's own app"
                )
            messages.append(
                JobMessage(
                    id=request.key,
                    task=request.task,
                    queue=task.queue_for(request.key),
                    payload=request.payload,
                    fingerprint=task.input.fingerprint,
                    # The broker that finishes the step tells the run (on this queue).
                    run_queue=run_queue,
                )
            )
        return tuple(messages)


def _outcome(
    step: StepScheduled, job_id: str, state: JobState, result: bytes | None, error: bytes | None
) -> list[LogEntry]:
    if not state.is_final:
        return []
    if state is JobState.COMPLETED:
        return [StepCompleted(position=step.position, task=step.task, output=result or b"")]
    failure = decode_failure(error, job_id)
    return [StepFailed(position=step.position, task=step.task, failure=failure)]


def _failure(error: Exception, now: float) -> FailureRecord:
    return FailureRecord(
        reason=FailureReason.ERROR,
        error_type=type_name(error),
        message=str(error),
        attempt=0,
        retryable=False,
        traceback="".join(traceback.format_exception(error)),
        failed_at=now,
    )


class RunHandle(Generic[TOut]):
    """A run of a durable function: signal it, await its result, watch its typed events
    (:meth:`emitted`) or its timeline (:meth:`events`), cancel it."""

    def __init__(self, run_id: str, durable: DurableTask[Any, TOut]) -> None:
        self.run_id = run_id
        self._durable = durable

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, {self._durable.name!r})"

    async def record(self) -> RunRecord:
        """The run as the broker holds it.

        :raises JobNotFound: no such run
        """
        [record] = await self._durable._app.broker.get_runs([self.run_id])
        if record is None:
            raise JobNotFound(f"no durable run {self.run_id!r}")
        return record

    async def send(self, signal: Signal[TPayload], payload: TPayload) -> SignalOutcome:
        """Deliver ``payload`` on ``signal``: kept until the run waits for it (oldest first).

        :returns: ``DELIVERED``, or ``FINISHED`` when the run has already ended (nothing
            is kept)
        :raises JobNotFound: no such run
        """
        item = RunSignal(run_id=self.run_id, signal=signal.name, payload=signal.encode(payload))
        [outcome] = await self._durable._app.broker.signal_runs([item])
        if outcome is SignalOutcome.NOT_FOUND:
            raise JobNotFound(f"no durable run {self.run_id!r}")
        return outcome

    async def result(self, timeout: float | None = None) -> TOut:
        """The run's result, once it has completed.

        :raises JobFailed: it failed (``JobCancelled``: it was cancelled), with the record
        :raises ResultTimeout: not finished within ``timeout`` seconds
        """
        # The broker wakes the wait when the run ends (no polling): a log that could
        # never grow that long (``seen``) asks for the end only. Its reads go with those
        # of the process's other waits and turns (Client.read_run).
        broker = self._durable._app.broker
        read = self._durable._app.client.read_run
        with anyio.move_on_after(timeout):
            while True:
                record = await broker.wait_run(self.run_id, sys.maxsize, None, reader=read)
                if record is None:
                    raise JobNotFound(f"no durable run {self.run_id!r}")
                if record.state.is_final:
                    return self._finished(record)
        raise ResultTimeout(f"run {self.run_id} did not finish within {timeout}s")

    def _finished(self, record: RunRecord) -> TOut:
        if record.state is RunState.COMPLETED:
            return self._durable.output.decode(record.result or b"")
        failure = record.failure or FailureRecord(
            reason=FailureReason.ERROR, error_type="Unknown", message="", attempt=0,
            retryable=False,
        )  # fmt: skip
        if record.state is RunState.CANCELLED:
            raise JobCancelled(self.run_id, self._durable.name, failure)
        raise JobFailed(self.run_id, self._durable.name, failure)

    async def cancel(self) -> bool:
        """End the run (state ``cancelled``) and cancel the steps it waits on.

        :returns: False if it had already finished
        """
        [cancelled] = await self._durable._app.broker.cancel_runs([self.run_id])
        return cancelled

    async def events(self) -> AsyncIterator[LogEntry]:
        """The run's timeline: every entry of its log (steps scheduled and ended, sleeps,
        waits, signals, emits, patch markers), oldest first, as they are appended; ends
        when the run has ended.

        This is the view for tools; a watcher of the run's events reads them typed with
        :meth:`emitted`. An ``Emitted`` entry holds the event model's name and its encoded
        payload. The broker wakes the iteration when the log grows or the run ends (no
        polling). A run that retention removes after its end, before this read its last
        entries, ends the iteration there.

        :raises JobNotFound: no such run
        """
        broker = self._durable._app.broker
        read = self._durable._app.client.read_run
        seen = 0
        while True:
            record = await broker.wait_run(self.run_id, seen, None, reader=read)
            if record is None:
                if seen == 0:
                    raise JobNotFound(f"no durable run {self.run_id!r}")
                return  # ended, and retention has removed it since
            for blob in record.log[seen:]:
                for entry in decode_entries(blob):
                    yield entry
            seen = len(record.log)
            if record.state.is_final:
                return

    @overload
    def emitted(self, model: type[E1], /) -> AsyncIterator[E1]: ...
    @overload
    def emitted(self, model: type[E1], model2: type[E2], /) -> AsyncIterator[E1 | E2]: ...
    @overload
    def emitted(
        self, model: type[E1], model2: type[E2], model3: type[E3], /
    ) -> AsyncIterator[E1 | E2 | E3]: ...

    async def emitted(self, *models: type[Any]) -> AsyncIterator[Any]:
        """The events the run emits (``run.emit(...)``) of the given models, decoded and
        validated, oldest first, as they are appended; ends when the run has ended.

        ``async for p in handle.emitted(Progress)`` gives ``Progress`` values (mypy knows);
        with two or three models, their union (tell them apart with ``isinstance`` or
        ``match``). Events of other models are skipped. A watcher that starts late still
        sees every event from the first: the log keeps them.

        :raises ConfigError: no model given, or one that is not a msgspec Struct or
            Pydantic model
        """
        if not models:
            raise ConfigError("RunHandle.emitted needs the event models to read, e.g. (Progress)")
        for model in models:
            if not is_model_type(model):
                raise ConfigError(
                    f"RunHandle.emitted takes event models (msgspec Struct or Pydantic model "
                    f"classes), got {model!r}"
                )
        codecs = [(model, codec_for(model)) for model in models]
        async for entry in self.events():
            if not isinstance(entry, Emitted):
                continue
            for model, codec in codecs:
                if same_event(entry.event, model):
                    yield codec.decode(entry.payload)
                    break
