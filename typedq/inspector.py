"""Inspection queries: look at an app's queues and act on its jobs.

:class:`Inspector` is the library side (usable from code and tests, shared by ``typedq
inspect`` and the dashboard): counts per state per queue, job listings with their
structured error records, and retry / cancel / purge by id or for a whole state, in pages
(bounded work per broker call) with a progress callback. It answers with plain
structures (msgspec structs) and draws nothing: the ``rich`` tables of ``typedq inspect``
are :mod:`typedq.cli.render`, and ``--json`` prints these structures as they are.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import anyio
import msgspec

from .broker import redact_url
from .broker.base import CancelOutcome, JobRecord, JobState, ScheduleState, WorkerInfo
from .broker.flow import HELD_AT, member_id, step_id, waits_for
from .broker.runs import RunRecord, RunSignal, RunState, SignalOutcome
from .client import Client
from .durable import log as durable_log
from .errors import BrokerDataError, ConfigError, FailureRecord
from .job import decode_failure
from .schedule import Schedule

__all__ = [
    "ACTIONS",
    "DONE_OUTCOMES",
    "Action",
    "ActionReport",
    "FlowView",
    "Inspector",
    "JobDetail",
    "JobView",
    "Overview",
    "RunEntryView",
    "RunView",
    "ScheduleView",
    "all_done",
    "attempt_records",
    "job_view",
    "partition_of",
    "partition_totals",
    "plain_data",
    "RUN_ENTRY_LABELS",
    "run_detail",
    "run_view",
    "run_waiting",
]

Action = Literal["retry", "cancel", "purge"]

#: The states each action applies to when it targets a whole state.
ACTIONS: dict[Action, tuple[JobState, ...]] = {
    "retry": (JobState.FAILED, JobState.CANCELLED),
    "cancel": (JobState.WAITING, JobState.SCHEDULED, JobState.ACTIVE),
    "purge": tuple(JobState),
}

#: Jobs per broker call when acting on a whole state.
PAGE = 500
#: Fan-out members per page of a flow (Inspector.flow, the dashboard's flow page).
MEMBER_PAGE = 50
_CANCEL_CONCURRENCY = 32


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """One job as ``inspect`` shows it."""

    id: str
    task: str
    queue: str
    state: JobState
    attempt: int
    priority: int
    enqueued_at: float
    finished_at: float
    error: FailureRecord | None = None
    #: When a scheduled job is due (0 otherwise), and when the current attempt started.
    run_at: float = 0.0
    started_at: float = 0.0
    #: A held workflow step (state ``scheduled``): what it waits on, e.g. "waiting for
    #: step 1 (F.1) of flow F" (see typedq.broker.flow.waits_for); "" otherwise.
    waits_for: str = ""


class JobDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One job in full (``typedq inspect --job ID``): its view, payload, result, error
    record (the last failed attempt's, with its traceback) and progress. Payload,
    result and progress are the stored msgpack decoded to plain data (as JSON shows
    them); None when absent."""

    job: JobView
    payload: Any = None
    result: Any = None
    progress: Any = None
    stalls: int = 0
    worker_id: str | None = None
    cancel_requested: bool = False
    #: Every failed attempt's record, oldest first (the broker keeps the last 10).
    attempts: list[FailureRecord] = []


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


class Overview(msgspec.Struct, frozen=True, kw_only=True):
    """Counts per state per queue, the jobs of one state (failed by default), and the
    app's schedules."""

    app: str
    broker: str
    counts: dict[str, dict[JobState, int]]
    state: JobState
    jobs: list[JobView]
    schedules: list[ScheduleView] = []
    #: Per queue, finished jobs that retention has deleted, per state (gone for good).
    trimmed: dict[str, dict[JobState, int]] = {}


class FlowView(msgspec.Struct, frozen=True, kw_only=True):
    """A workflow as ``inspect --flow ID`` shows it: its shape and where it stands.

    :ivar state: the flow's own job's state (its last step, or a fan-out's collector)
    :ivar running: False once the flow has ended (completed, failed or cancelled)
    :ivar members: fan-out members (0 for a chain); ``members_pending`` of them have not
        settled (-1 once the flow has ended); ``member_states`` counts them per state when
        one page holds them all, else the settled ones per final state while the flow
        runs (the broker counts them as they settle), else nothing (a large flow that
        has ended: see its pages)
    :ivar steps: each single step in order (``None`` for a step whose job is gone)
    :ivar member_page: the members ``members_start`` to ``members_start + len - 1``
        (``None`` for one whose job is gone): one page, read whatever the flow's size
    :ivar failed_members: the failed or cancelled members of that page
    """

    id: str
    state: JobState | None
    running: bool
    members: int
    members_pending: int
    member_states: dict[JobState, int]
    steps: list[JobView | None]
    failed_members: list[JobView]
    members_start: int = 0
    member_page: list[JobView | None] = []


