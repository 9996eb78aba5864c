"""What the dashboard reads: an app's broker through a connected client, and, when the
dashboard was given the App itself, its tasks (input models, for payload tables and
re-runs) and schedules. Every page is a few bounded broker calls: the overview reads
counts (O(1) per queue) and rollups, never jobs; a queue page reads one page of ids.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ..app import App
from ..broker.base import JobRecord, JobState, MinuteRollup, QueueStats, WorkerInfo
from ..broker.capabilities import FlowViews, supports
from ..broker.flow import waits_for
from ..broker.flowviews import FLOW_KINDS
from ..client import Client
from ..errors import FailureRecord, Unsupported
from ..inspector import (
    FlowView,
    Inspector,
    RunView,
    ScheduleView,
    attempt_records,
    plain_data,
)
from ..job import decode_failure
from ..producer import Producer
from ..schedule import Schedule
from ..task import TaskBase
from ..views.flowkeys import FlowKeysView, flow_keys_view

__all__ = ["JobPage", "QueuePage", "QueueRow", "Source"]

#: Jobs per queue page, and the most entries a page with a task filter looks through.
PAGE_SIZE = 50
FILTER_SCAN = 5000
#: Keys per kind the queue page shows of its flow control (``typedq inspect --fair``
#: and the like page through the rest).
FLOW_PAGE = 20
#: Minutes of history the overview charts.
CHART_MINUTES = 60


class QueueRow(msgspec.Struct, frozen=True, kw_only=True):
    """One queue on the overview: counts, the last hour's rollups and their totals."""

    stats: QueueStats
    minutes: list[MinuteRollup]
    completed: int
    failed: int
    retried: int

    @property
    def failure_rate(self) -> float:
        """Final failures per finished job over the last hour (0 when none finished)."""
        done = self.completed + self.failed
        return self.failed / done if done else 0.0


