"""The embedded broker's job path: the state objects composed, and jobs moving through
them (enqueue, claim, complete, fail, hand back, recover), with the wake-ups of waiting
workers and result waiters.

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
from ...errors import NotConnected, QueueFull
from ...limits import LimitSpec
from ...options import check_numbers
from ..base import (
    Broker,
    BrokerSettings,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueOutcome,
    Failure,
    FinishOutcome,
    JobMessage,
    JobRecord,
    JobState,
    LeaseStatus,
    Release,
)
from ..records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WORKER_LOST,
    broker_failure,
    cancelled_while,
    stalled_message,
)
from .control import Control
from .flows import Flows
from .jobs import ACTIVE, CANCELLED, COMPLETED, FAILED, Job, JobTable, encode
from .leases import Leases, WallClock, as_clock
from .limits import MICRO, Limiter
from .lines import Lines
from .observe import Events, Registry, Rollups
from .retention import Finished
from .runs import RunStore
from .schedules import Schedules
from .streams import JobStreamStore

__all__ = ["JobPath"]

_OK = FinishOutcome.OK


class JobPath(Broker):
    """The state of an embedded broker and the job path over it; :class:`MemoryBroker`
    (:mod:`.broker`) adds the operator side. Parameters: see MemoryBroker."""

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        *,
        clock: Clock | Callable[[], float] = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings or BrokerSettings()
        self.clock: Clock = as_clock(clock)
        #: Does the clock's time pass as real time does (then waits are anyio timeouts)?
        self._real_time = self.clock is SYSTEM_CLOCK or isinstance(self.clock, WallClock)
        self.table = JobTable()
        self.registry = Registry(self.clock)
        self.lines = Lines(self.table, self.registry.queues)
        self.limiter = Limiter(self.table, self.lines, self.wake)
        self.leases = Leases(self.clock, self.table, self.lines, self.limiter)
        self.finished = Finished(self.table, self.settings)
        self.flows = Flows(self)
        self.finished.on_parked_trimmed = self.flows.parked_trimmed
        self.runs = RunStore(self)
        self.schedules = Schedules()
        self.control = Control(self)
        self.rollups = Rollups()
        self.events = Events(self.settings.events_max)
        self.streams = JobStreamStore(self.clock.time, self.table.jobs.get)
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
        self.streams.wake_all()

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
        self.leases.active.pop(job_id, None)
        if job.slot is not None:
            self.limiter.free_slot(job)
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
        if job.flow_id is not None and not job.parked:
            self.flows.settled(job, state, job.result, job.error, now)
        if self.runs.runs:
            self.runs.job_finished(job)
        if self.control.tracked:
            self.control.finished(job_id, state, now)

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
            self.table.check_room(adding, cap, "adding {extra}")
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
        parked = job.parked and job.state is FAILED
        if job.state.is_final and not parked:
            return CancelOutcome.ALREADY_FINAL
        if job.state is JobState.ACTIVE:
            self.request_cancel(job)
            return CancelOutcome.REQUESTED
        now = self.clock.time()
        if parked:
            # A parked job (failed, its flow waiting for it) is cancelled as a waiting
            # one would be: its flow ends as cancelled.
            job.parked = False
            self.finished.by_state[FAILED].pop(job_id, None)
        job.error = encode(
            broker_failure(
                "cancelled",
                cancelled_while("parked" if parked else job.state.value),
                attempt=job.attempt,
                failed_at=now,
            )
        )
        self.to_final(job, JobState.CANCELLED, now)
        return CancelOutcome.CANCELLED

    async def counts(self, queue: str) -> dict[JobState, int]:
        self._check()
        return dict(self.table.counts[queue])

    # -- worker side ---------------------------------------------------------------

    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """Declare tasks' limits; every later claim enforces them (see :mod:`.limits`)."""
        self._merge_limits(limits)

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
        return self.leases.claim(queues, limit, worker_id, lease, claim_id, self.limits)

    def has_due_jobs(self) -> bool:
        """True when some job is waiting, or scheduled at or before the clock's now."""
        lines = self.lines
        if any(lines.head(queue) is not None for queue in list(lines.waiting)):
            return True
        now = self.clock.time()
        if self.limiter.any_open(now * MICRO):
            return True
        return any(True for _ in lines.due_scheduled(now))

    def _due_soon(self, queues: Sequence[str]) -> float:
        """Seconds until something in ``queues`` may be claimable (0 = now)."""
        lines = self.lines
        if any(lines.head(q) is not None for q in queues):
            return 0.0
        due = [t for t in (lines.next_run_at(), self.limiter.next_gate(queues)) if t is not None]
        if due:
            return max(0.0, min(due) - self.clock.time())
        return float("inf")

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._check()
        wait = min(timeout, self._due_soon(queues))
        if wait <= 0:
            return
        await self.wait_work(wait)

    async def wait_work(self, seconds: float) -> None:
        """Wait until :meth:`wake` or ``seconds`` of the clock's time pass.

        On a clock of real time, an anyio timeout; on another clock (a
        :class:`~typedq.clock.VirtualClock`), its own sleep, so moving that clock past a
        due time ends the wait as the due time itself would.
        """
        work = self._work
        assert work is not None
        if self._real_time:
            with anyio.move_on_after(seconds):
                await work.wait()
            return
        async with anyio.create_task_group() as group:

            async def timer() -> None:
                await self.clock.sleep(seconds)
                group.cancel_scope.cancel()

            group.start_soon(timer)
            await work.wait()
            group.cancel_scope.cancel()

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        self._check()
        return self.leases.renew(leases, lease)

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
        claimed = (
            self.leases.claim(queues, limit, worker_id, lease, claim_id, self.limits)
            if limit
            else []
        )
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
                outcomes.append(self.leases.fenced(item.id, token)[1])
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
            job, outcome = self.leases.fenced(item.id, item.token)
            if job is not None:
                job.add_error(item.error)
                job.done_token = item.token
                if item.cancelled or (item.retry_delay is None) or job.cancel_requested:
                    if item.span:
                        self.flows.note_span(job, item.span)
                    state = CANCELLED if item.cancelled or job.cancel_requested else FAILED
                    job.parked = state is FAILED and item.park and job.flow_id is not None
                    self._finish(job, state, now)
                    if state is FAILED:
                        self.rollups.roll(job.message.queue, 1, now)
                    ended.add(state)
                else:
                    self.leases.end(job)
                    self.rollups.roll(job.message.queue, 2, now)
                    if item.refund:
                        job.attempt -= 1  # put back unspent (RateLimited)
                    if item.retry_delay > 0:
                        self.lines.to_scheduled(job, now + item.retry_delay)
                    else:
                        self.lines.to_waiting(job, keep_order=False, due=now, again=True)
            outcomes.append(outcome)
        for state in ended:
            self.finished.trim(state, now)
        self.wake()
        return outcomes

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        self._check()
        outcomes = []
        back: list[Job] = []
        now = self.clock.time()
        for item in items:
            job, outcome = self.leases.fenced(item.id, item.token)
            if job is not None:
                self.leases.end(job)
                job.done_token = item.token
                job.attempt -= 1  # handed back unrun: the attempt was not spent
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
                    back.append(job)
            outcomes.append(outcome)
        self.lines.hand_back(back, now)
        self.wake()
        return outcomes

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        self._check()
        job = self.leases.held(job_id, token)
        if job is None:
            return False
        job.progress = progress
        return True

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        self._check()
        return [
            i
            for i in ids
            if (job := self.leases.active.get(i)) is not None and job.cancel_requested
        ]

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
        expired = self.leases.expired(holding, limit)
        max_stalls = self.settings.max_stalls
        back: list[Job] = []
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
                self.leases.end(job)
                back.append(job)
        self.lines.hand_back(back, now)
        self.limiter.forget_idle(now * MICRO, self.limits)
        if expired:
            self.wake()
        return len(expired)