class ActionReport(msgspec.Struct, frozen=True, kw_only=True):
    """What retry / cancel / purge did: the outcome per job id, and how many took effect."""

    action: Action
    state: JobState | None
    done: int
    outcomes: dict[str, str]


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


def _entry_view(run_id: str, entry: durable_log.LogEntry) -> RunEntryView:
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
        _entry_view(run_id, e) for blob in record.log for e in durable_log.decode_entries(blob)
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


def _view(record: JobRecord) -> JobView:
    message = record.message
    error = None
    if record.error is not None:
        error = decode_failure(record.error, message.id)
    return JobView(
        id=message.id,
        task=message.task,
        queue=message.queue,
        state=record.state,
        attempt=record.attempt,
        priority=message.priority,
        enqueued_at=record.enqueued_at,
        finished_at=record.finished_at,
        error=error,
        run_at=record.run_at,
        started_at=record.started_at,
    )


#: One job as ``inspect`` shows it (also the bulk actions' preview, :mod:`typedq.bulk`).
job_view = _view


def plain_data(data: bytes | None) -> Any:
    """Stored msgpack as plain data; a note instead when it does not decode (the
    inspector's job view and the dashboard's)."""
    if data is None:
        return None
    try:
        return msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return f"<{len(data)} bytes that are not msgpack>"


def attempt_records(record: JobRecord) -> list[FailureRecord]:
    """Every failed attempt's record of a job, oldest first (unreadable ones left out)."""
    out = []
    for raw in record.errors:
        try:
            out.append(decode_failure(raw, record.message.id))
        except BrokerDataError:
            continue
    return out


def _detail(record: JobRecord) -> JobDetail:
    return JobDetail(
        job=_view(record),
        payload=plain_data(record.message.payload),
        result=plain_data(record.result),
        progress=plain_data(record.progress),
        stalls=record.stalls,
        worker_id=record.worker_id,
        cancel_requested=record.cancel_requested,
        attempts=attempt_records(record),
    )