class QueuePage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of a queue's jobs in one state, from ``cursor`` (None: the first page);
    ``at`` is the number of jobs listed before it, for display."""

    queue: str
    state: JobState
    task: str
    cursor: str | None
    at: int
    total: int
    jobs: list[JobRecord]
    #: The cursor of the next page (None: this is the last), and how many jobs a task
    #: filter looked through for this page.
    next_cursor: str | None
    scanned: int


class JobPage(msgspec.Struct, frozen=True, kw_only=True):
    """One job in full, decoded for display."""

    record: JobRecord
    payload: Any
    result: Any
    progress: Any
    error: FailureRecord | None
    attempts: list[FailureRecord]
    #: The flow it belongs to (its id), if any.
    flow_id: str | None
    #: The input's JSON Schema when the dashboard knows the task (re-run offered).
    schema: dict[str, Any] | None
    #: A held workflow step: what it waits on (typedq.broker.flow.waits_for); "" otherwise.
    waits_for: str = ""


class Source:
    """The dashboard's view of one app.

    :param target: the App (tasks, schedules and queues known), a Producer of it (its
        declared tasks: generated stubs), or a Client of the app's broker (queues from the
        broker's registry; no re-run, payloads without schema)
    :param queues: the queues to show (default: the app's and the broker's registry)
    """

    def __init__(self, target: App | Producer | Client, *, queues: Sequence[str] = ()) -> None:
        self.tasks: Mapping[str, TaskBase[Any, Any]]
        self.schedules: list[Schedule[Any]] | None
        if isinstance(target, App):
            self.client = target.client
            self.name = target.name
            self.tasks = target.tasks
            self.schedules = list(target.schedules.values())
            self.declared_queues = list(queues) or target.queues
        elif isinstance(target, Producer):
            self.client = target.client
            self.name = target.name
            self.tasks = target.tasks
            self.schedules = None
            self.declared_queues = list(queues) or sorted({t.queue for t in self.tasks.values()})
        else:
            self.client = target
            self.name = target.name
            self.tasks = {}
            self.schedules = None
            self.declared_queues = list(queues)

    async def queues(self) -> list[str]:
        """The queues shown: the declared ones plus every one the broker knows, sorted."""
        try:
            found = await self.client.broker.list_queues()
        except Unsupported:
            found = []
        return sorted(set(self.declared_queues) | set(found)) or ["default"]

    def inspector(self, queues: Sequence[str]) -> Inspector:
        """An Inspector of ``queues`` (actions and flows reuse ``typedq inspect``'s)."""
        return Inspector(self.client, queues, schedules=self.schedules)

    async def overview(self) -> list[QueueRow]:
        """Every queue's counts and last hour: two broker calls, whatever the job count."""
        queues = await self.queues()
        broker = self.client.broker
        stats = await broker.queue_stats(queues)
        try:
            history = await broker.history(queues, CHART_MINUTES)
        except Unsupported:
            now = int(time.time() // 60) * 60
            empty = [MinuteRollup(now - 60 * i) for i in range(CHART_MINUTES - 1, -1, -1)]
            history = [empty for _ in queues]
        return [
            QueueRow(
                stats=s,
                minutes=h,
                completed=sum(m.completed for m in h),
                failed=sum(m.failed for m in h),
                retried=sum(m.retried for m in h),
            )
            for s, h in zip(stats, history, strict=True)
        ]

    async def flow_sections(self, queue: str) -> list[FlowKeysView]:
        """The first page (``FLOW_PAGE`` keys) of ``queue``'s fair keys, debounced keys
        and unique keys held, only the kinds that have any (none on a broker without
        the FlowViews capability): one bounded broker call per kind."""
        broker = self.client.broker
        if not supports(broker, FlowViews):
            return []
        views = [await flow_keys_view(broker, queue, kind, limit=FLOW_PAGE) for kind in FLOW_KINDS]
        return [v for v in views if v.keys]

    async def queue_page(
        self, queue: str, state: JobState, *, cursor: str | None, at: int, task: str
    ) -> QueuePage:
        """One page of ``queue``'s jobs in ``state``: ``PAGE_SIZE`` jobs from ``cursor``,
        or, filtered by ``task``, the matches among at most ``FILTER_SCAN`` jobs. The
        broker pages by cursor, so a deep page costs what the first one does."""
        broker = self.client.broker
        (stats,) = await broker.queue_stats([queue])
        total = stats.counts.get(state, 0)
        jobs: list[JobRecord] = []
        scanned = 0
        step = PAGE_SIZE if not task else 500
        next_cursor = cursor
        while True:
            start = next_cursor
            page = await broker.page_jobs(queue, state, cursor=start, limit=step)
            next_cursor = page.cursor
            records = await broker.get(page.ids) if page.ids else []
            for i, record in enumerate(records):
                if record is None or record.state is not state:
                    continue
                if task and record.message.task != task:
                    continue
                jobs.append(record)
                if len(jobs) == PAGE_SIZE and i + 1 < len(records):
                    # A page shows PAGE_SIZE jobs: the next one starts right after this
                    # job, so ask for the cursor there (the same ids, cut short).
                    cut = await broker.page_jobs(queue, state, cursor=start, limit=i + 1)
                    next_cursor, records = cut.cursor, records[: i + 1]
                    break
            scanned += len(records)
            full = len(jobs) >= PAGE_SIZE or scanned >= (FILTER_SCAN if task else PAGE_SIZE)
            if next_cursor is None or full:
                break
        return QueuePage(
            queue=queue,
            state=state,
            task=task,
            cursor=cursor,
            at=at,
            total=total,
            jobs=jobs,
            next_cursor=next_cursor,
            scanned=scanned,
        )

    async def job(self, job_id: str) -> JobPage | None:
        """One job in full, or None when there is no such job."""
        broker = self.client.broker
        (record,) = await broker.get([job_id])
        if record is None:
            return None
        error = None
        if record.error is not None:
            try:
                error = decode_failure(record.error, job_id)
            except Exception:
                error = None
        flow = await broker.flow_state(job_id)
        task = self.tasks.get(record.message.task)
        schema = None
        if task is not None:
            from ..schema import model_schema

            schema = model_schema(task.input)
        return JobPage(
            record=record,
            payload=plain_data(record.message.payload),
            result=plain_data(record.result),
            progress=plain_data(record.progress),
            error=error,
            attempts=attempt_records(record),
            flow_id=None if flow is None else flow.id,
            schema=schema,
            waits_for="" if flow is None else waits_for(flow, job_id, record.run_at),
        )

    async def flow(self, job_id: str, *, start: int = 0) -> FlowView | None:
        """The flow the job belongs to: its steps, its members' counts per state and one
        page of members from ``start`` (a few bounded broker calls whatever its size)."""
        return await self.inspector(await self.queues()).flow(job_id, start=start)

    async def schedule_views(self) -> list[ScheduleView]:
        """Every schedule: next and last fire, counts, policy status."""
        return await self.inspector(await self.queues()).schedules()

    async def run(self, run_id: str) -> RunView | None:
        """A durable run in full, or None when there is no such run.

        :raises Unsupported: the broker keeps no durable runs
        """
        return await self.inspector(self.declared_queues or ["default"]).run(run_id)

    async def workers(self) -> list[WorkerInfo]:
        """The live workers (an empty list when the broker keeps no registry)."""
        try:
            return await self.client.broker.list_workers()
        except Unsupported:
            return []
