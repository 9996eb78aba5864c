"""The embedded broker: :class:`MemoryBroker` composes the state objects of this package
and implements :class:`~typedq.broker.base.Broker` over them.

No method awaits while it changes state, so one event loop owns everything without locks.
The job path costs O(1) per job with no per-job await, call into anyio or Event: a batch
is enqueued in one pass, a claim takes up to n jobs off the front of the lines, and a
batch of completions updates the minute's rollup and applies retention once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence

import anyio
from anyio.abc import TaskStatus

from ...clock import SYSTEM_CLOCK, Clock
from ...errors import ConfigError, NotConnected, QueueFull
from ...names import check_worker_id
from ...options import check_numbers
from ..base import (
    Broker,
    BrokerSettings,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueOutcome,
    EventRead,
    Failure,
    FinishOutcome,
    FireOutcome,
    JobList,
    JobMessage,
    JobRecord,
    JobState,
    LeaseStatus,
    MinuteRollup,
    QueueStats,
    Release,
    RetryOutcome,
    ScheduleState,
    TickFiring,
    WorkerInfo,
    check_claim_id,
    new_claim_id,
)
from ..flow import FlowSpec, FlowState
from ..records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WORKER_LOST,
    broker_failure,
    cancelled_while,
    stalled_message,
)
from . import listing
from .flows import Flows
from .jobs import ACTIVE, CANCELLED, COMPLETED, FAILED, WAITING, Job, JobTable, encode
from .leases import Leases, as_clock
from .limits import MICRO, Limits
from .lines import Lines, best
from .observe import Events, Registry, Rollups
from .retention import Finished
from .schedules import Schedules

__all__ = ["MemoryBroker"]

_OK = FinishOutcome.OK


class MemoryBroker(Broker):
    """An in-process broker for the quickstart, unit tests and single-process apps.

    :param settings: retention, stall limit and queue bounds
    :param clock: the time it reads: a :class:`~typedq.clock.Clock` (wall time for
        delays, ETAs, timestamps and retention; monotonic time for leases and worker
        registrations), or a bare ``() -> float`` of wall time (such as
        :class:`typedq.testing.FakeClock`), whose monotonic time is then the system's
    """

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        *,
        clock: Clock | Callable[[], float] = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings or BrokerSettings()
        self.clock: Clock = as_clock(clock)
        self.table = JobTable()
        self.registry = Registry(self.clock)
        self.lines = Lines(self.table, self.registry.queues)
        self.leases = Leases(self.clock)
        self.gates = Limits(self.table, self.lines, self.wake)
        self.finished = Finished(self.table, self.settings)
        self.flows = Flows(self)
        self.schedules = Schedules()
        self.rollups = Rollups()
        self.events = Events(self.settings.events_max)
        #: The active jobs by id.
        self.active: dict[str, Job] = {}
        self._connected = False
        self._users = 0
        self._work: anyio.Event | None = None
        self._cancels: anyio.Event | None = None
        self._finish_waiters: dict[str, anyio.Event] = {}

    # -- lifecycle -----------------------------------------------------------------

    async def connect(self) -> None:
        # Several clients may share one embedded broker (an App and a Producer in one
        # process): only the first connect sets up, only the last close tears down.
        self._users += 1
        if self._users == 1:
            self._work = anyio.Event()
            self._cancels = anyio.Event()
            self._connected = True

    async def close(self) -> None:
        if self._users == 0:
            return
        self._users -= 1
        if self._users > 0:
            return
        self._connected = False
        # Wake everything that waits so no task hangs on a closed broker.
        if self._work is not None:
            self._work.set()
        if self._cancels is not None:
            self._cancels.set()
        for event in self._finish_waiters.values():
            event.set()
        self._finish_waiters.clear()
        self.events.wake_all()

    def _check(self) -> None:
        if not self._connected:
            raise NotConnected(
                "the embedded broker is not connected: use `async with app:` before "
                "enqueueing or running workers (or `await broker.connect()` for a broker "
                "used on its own)"
            )

    def wake(self) -> None:
        """Tell waiting workers to look again (after the clock moved, for instance)."""
        if self._work is not None:
            self._work.set()
            self._work = anyio.Event()

    def request_cancel(self, job: Job) -> None:
        """Ask the worker running active ``job`` to cancel it."""
        job.cancel_requested = True
        assert self._cancels is not None
        self._cancels.set()
        self._cancels = anyio.Event()

    # -- final states ----------------------------------------------------------------

    def to_final(self, job: Job, state: JobState, now: float) -> None:
        """Final ``state``, counted in the minute's rollup, with retention applied."""
        self._finish(job, state, now)
        if state is COMPLETED:
            self.rollups.roll(job.message.queue, 0, now)
        elif state is FAILED:
            self.rollups.roll(job.message.queue, 1, now)
        self.finished.trim(state, now)

    def _finish(self, job: Job, state: JobState, now: float) -> None:
        """Final ``state`` without the rollup and retention, which a batch applies once."""
        message = job.message
        job_id = message.id
        self.active.pop(job_id, None)
        if job.slot is not None:
            self.gates.free_slot(job)
        table = self.table
        counts = table.counts[message.queue]  # table.move, inlined: this runs once per job
        counts[job.state] -= 1
        counts[state] += 1
        job.state = state
        table.versions += 1
        job.version = table.versions
        job.finished_at = now
        job.lease_until = 0.0
        job.active_token = None
        self.finished.by_state[state][job_id] = now
        if self._finish_waiters:
            waiter = self._finish_waiters.pop(job_id, None)
            if waiter is not None:
                waiter.set()
        rings = self.events.rings
        if rings:
            ring = rings.get(message.queue)
            if ring is not None:
                self.events.emit(ring, job, state)
        if job.flow_id is not None:
            self.flows.settled(job, state, job.result, job.error, now)

    def _off_lease(self, job: Job) -> None:
        """``job`` stops being active without finishing (a retry, a hand-back)."""
        self.active.pop(job.message.id, None)
        self.gates.free_slot(job)
        job.active_token = None

    def check_room(self, adding: Mapping[str, int], limit: int, what: str) -> None:
        """Raise QueueFull when adding ``adding[queue]`` jobs would pass ``limit`` pending
        (waiting + scheduled) jobs in a queue; ``what`` names them (``{extra}``: how many)."""
        for queue, extra in adding.items():
            counts = self.table.counts[queue]
            pending = counts[JobState.WAITING] + counts[JobState.SCHEDULED]
            if pending + extra > limit:
                raise QueueFull(
                    f"queue {queue!r} holds {pending} pending jobs; "
                    f"{what.format(extra=extra)} would pass max_queue_length={limit}"
                )

    def _fenced(self, job_id: str, token: str) -> tuple[Job | None, FinishOutcome]:
        job = self.table.jobs.get(job_id)
        if job is None:
            return None, FinishOutcome.NOT_FOUND
        if job.state is JobState.ACTIVE and job.active_token == token:
            return job, FinishOutcome.OK
        if job.done_token == token:
            return None, FinishOutcome.ALREADY_FINISHED
        return None, FinishOutcome.LEASE_LOST

    # -- producer side -------------------------------------------------------------

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        self._check()
        check_numbers(messages)
        outcomes = self._enqueue(messages)
        self.wake()
        return outcomes

    async def enqueue_batches(
        self, batches: Sequence[Sequence[JobMessage]]
    ) -> list[list[EnqueueOutcome] | Exception]:
        # All the batches in one call, and one wake-up for them all.
        self._check()
        for batch in batches:
            check_numbers(batch)  # before any batch is stored, as on Redis
        results: list[list[EnqueueOutcome] | Exception] = []
        try:
            for batch in batches:
                try:
                    results.append(self._enqueue(batch))
                except QueueFull as exc:
                    results.append(exc)
        finally:
            self.wake()
        return results

    def _enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        for message in messages:
            # What a networked broker refuses when it encodes the envelope: the
            # embedded one refuses it too (and stores nothing of the batch).
            if not isinstance(message.payload, bytes):
                raise TypeError(
                    f"job {message.id!r}: the payload must be bytes (an encoded model), "
                    f"not {type(message.payload).__name__}"
                )
        if self.settings.max_queue_length:
            jobs = self.table.jobs
            adding: dict[str, int] = defaultdict(int)
            fresh: set[str] = set()
            for message in messages:
                # Only jobs this call creates count: an existing id, or an id repeated
                # within the batch after its first occurrence, adds nothing.
                if message.id not in jobs and message.id not in fresh:
                    fresh.add(message.id)
                    adding[message.queue] += 1
            # The call's cap is the smallest of every queue it names, also of queues whose
            # jobs all exist already: the Redis broker's, which learns which are new only
            # inside its script (Broker.queue_cap).
            cap = self.queue_cap({m.queue for m in messages})
            self.check_room(adding, cap, "adding {extra}")
        return self.lines.add(messages, self.clock.time())

    async def get(self, ids: Sequence[str], *, queue: str | None = None) -> list[JobRecord | None]:
        self._check()
        jobs = self.table.jobs
        return [job.snapshot() if (job := jobs.get(i)) is not None else None for i in ids]

    async def wait_finished(
        self,
        job_id: str,
        timeout: float | None,
        *,
        queue: str | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> JobRecord | None:
        self._check()
        # Armed at once: nothing below awaits before the event is registered.
        task_status.started()
        job = self.table.jobs.get(job_id)
        if job is None:
            return None
        if not job.state.is_final:
            event = self._finish_waiters.get(job_id)
            if event is None:
                event = self._finish_waiters[job_id] = anyio.Event()
            with anyio.move_on_after(timeout):
                await event.wait()
            job = self.table.jobs.get(job_id)
        return job.snapshot() if job is not None and job.state.is_final else None

    async def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        self._check()
        job = self.table.jobs.get(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.state.is_final:
            return CancelOutcome.ALREADY_FINAL
        if job.state is JobState.ACTIVE:
            self.request_cancel(job)
            return CancelOutcome.REQUESTED
        now = self.clock.time()
        job.error = encode(
            broker_failure(
                "cancelled", cancelled_while(job.state.value), attempt=job.attempt, failed_at=now
            )
        )
        self.to_final(job, JobState.CANCELLED, now)
        return CancelOutcome.CANCELLED

    async def counts(self, queue: str) -> dict[JobState, int]:
        self._check()
        return dict(self.table.counts[queue])

    # -- worker side ---------------------------------------------------------------

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        self._check()
        return self._claim(queues, limit, worker_id, lease, claim_id)

    def _claim(
        self,
        queues: Sequence[str],
        limit: int,
        worker_id: str,
        lease: float,
        claim_id: str | None,
    ) -> list[ClaimedJob]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        record = self.leases.record(claim_id)
        if record is not None:
            # A re-sent claim: the first copy's jobs still held under it, nothing new.
            prefix = claim_id + "."
            return [
                _claimed(job)
                for job_id in record
                if (job := self.active.get(job_id)) is not None
                and (job.active_token or "").startswith(prefix)
            ]
        now = self.clock.time()
        lines = self.lines
        if lines.scheduled:
            lines.promote_due(now)
        now_us = round(now * MICRO)
        specs = self.limits
        gates = self.gates
        if gates.gates:
            gates.unpark(queues, now_us, specs)
        lease_until = self.leases.until(lease)
        # Take the best entry of the queues' lines until `limit` jobs are taken: O(1) per
        # job for one queue, O(queues) for several. A stale entry (the job moved on since
        # it was pushed) is dropped on the way, which is all that lazy deletion asks.
        open_lines = [line for queue in queues if (line := lines.waiting.get(queue))]
        table = self.table
        jobs = table.jobs
        active = self.active
        all_counts = table.counts
        version = table.versions
        claimed: list[ClaimedJob] = []
        ids: list[str] = []
        last_queue = None
        counts: dict[JobState, int] = {}
        while open_lines and len(claimed) < limit:
            line = open_lines[0] if len(open_lines) == 1 else min(open_lines, key=best)
            entry = line.pop()
            if not line:
                open_lines = [other for other in open_lines if other is not line]
            if entry is None:
                continue
            job = jobs.get(entry[3])
            if job is None or job.version != entry[2] or job.state is not WAITING:
                continue
            if specs and not gates.admit(job, entry, now_us, specs):
                continue  # parked by its closed gate; the claim goes on with other jobs
            message = job.message
            if message.queue != last_queue:
                last_queue = message.queue
                counts = all_counts[last_queue]
            counts[WAITING] -= 1
            counts[ACTIVE] += 1
            version += 1
            job.version = version
            job.state = ACTIVE
            job.attempt += 1
            token = job.active_token = f"{claim_id}.{len(claimed) + 1}"
            job.lease_until = lease_until
            job.started_at = now
            job.worker_id = worker_id
            job_id = message.id
            active[job_id] = job
            ids.append(job_id)
            claimed.append(
                ClaimedJob(
                    message=message,
                    token=token,
                    attempt=job.attempt,
                    enqueued_at=job.enqueued_at,
                    stalls=job.stalls,
                    run_at=job.run_at,
                )
            )
        table.versions = version
        if claimed:
            self.leases.remember(claim_id, ids)
        return claimed

    def has_due_jobs(self) -> bool:
        """True when some job is waiting, or scheduled at or before the clock's now."""
        lines = self.lines
        if any(lines.head(queue) is not None for queue in list(lines.waiting)):
            return True
        now = self.clock.time()
        if self.gates.any_open(now * MICRO):
            return True
        return any(True for _ in lines.due_scheduled(now))

    def _due_soon(self, queues: Sequence[str]) -> float:
        """Seconds until something in ``queues`` may be claimable (0 = now)."""
        lines = self.lines
        if any(lines.head(q) is not None for q in queues):
            return 0.0
        due = [t for t in (lines.next_run_at(), self.gates.next_gate(queues)) if t is not None]
        if due:
            return max(0.0, min(due) - self.clock.time())
        return float("inf")

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._check()
        wait = min(timeout, self._due_soon(queues))
        if wait <= 0:
            return
        assert self._work is not None
        with anyio.move_on_after(wait):
            await self._work.wait()

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        self._check()
        lease_until = self.leases.until(lease)
        statuses = []
        for job_id, token in leases:
            job = self.active.get(job_id)
            if job is None or job.active_token != token:
                statuses.append(LeaseStatus.LOST)
                continue
            job.lease_until = lease_until
            statuses.append(
                LeaseStatus.CANCEL_REQUESTED if job.cancel_requested else LeaseStatus.OK
            )
        return statuses

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        self._check()
        return self._complete(items)

    async def complete_and_claim(
        self,
        items: Sequence[Completion],
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> tuple[list[FinishOutcome], list[ClaimedJob]]:
        self._check()
        outcomes = self._complete(items)
        claimed = self._claim(queues, limit, worker_id, lease, claim_id) if limit else []
        return outcomes, claimed

    def _complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        now = self.clock.time()
        jobs = self.table.jobs
        finish = self._finish
        outcomes: list[FinishOutcome] = []
        done: dict[str, int] = {}  # completions per queue, for the minute's rollup
        for item in items:
            job = jobs.get(item.id)
            token = item.token
            if job is not None and job.state is ACTIVE and job.active_token == token:
                job.result = item.result
                job.done_token = token
                if item.span:
                    self.flows.note_span(job, item.span)
                finish(job, COMPLETED, now)
                queue = job.message.queue
                done[queue] = done.get(queue, 0) + 1
                outcomes.append(_OK)
            else:
                outcomes.append(self._fenced(item.id, token)[1])
        # Once per batch, not per job: the rollup, and retention (the batch's jobs count
        # against the bound once they are all in).
        for queue, count in done.items():
            self.rollups.roll(queue, 0, now, count)
        if done:
            self.finished.trim(COMPLETED, now)
        return outcomes

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        self._check()
        now = self.clock.time()
        outcomes = []
        ended: set[JobState] = set()
        for item in items:
            job, outcome = self._fenced(item.id, item.token)
            if job is not None:
                job.add_error(item.error)
                job.done_token = item.token
                if item.cancelled or (item.retry_delay is None) or job.cancel_requested:
                    if item.span:
                        self.flows.note_span(job, item.span)
                    state = CANCELLED if item.cancelled or job.cancel_requested else FAILED
                    self._finish(job, state, now)
                    if state is FAILED:
                        self.rollups.roll(job.message.queue, 1, now)
                    ended.add(state)
                else:
                    self._off_lease(job)
                    self.rollups.roll(job.message.queue, 2, now)
                    if item.refund:
                        job.attempt -= 1  # put back unspent (RateLimited)
                    if item.retry_delay > 0:
                        self.lines.to_scheduled(job, now + item.retry_delay)
                    else:
                        self.lines.to_waiting(job, keep_order=False, due=now)
            outcomes.append(outcome)
        for state in ended:
            self.finished.trim(state, now)
        self.wake()
        return outcomes

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        self._check()
        outcomes = []
        for item in items:
            job, outcome = self._fenced(item.id, item.token)
            if job is not None:
                self._off_lease(job)
                job.done_token = item.token
                job.attempt -= 1  # handed back unrun: the attempt was not spent
                now = self.clock.time()
                if job.cancel_requested:
                    # A final state carries its record: Job.result() decodes it.
                    job.error = encode(
                        broker_failure(
                            "cancelled",
                            CANCELLED_ON_HAND_BACK,
                            attempt=job.attempt,
                            worker_id=job.worker_id,
                            failed_at=now,
                        )
                    )
                    self.to_final(job, JobState.CANCELLED, now)
                else:
                    self.lines.to_waiting(job, keep_order=True, due=now)
            outcomes.append(outcome)
        self.wake()
        return outcomes

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        self._check()
        job = self.active.get(job_id)
        if job is None or job.active_token != token:
            return False
        job.progress = progress
        return True

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        self._check()
        return [i for i in ids if (job := self.active.get(i)) is not None and job.cancel_requested]

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._check()
        assert self._cancels is not None
        task_status.started()
        with anyio.move_on_after(timeout):
            await self._cancels.wait()

    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        self._check()
        now = self.clock.time()
        self.finished.trim_all(now)
        expired = self.leases.expired(self.active.values(), holding, limit)
        max_stalls = self.settings.max_stalls
        for job in expired:
            job.stalls += 1
            job.done_token = None
            if job.cancel_requested or job.stalls > max_stalls:
                cancelled = job.cancel_requested
                record = encode(
                    broker_failure(
                        "cancelled" if cancelled else "stalled",
                        CANCELLED_WORKER_LOST
                        if cancelled
                        else stalled_message(job.stalls, max_stalls),
                        attempt=job.attempt,
                        worker_id=job.worker_id,
                        failed_at=now,
                    )
                )
                if cancelled:
                    job.error = record
                else:
                    job.add_error(record)
                self.to_final(job, CANCELLED if cancelled else FAILED, now)
            else:
                self._off_lease(job)
                self.lines.to_waiting(job, keep_order=True, due=now)
        self.gates.forget_idle(now * MICRO, self.limits)
        if expired:
            self.wake()
        return len(expired)

    # -- schedules ---------------------------------------------------------------------

    def _now_us(self) -> int:
        return round(self.clock.time() * MICRO)

    async def broker_time_us(self) -> int:
        self._check()
        return self._now_us()

    async def sleep_until_us(self, when_us: int) -> None:
        self._check()
        delta = (when_us - self._now_us()) / MICRO
        if delta <= 0:
            return
        # Woken by wake() too: a fake clock that moves says so through it.
        assert self._work is not None
        with anyio.move_on_after(delta):
            await self._work.wait()

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
        if self.active.pop(job_id, None) is not None:
            # Its handler may still run: the slot stays held until its lease would end.
            if job.slot is not None:
                now_us = self.clock.time() * MICRO
                self.gates.ghost_slot(job, now_us, self.leases.left(job))
        else:
            self.gates.free_slot(job)
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
            self.lines.to_waiting(job, keep_order=False, due=self.clock.time())
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


def _claimed(job: Job) -> ClaimedJob:
    """What a claim answered for active ``job`` (a re-sent claim answers it again)."""
    assert job.active_token is not None
    return ClaimedJob(
        message=job.message,
        token=job.active_token,
        attempt=job.attempt,
        enqueued_at=job.enqueued_at,
        stalls=job.stalls,
        run_at=job.run_at,
    )