class Inspector:
    """Inspect and operate an app's jobs through a connected :class:`~typedq.Client`.

    :param client: connected to the app's broker, with the app's name
    :param queues: the queues to look at (the app's queues)
    :param schedules: the app's declared schedules (next fire times need them); None
        lists the broker's schedule states alone
    """

    def __init__(
        self,
        client: Client,
        queues: Sequence[str],
        *,
        schedules: Sequence[Schedule[Any]] | None = None,
    ) -> None:
        if not queues:
            raise ConfigError("inspect needs at least one queue (--queue NAME)")
        self.client = client
        self.queues = sorted(set(queues))
        self.declared = None if schedules is None else {s.name: s for s in schedules}

    async def schedules(self) -> list[ScheduleView]:
        """The schedules with their next and last fire times, by name."""
        broker = self.client.broker
        states = {s.name: s for s in await broker.schedule_states()}
        declared = self.declared or {}
        if not states and not declared:
            return []
        now = await broker.broker_time_us()
        return [
            _schedule_view(name, states.get(name), declared.get(name), now)
            for name in sorted(states.keys() | declared.keys())
        ]

    async def counts(self) -> dict[str, dict[JobState, int]]:
        """Jobs per state, per queue."""
        broker = self.client.broker
        return {queue: await broker.counts(queue) for queue in self.queues}

    async def jobs(self, state: JobState, *, limit: int = 20) -> list[JobView]:
        """Up to ``limit`` jobs in ``state`` per queue, with their error records."""
        ids: list[str] = []
        for queue in self.queues:
            ids += await self.client.broker.list_jobs(queue, state, limit=limit)
        records = await self.client.broker.get(ids) if ids else []
        return [_view(r) for r in records if r is not None]

    async def overview(self, state: JobState = JobState.FAILED, *, limit: int = 20) -> Overview:
        """Counts per state per queue, and the jobs of ``state``."""
        return Overview(
            app=self.client.name,
            broker=redact_url(self.client.url),
            counts=await self.counts(),
            state=state,
            jobs=await self.jobs(state, limit=limit),
            schedules=await self.schedules(),
            trimmed=await self.trimmed(),
        )

    async def trimmed(self) -> dict[str, dict[JobState, int]]:
        """Per queue (those with any), the finished jobs retention deleted, per state."""
        stats = await self.client.broker.queue_stats(self.queues) if self.queues else []
        return {s.queue: s.trimmed for s in stats if any(s.trimmed.values())}

    async def flow(
        self, job_id: str, *, start: int = 0, limit: int = MEMBER_PAGE
    ) -> FlowView | None:
        """The workflow (see :mod:`typedq.workflow`) that the job ``job_id`` belongs to
        (the flow's own job, a step or a member), or None; with one page of its fan-out
        members, ``limit`` of them from member ``start``.

        A few bounded broker calls whatever the flow's size: its shape and counts, its
        steps, and the page of members (a flow of 100,000 members is read 50 at a time).
        """
        broker = self.client.broker
        shape = await broker.flow_state(job_id)
        if shape is None:
            return None
        flow_id = shape.id
        start = max(0, min(start, max(shape.members - 1, 0)))
        end = min(shape.members, start + max(1, min(limit, PAGE)))
        ids = [step_id(flow_id, k, shape.steps) for k in range(shape.steps)]
        ids += [member_id(flow_id, i) for i in range(start, end)]
        records = await broker.get(ids)
        steps, members = records[: shape.steps], records[shape.steps :]
        page = [None if r is None else _view(r) for r in members]
        counts: dict[JobState, int] = {}
        if start == 0 and end == shape.members:
            # The page holds every member: count them all, whatever their state.
            for r in members:
                if r is not None:
                    counts[r.state] = counts.get(r.state, 0) + 1
        elif shape.pending >= 0:
            # The broker's counts of settled members (the rest: members_pending).
            settled = (shape.completed, shape.failed, shape.cancelled)
            finals = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
            counts = {s: n for s, n in zip(finals, settled, strict=True) if n}
        own = steps[-1]
        views = [
            None
            if r is None
            else msgspec.structs.replace(
                _view(r), waits_for=waits_for(shape, r.message.id, r.run_at)
            )
            for r in steps
        ]
        return FlowView(
            id=flow_id,
            state=None if own is None else own.state,
            running=shape.pending >= 0,
            members=shape.members,
            members_pending=shape.pending,
            member_states=counts,
            steps=views,
            failed_members=[
                v
                for v in page
                if v is not None and v.state in (JobState.FAILED, JobState.CANCELLED)
            ],
            members_start=start,
            member_page=page,
        )

    async def job(self, job_id: str) -> JobDetail | None:
        """One job in full, or None when there is no such job (any queue of the app)."""
        (record,) = await self.client.broker.get([job_id])
        if record is None:
            return None
        detail = _detail(record)
        if record.run_at >= HELD_AT:
            flow = await self.client.broker.flow_state(job_id)
            if flow is not None:
                view = msgspec.structs.replace(
                    detail.job, waits_for=waits_for(flow, job_id, record.run_at)
                )
                detail = msgspec.structs.replace(detail, job=view)
        return detail

    async def run(self, run_id: str) -> RunView | None:
        """A durable run in full, or None when there is no such run.

        :raises Unsupported: the broker keeps no durable runs
        """
        (record,) = await self.client.broker.get_runs([run_id])
        return None if record is None else run_view(record)

    async def cancel_run(self, run_id: str) -> bool:
        """Cancel a durable run (and the steps it waits on): False if it had ended."""
        (cancelled,) = await self.client.broker.cancel_runs([run_id])
        return cancelled

    async def signal_run(self, run_id: str, signal: str, payload: bytes) -> SignalOutcome:
        """Deliver an encoded signal payload to a run (encode it with the Signal's model:
        ``Signal.encode``, which validates it; the dashboard's signal form does).

        :returns: ``DELIVERED``, ``FINISHED`` (the run has ended) or ``NOT_FOUND``
        """
        item = RunSignal(run_id=run_id, signal=signal, payload=payload)
        (outcome,) = await self.client.broker.signal_runs([item])
        return outcome

    async def workers(self) -> list[WorkerInfo]:
        """The live workers of the app (those whose heartbeat has not expired)."""
        return await self.client.broker.list_workers()

    async def act(self, action: Action, ids: Sequence[str]) -> ActionReport:
        """Retry, cancel or purge the jobs with these ids (any queue of the app)."""
        outcomes = await self._apply(action, list(dict.fromkeys(ids)), state=None)
        return _report(action, None, outcomes)

    async def act_on_state(
        self,
        action: Action,
        state: JobState,
        *,
        progress: Callable[[int, int], None] | None = None,
    ) -> ActionReport:
        """Retry, cancel or purge every job of the inspected queues in ``state``.

        Works page by page (``PAGE`` jobs per broker call), following
        :meth:`Broker.page_jobs <typedq.broker.base.Broker.page_jobs>` cursors through
        the state once: every job in the state from the start to the end of the walk is
        acted on once. ``progress(done, total)`` is called after each page; ``total`` is
        the count when the operation started, and jobs that arrive meanwhile are not
        chased past it (those arriving behind the walk's place are not reached at all).
        """
        if state not in ACTIONS[action]:
            allowed = ", ".join(s.value for s in ACTIONS[action])
            raise ConfigError(f"cannot {action} {state.value} jobs; {action} applies to: {allowed}")
        counts = await self.counts()
        total = sum(c.get(state, 0) for c in counts.values())
        outcomes: dict[str, str] = {}
        seen = 0
        for queue in self.queues:
            remaining = counts[queue].get(state, 0)
            # One walk of the state by cursor (Broker.page_jobs): a cursor names a place
            # in the state's order, so the acted-on jobs leaving the state before it, jobs
            # that stay (a cancel requested for a running job) and other clients acting
            # meanwhile neither skip nor repeat a job that is still in the state.
            cursor: str | None = None
            while remaining > 0:
                listed = await self.client.broker.page_jobs(
                    queue, state, cursor=cursor, limit=min(PAGE, remaining)
                )
                page = [job_id for job_id in listed.ids if job_id not in outcomes]
                if page:
                    outcomes.update(await self._apply(action, page, state=state))
                    remaining -= len(page)
                    seen += len(page)
                    if progress is not None:
                        progress(min(seen, total), total)
                if listed.cursor is None:
                    break
                cursor = listed.cursor
        return _report(action, state, outcomes)

    async def _apply(
        self, action: Action, ids: list[str], *, state: JobState | None
    ) -> dict[str, str]:
        broker = self.client.broker
        if action == "retry":
            retried = await broker.retry(ids)
            return {i: o.value for i, o in zip(ids, retried, strict=True)}
        if action == "purge":
            removed = await broker.remove(ids, states=None if state is None else [state])
            return {i: "purged" if ok else "not_found" for i, ok in zip(ids, removed, strict=True)}
        # The broker cancels one job per call; many calls run concurrently, bounded.
        cancelled: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(_CANCEL_CONCURRENCY)

        async def cancel(job_id: str) -> None:
            async with limiter:
                cancelled[job_id] = (await broker.cancel(job_id)).value

        async with anyio.create_task_group() as tg:
            for job_id in ids:
                tg.start_soon(cancel, job_id)
        return {i: cancelled[i] for i in ids}


