"""Inspection queries: look at an app's queues and act on its jobs.

:class:`Inspector` is the library side (usable from code and tests, shared by ``typedq
inspect`` and the dashboard): counts per state per queue, job listings with their
structured error records, and retry / cancel / purge by id or for a whole state, in pages
(bounded work per broker call) with a progress callback. It answers with plain
structures (msgspec structs) and draws nothing: the ``rich`` tables of ``typedq inspect``
are :mod:`typedq.cli.render`, and ``--json`` prints these structures as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio
import msgspec

from .broker import redact_url
from .broker.base import CancelOutcome, JobState, WorkerInfo
from .broker.capabilities import Schedules, supports
from .broker.flow import HELD_AT, member_id, step_id, waits_for
from .broker.runs import RunSignal, SignalOutcome
from .client import Client
from .errors import ConfigError
from .schedule import Schedule
from .views.jobs import JobDetail, JobView, attempt_records, job_detail, job_view, plain_data
from .views.partitions import partition_of, partition_totals
from .views.runs import (
    RUN_ENTRY_LABELS,
    RunEntryView,
    RunView,
    run_detail,
    run_view,
    run_waiting,
)
from .views.schedules import ScheduleView, schedule_view

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
        """The schedules with their next and last fire times, by name (none on a broker
        without schedules: it can hold none)."""
        broker = self.client.broker
        if not supports(broker, Schedules):
            return []
        states = {s.name: s for s in await broker.schedule_states()}
        declared = self.declared or {}
        if not states and not declared:
            return []
        now = await broker.broker_time_us()
        return [
            schedule_view(name, states.get(name), declared.get(name), now)
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
        return [job_view(r) for r in records if r is not None]

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
        page = [None if r is None else job_view(r) for r in members]
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
                job_view(r), waits_for=waits_for(shape, r.message.id, r.run_at)
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
        detail = job_detail(record)
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
