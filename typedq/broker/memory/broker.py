"""The embedded broker: :class:`MemoryBroker`, the job path of :mod:`.core` and the
operator side of the Broker interface (schedules, workflows, listing, retrying, removing
and purging jobs, stats, history, workers, events).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import ConfigError, QueueFull
from ...names import check_job_ids, check_name, check_worker_id
from ...options import check_controls, check_int_option, check_numbers
from ..base import (
    BrokerSettings,
    EnqueueControl,
    EnqueueOutcome,
    EventRead,
    FireOutcome,
    JobList,
    JobMessage,
    JobState,
    MinuteRollup,
    QueueStats,
    RetryOutcome,
    ScheduleState,
    TickFiring,
    WorkerInfo,
)
from ..flow import FlowSpec, FlowState
from ..flowviews import FlowKeyPage, FlowKind
from ..records import RUN_CANCELLED, broker_failure
from ..runs import (
    AppendOutcome,
    RunAppend,
    RunReader,
    RunRecord,
    RunSignal,
    RunSpec,
    SignalOutcome,
)
from ..schemas import FingerprintPage, SchemaRecord
from ..streams import READER_TTL, StreamAppend, StreamEntry
from . import listing
from .core import JobPath
from .jobs import Job
from .limits import MICRO
from .schemas import SchemaStore
from .views import flow_keys

__all__ = ["MemoryBroker"]


class MemoryBroker(JobPath):
    """An in-process broker for the quickstart, unit tests and single-process apps.

    :param settings: retention, stall limit and queue bounds
    :param clock: the time it reads: a :class:`~typedq.clock.Clock` (wall time for
        delays, ETAs, timestamps and retention; monotonic time for leases and worker
        registrations), or a bare ``() -> float`` of wall time (such as
        :class:`typedq.testing.FakeClock`), whose monotonic time is then the system's
    """

    fenced_run_appends = True

    # -- unique windows and debounce (memory/control.py) -----------------------------------

    async def enqueue_controlled(
        self, items: Sequence[tuple[JobMessage, EnqueueControl]]
    ) -> list[EnqueueOutcome]:
        self._check()
        check_numbers(m for m, _ in items)
        check_controls(items)
        outcomes: list[EnqueueOutcome] = []
        try:
            for message, control in items:
                outcomes.append(self.control.enqueue(message, control))
        finally:
            self.wake()
        return outcomes

    # -- views of flow control (memory/views.py) --------------------------------------------

    async def flow_keys(
        self, queue: str, kind: FlowKind, *, cursor: str | None = None, limit: int = 100
    ) -> FlowKeyPage:
        self._check()
        check_name("queue", queue)
        return flow_keys(self, queue, kind, cursor, limit)

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        *,
        clock: Clock | Callable[[], float] = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(settings, clock=clock)
        self.schema_store = SchemaStore()

    # -- the schema registry (typedq verify) -------------------------------------------

    async def record_schemas(self, records: Sequence[SchemaRecord]) -> list[bool]:
        self._check()
        return self.schema_store.record(records, self.clock.time())

    async def schema_records(self) -> list[SchemaRecord]:
        self._check()
        return self.schema_store.listed()

    async def forget_schemas(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        self._check()
        return self.schema_store.forget(keys)

    async def count_fingerprints(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 1000
    ) -> FingerprintPage:
        self._check()
        check_name("queue", queue)
        # A page of page_jobs' (its order, its cursors), counted from the jobs themselves.
        places = listing.places(self.table, self.finished.by_state, queue, state)
        page = listing.page(places, state, cursor, max(1, limit))
        counts: dict[tuple[str, str], int] = {}
        jobs = self.table.jobs
        for job_id in page.ids:
            message = jobs[job_id].message
            key = (message.task, message.fingerprint)
            counts[key] = counts.get(key, 0) + 1
        return FingerprintPage(counts=counts, jobs=len(page.ids), cursor=page.cursor)

    # -- schedules ---------------------------------------------------------------------

    def _now_us(self) -> int:
        # Floor, as Redis TIME does: a deadline computed from it never lies after the
        # clock's own now + the delay (rounding up made an exact advance miss it).
        return math.floor(self.clock.time() * MICRO)

    async def broker_time_us(self) -> int:
        self._check()
        return self._now_us()

    async def sleep_until_us(self, when_us: int) -> None:
        self._check()
        delta = (when_us - self._now_us()) / MICRO
        if delta <= 0:
            return
        # Woken by wake() too: a fake clock that moves says so through it.
        await self.wait_work(delta)

    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]:
        self._check()
        return self.schedules.sync(schedules, prune=prune, now_us=self._now_us())

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        self._check()
        return [
            self.schedules.fire(firing, self._now_us(), self.table.jobs.get, self._enqueue_woken)
            for firing in firings
        ]

    def _enqueue_woken(self, messages: Sequence[JobMessage]) -> None:
        self._enqueue(messages)
        self.wake()

    async def schedule_states(self) -> list[ScheduleState]:
        self._check()
        return self.schedules.listed()

    # -- workflows (see typedq.broker.flow and .flows) -------------------------------

    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        self._check()
        for spec in flows:
            check_numbers((*spec.members, *spec.steps))
        out: list[EnqueueOutcome | Exception] = []
        for spec in flows:
            try:
                out.append(self.flows.enqueue(spec))
            except (QueueFull, ConfigError) as exc:
                out.append(exc)
        self.wake()
        return out

    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None:
        self._check()
        return self.flows.state(flow_id)

    # -- durable runs (see typedq.broker.runs and .runs) -----------------------------

    async def create_runs(self, specs: Sequence[RunSpec]) -> list[tuple[bool, RunRecord]]:
        self._check()
        check_job_ids([spec.id for spec in specs])
        return [self.runs.create(spec) for spec in specs]

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        self._check()
        return [self.runs.get(run_id) for run_id in run_ids]

    async def page_runs(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[str], str | None]:
        self._check()
        limit = check_int_option("limit", limit, 1, 10_000)
        ids = sorted(self.runs.runs)
        start = 0 if cursor is None else bisect.bisect_right(ids, cursor)
        page = ids[start : start + limit]
        return page, (page[-1] if start + limit < len(ids) else None)

    async def append_runs(self, appends: Sequence[RunAppend]) -> list[AppendOutcome]:
        self._check()
        out = []
        for item in appends:
            if item.fence is not None and not self.runs.holds(item.fence):
                out.append(AppendOutcome.FENCED)  # (nothing stored: not the lease holder)
                continue
            if item.steps:
                # Stored before the compare (RunAppend.steps), as a turn's enqueue was.
                await self.enqueue(item.steps)
            out.append(self.runs.append(item))
        return out

    async def signal_runs(self, signals: Sequence[RunSignal]) -> list[SignalOutcome]:
        self._check()
        return [self.runs.signal(item) for item in signals]

    async def wake_runs(self, wakes: Sequence[tuple[str, float]]) -> list[bool]:
        self._check()
        return [self.runs.wake_run(run_id, at) for run_id, at in wakes]

    async def cancel_runs(self, run_ids: Sequence[str]) -> list[bool]:
        self._check()
        out = []
        for run_id in run_ids:
            failure = broker_failure(
                "cancelled", RUN_CANCELLED, attempt=0, failed_at=self.clock.time()
            )
            waited = self.runs.cancel(run_id, failure)
            out.append(waited is not None)
            # A step still running is asked to stop, as a cancelled job is.
            for job_id in waited or ():
                await self.cancel(job_id)
        return out

    async def wait_run(
        self, run_id: str, seen: int, timeout: float | None, *, reader: RunReader | None = None
    ) -> RunRecord | None:
        self._check()  # (no reads to share: ``reader`` is not used)
        return await self.runs.wait(run_id, seen, timeout)

    # -- operations ------------------------------------------------------------------

    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        self._check()
        wanted = set(states)
        removed = 0
        # Every job in the states goes before any flow reacts, so which of a flow's jobs
        # is deleted first changes nothing (the Redis script deletes in its own order, and
        # deletes a job its flow's end reaches in the purged state instead of ending it);
        # a job the reactions put in the states (a fan-in released by its last member's
        # deletion) is purged by the next round, as the Redis script pops it next.
        while doomed := [
            job
            for job in self.table.jobs.values()
            if job.message.queue == queue and job.state in wanted
        ]:
            for job in doomed:
                self._delete(job, react=False)
            for job in doomed:
                self.flows.removed(job)
            removed += len(doomed)
        return removed

    def _delete(self, job: Job, *, react: bool = True) -> None:
        job_id = job.message.id
        del self.table.jobs[job_id]
        if self.leases.active.pop(job_id, None) is not None:
            # Its handler may still run: the slot stays held until its lease would end.
            if job.slot is not None:
                now_us = self.clock.time() * MICRO
                self.limiter.ghost_slot(job, now_us, self.leases.left(job))
        else:
            self.limiter.free_slot(job)
        self.table.counts[job.message.queue][job.state] -= 1
        if job.state.is_final:
            self.finished.by_state[job.state].pop(job_id, None)
        waiter = self._finish_waiters.pop(job_id, None)
        if waiter is not None:
            waiter.set()
        if react:
            self.flows.removed(job)

    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        self._check()
        places = listing.places(self.table, self.finished.by_state, queue, state)
        return listing.list_ids(places, state, offset, limit)

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        self._check()
        places = listing.places(self.table, self.finished.by_state, queue, state)
        return listing.page(places, state, cursor, limit)

    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        self._check()
        outcomes = []
        for job_id in ids:
            job = self.table.jobs.get(job_id)
            if job is None:
                outcomes.append(RetryOutcome.NOT_FOUND)
                continue
            if job.state not in (JobState.FAILED, JobState.CANCELLED):
                outcomes.append(RetryOutcome.NOT_RETRYABLE)
                continue
            if job.flow_id is not None and not self.flows.retry(job):
                outcomes.append(RetryOutcome.IN_FLOW)
                continue
            self.finished.by_state[job.state].pop(job_id, None)
            job.attempt = 0
            job.stalls = 0
            job.started_at = job.finished_at = 0.0
            job.result = job.error = job.progress = None
            job.cancel_requested = False
            job.worker_id = None
            # A token from before the retry answers LEASE_LOST, not ALREADY_FINISHED:
            # the job has started a new life that no old lease may speak for.
            job.done_token = None
            self.lines.to_waiting(job, keep_order=False, due=self.clock.time(), again=True)
            outcomes.append(RetryOutcome.RETRIED)
        self.wake()
        return outcomes

    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]:
        self._check()
        wanted = None if states is None else set(states)
        removed = []
        for job_id in ids:
            job = self.table.jobs.get(job_id)
            ok = job is not None and (wanted is None or job.state in wanted)
            if ok:
                assert job is not None
                self._delete(job)
            removed.append(ok)
        return removed

    # -- observability -------------------------------------------------------------

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        self._check()
        now = self.clock.time()
        oldest = self.lines.oldest_due(queues, now)
        all_counts = self.table.counts
        trimmed = self.finished.trimmed
        return [
            QueueStats(
                queue=q,
                counts=dict(all_counts[q]) if q in all_counts else dict.fromkeys(JobState, 0),
                oldest_waiting=max(0.0, now - oldest[q]) if q in oldest else 0.0,
                trimmed=dict(trimmed.get(q, {})),
            )
            for q in queues
        ]

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        self._check()
        return self.rollups.history(queues, minutes, self.clock.time())

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        self._check()
        check_worker_id(info.id)
        self.registry.register(info, ttl)

    async def unregister_worker(self, worker_id: str) -> None:
        self._check()
        self.registry.unregister(worker_id)

    async def list_workers(self) -> list[WorkerInfo]:
        self._check()
        return self.registry.list_workers()

    async def list_queues(self) -> list[str]:
        self._check()
        counted = {q for q, c in self.table.counts.items() if any(c.values())}
        return sorted(self.registry.queues | counted)

    async def enable_events(self, queue: str) -> int:
        self._check()
        return self.events.enable(queue)

    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead:
        self._check()
        if not self.events.has_after(queue, after):
            await self.events.wait(queue, timeout)
            self._check()
        return self.events.read(queue, after, limit)

    # -- job streams (typedq.streams) ----------------------------------------------------

    async def append_streams(self, appends: Sequence[StreamAppend]) -> list[bool]:
        self._check()
        return [self.streams.append(a) for a in appends]

    async def read_stream(
        self,
        job_id: str,
        *,
        queue: str,
        after: str,
        timeout: float,
        limit: int = 1000,
        reader: str = "",
    ) -> list[StreamEntry]:
        self._check()
        at = int(after) if after else 0
        if reader:
            self.streams.join(job_id, reader, self.clock.time() + max(0.0, timeout) + READER_TTL)
        if not self.streams.has_after(job_id, at):
            await self.streams.wait(job_id, timeout)
            self._check()
        if reader:
            self.streams.join(job_id, reader, self.clock.time() + READER_TTL)
        return self.streams.read(job_id, at, max(1, limit))

    async def leave_stream(self, job_id: str, *, queue: str, reader: str) -> None:
        self._check()
        self.streams.leave(job_id, reader)