def _seconds(us: int) -> float | None:
    return us / 1_000_000 if us else None


def _schedule_view(
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


#: The outcomes of an action that took effect (the rest left the job as it was).
DONE_OUTCOMES = frozenset(
    {"retried", "purged", CancelOutcome.CANCELLED.value, CancelOutcome.REQUESTED.value}
)


def _report(action: Action, state: JobState | None, outcomes: dict[str, str]) -> ActionReport:
    done = sum(1 for o in outcomes.values() if o in DONE_OUTCOMES)
    return ActionReport(action=action, state=state, done=done, outcomes=outcomes)


def all_done(report: ActionReport) -> bool:
    """True when every job of the report was acted on (the CLI's exit status)."""
    return report.done == len(report.outcomes)


# -- partitions --------------------------------------------------------------------


_PARTITION = re.compile(r"(.+)\.p(0|[1-9][0-9]{0,2})")


def partition_of(queue: str) -> tuple[str, int] | None:
    """``("emails", 3)`` for ``emails.p3`` (a partition's name), else None."""
    match = _PARTITION.fullmatch(queue)
    return None if match is None else (match[1], int(match[2]))


def partition_totals(
    counts: Mapping[str, Mapping[JobState, int]],
) -> dict[str, tuple[int, dict[JobState, int], str]]:
    """The counts of each partitioned queue summed over its partitions (those of ``counts``
    named ``<queue>.p<n>``, at least two): ``{queue: (partitions, counts, last partition
    in sorted order)}``."""
    groups: dict[str, list[str]] = {}
    for queue in counts:
        parent = partition_of(queue)
        if parent is not None:
            groups.setdefault(parent[0], []).append(queue)
    totals: dict[str, tuple[int, dict[JobState, int], str]] = {}
    for name, members in groups.items():
        if len(members) < 2:
            continue
        summed: dict[JobState, int] = {}
        for member in members:
            for state, n in counts[member].items():
                summed[state] = summed.get(state, 0) + n
        totals[name] = (len(members), summed, max(members))
    return totals
