"""The embedded broker (``memory://``): in-process, same semantics as Redis.

Everything lives in dicts, deques and heaps owned by one event loop; no locks are
needed because no method awaits while it changes state. Waiting jobs stand in a line per
queue (a FIFO per priority level, :class:`_WaitLine`), scheduled ones in a heap by due
time. Both use lazy deletion: an entry is live only while its ``version`` matches the
job's, so a job that moves on simply leaves a stale entry behind to be skipped. Versions
come from one broker-wide counter, never restart per job: a job re-created under the id
of a removed one can never match an entry its predecessor left behind.

The job path costs O(1) per job with no per-job await, call into anyio or Event: a batch
is enqueued in one pass, a claim takes up to n jobs off the front of the line, and a
batch of completions updates the minute's rollup and applies retention once.

Two clocks: delays, ETAs, timestamps and retention use ``clock`` (wall time by
default; :mod:`typedq.testing` swaps in a fake one and moves it forward), while leases
use the monotonic clock, because a lease measures whether a worker is alive.
"""

from __future__ import annotations

import bisect
import heapq
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

import anyio
import msgspec
from anyio.abc import TaskStatus

from ..errors import ConfigError, NotConnected, QueueFull
from ..limits import LimitSpec
from ..names import check_worker_id
from ..options import check_numbers
from .base import (
    CLAIM_RECORD_TTL,
    ERROR_HISTORY,
    HISTORY_MINUTES,
    MAX_SPAN_LINKS,
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
    QueueEvent,
    QueueStats,
    Release,
    RetryOutcome,
    ScheduleState,
    TickFiring,
    WorkerInfo,
    bad_cursor,
    check_claim_id,
    new_claim_id,
)
from .flow import (
    FLOW_BROKEN_MESSAGE,
    HELD_AT,
    FlowSpec,
    FlowState,
    collect_element,
    fan_in_payload,
    id_taken,
    member_id,
    step_id,
)
from .records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WITH_FLOW,
    CANCELLED_WORKER_LOST,
    broker_failure,
    cancelled_while,
    stalled_message,
)

__all__ = ["MemoryBroker"]


#: A waiting job's place: (-priority, order, version, id); the smallest runs first.
_Entry = tuple[int, int, int, str]


class _Level:
    """The entries of one priority level of a queue, in order.

    Jobs mostly arrive in order (a new job's order is above every other's) or at the head
    (a flow's released step): those go to the ends of ``fifo``, O(1) both ways. The rest
    (a job handed back to its old place) go to the small heap ``late``; the next entry is
    the smaller of the two heads.
    """

    __slots__ = ("fifo", "late")

    def __init__(self) -> None:
        self.fifo: deque[_Entry] = deque()
        self.late: list[_Entry] = []

    def push(self, entry: _Entry) -> None:
        fifo = self.fifo
        if not fifo or entry[1] > fifo[-1][1]:
            fifo.append(entry)
        elif entry[1] < fifo[0][1]:
            fifo.appendleft(entry)
        else:
            heapq.heappush(self.late, entry)

    def peek(self) -> _Entry:
        fifo, late = self.fifo, self.late
        if late and (not fifo or late[0] < fifo[0]):
            return late[0]
        return fifo[0]

    def pop(self) -> _Entry:
        fifo, late = self.fifo, self.late
        if late and (not fifo or late[0] < fifo[0]):
            return heapq.heappop(late)
        return fifo.popleft()


class _WaitLine:
    """The waiting entries of one queue, best first: a level per priority.

    Taking the next entry is O(1) (plus the number of priority levels in use, which is
    small), where one heap of every waiting job costs O(log n) tuple comparisons a job.
    Entries are never removed out of turn: like the heap before, an entry whose job has
    moved on (its version no longer matches) is skipped when it comes up.
    """

    __slots__ = ("keys", "levels")

    def __init__(self) -> None:
        #: -priority -> level; ``keys`` holds the levels' keys in ascending order.
        self.levels: dict[int, _Level] = {}
        self.keys: list[int] = []

    def push(self, entry: _Entry) -> None:
        self.level(entry[0]).push(entry)

    def level(self, key: int) -> _Level:
        """The level of ``key`` (-priority), made if missing."""
        level = self.levels.get(key)
        if level is None:
            level = self.levels[key] = _Level()
            bisect.insort(self.keys, key)
        return level

    def peek(self) -> _Entry | None:
        """The best entry, or None when empty."""
        keys = self.keys
        return self.levels[keys[0]].peek() if keys else None

    def pop(self) -> _Entry | None:
        """Take the best entry (None when empty); an emptied level goes."""
        keys = self.keys
        if not keys:
            return None
        key = keys[0]
        level = self.levels[key]
        entry = level.pop()
        if not level.fifo and not level.late:
            del self.levels[key]
            del keys[0]
        return entry

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __iter__(self) -> Iterator[_Entry]:
        for level in self.levels.values():
            yield from level.fifo
            yield from level.late


#: The letter that starts a page cursor of each state (a cursor of another state is refused).
_CURSOR_LETTERS = {state: "wsacfx"[i] for i, state in enumerate(JobState)}


def _cursor_place(cursor: str, letter: str) -> tuple[float, int, str]:
    """The place a :meth:`MemoryBroker.page_jobs` cursor of state ``letter`` names."""
    parts = cursor[1:].split(":", 2)
    if cursor[:1] != letter or len(parts) != 3 or not parts[2]:
        raise bad_cursor(cursor)
    try:
        a = float(parts[0]) if "." in parts[0] or "e" in parts[0] else int(parts[0])
        b = int(parts[1])
    except ValueError:
        raise bad_cursor(cursor) from None
    if a != a or a in (float("inf"), float("-inf")):
        raise bad_cursor(cursor)
    return (a, b, parts[2])


def _best(line: _WaitLine) -> _Entry:
    entry = line.peek()
    assert entry is not None  # only non-empty lines are compared
    return entry


_encode = msgspec.msgpack.Encoder().encode

#: A limit gate: (queue, 'r' for rate | 'c' for concurrency, task, key).
_Gate = tuple[str, str, str, str]
_MICRO = 1_000_000
_OK = FinishOutcome.OK


# Hot-path constants: an enum member read off its class costs an attribute lookup each time.
_WAITING = JobState.WAITING
_SCHEDULED = JobState.SCHEDULED
_ACTIVE = JobState.ACTIVE
_COMPLETED = JobState.COMPLETED
_FAILED = JobState.FAILED
_CANCELLED = JobState.CANCELLED


class _Job(msgspec.Struct, gc=False):
    """A job as the broker holds it.

    A Struct rather than a class with ``__slots__``: built in C (a stored job costs a
    fraction of a Python ``__init__``), and ``gc=False`` keeps the stored jobs out of the
    cyclic garbage collector, whose full passes would otherwise walk every one of them
    (a job refers to nothing that refers back to it, so no cycle can go through one).
    """

    message: JobMessage
    enqueued_at: float
    order: int
    version: int = 0
    state: JobState = _WAITING
    attempt: int = 0
    run_at: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0
    result: bytes | None = None
    error: bytes | None = None
    #: Every failed attempt's record, oldest first, at most ERROR_HISTORY.
    errors: tuple[bytes, ...] = ()
    progress: bytes | None = None
    stalls: int = 0
    cancel_requested: bool = False
    worker_id: str | None = None
    active_token: str | None = None
    #: The token whose finish/fail last took effect.
    done_token: str | None = None
    lease_until: float = 0.0
    #: The workflow this job belongs to, and its place: member index or step index.
    flow_id: str | None = None
    flow_member: int = -1
    flow_step: int = -1
    #: On a flow's own job: (steps, members), for inspect after the flow ended.
    flow_shape: tuple[int, int] | None = None
    #: The concurrency slot (task, key) this job holds while active, if any.
    slot: tuple[str, str] | None = None

    def snapshot(self) -> JobRecord:
        return JobRecord(
            message=self.message,
            state=self.state,
            attempt=self.attempt,
            enqueued_at=self.enqueued_at,
            run_at=self.run_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            result=self.result,
            error=self.error,
            progress=self.progress,
            stalls=self.stalls,
            cancel_requested=self.cancel_requested,
            worker_id=self.worker_id,
            errors=self.errors,
        )

    def add_error(self, record: bytes) -> None:
        """A failed attempt's record: the job's error, and the last of its history."""
        self.error = record
        self.errors = (*self.errors, record)[-ERROR_HISTORY:]


class _Flow:
    """A running workflow (see :mod:`typedq.broker.flow`); dropped when it ends."""

    __slots__ = (
        "collect",
        "collector",
        "failed",
        "id",
        "links",
        "members",
        "outcomes",
        "remaining",
        "settled",
        "steps",
        "tally",
    )

    def __init__(self, spec: FlowSpec) -> None:
        self.id = spec.id
        self.members = len(spec.members)
        self.steps = len(spec.steps)
        self.collector = spec.collector
        self.collect = spec.collect
        self.remaining = self.members
        #: Per member: its fan-in element (result bytes, or a collect element).
        self.outcomes: list[bytes | None] = [None] * self.members
        self.settled = bytearray(self.members)
        #: Settled members per final state (FlowState.completed/failed/cancelled).
        self.tally: dict[JobState, int] = {}
        #: The first failed member by index: (index, final state, record).
        self.failed: tuple[int, JobState, bytes | None] | None = None
        #: Traced members' process spans by index (the first MAX_SPAN_LINKS), which
        #: the callback's span links to (JobMessage.trace_links).
        self.links: dict[int, str] = {}


class MemoryBroker(Broker):
    """An in-process broker for the quickstart, unit tests and single-process apps.

    :param settings: retention, stall limit and queue bounds
    :param clock: wall-clock time in epoch seconds; replaceable for tests
    """

    def __init__(
        self,
        settings: BrokerSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings or BrokerSettings()
        self.clock = clock
        self._jobs: dict[str, _Job] = {}
        self._waiting: dict[str, _WaitLine] = defaultdict(_WaitLine)
        self._scheduled: list[tuple[float, int, str]] = []
        self._active: dict[str, _Job] = {}
        self._finished: dict[JobState, OrderedDict[str, float]] = {
            state: OrderedDict()
            for state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
        }
        self._counts: dict[str, dict[JobState, int]] = defaultdict(
            lambda: dict.fromkeys(JobState, 0)
        )
        #: Finished jobs retention deleted, per queue and state (QueueStats.trimmed).
        self._trimmed: dict[str, dict[JobState, int]] = defaultdict(dict)
        self._seq = 0
        self._versions = 0
        self._connected = False
        self._users = 0
        self._work: anyio.Event | None = None
        self._cancels: anyio.Event | None = None
        self._finish_waiters: dict[str, anyio.Event] = {}
        #: Recent claims by claim id: (when, job ids), oldest first.
        self._claims: OrderedDict[str, tuple[float, tuple[str, ...]]] = OrderedDict()
        #: The worker registry: id -> (expiry on the monotonic clock, info).
        self._workers: dict[str, tuple[float, WorkerInfo]] = {}
        self._queues: set[str] = set()
        #: Running workflows by flow id.
        self._flows: dict[str, _Flow] = {}
        #: Schedule states by name (typedq.schedule).
        self._schedules: dict[str, ScheduleState] = {}
        # Limits (typedq.limits): each rate bucket's start times in its window (µs of
        # `clock`), the ids holding each concurrency slot, and the waiting jobs parked
        # by a closed gate (queue, 'r' | 'c', task, key) with the time it opens.
        self._starts: dict[tuple[str, str], deque[int]] = {}
        self._slots: dict[tuple[str, str], set[str]] = {}
        #: Ghosts of deleted active jobs in their slots ('~<id>' -> when their lease
        #: would have ended, µs of `clock`): the slot stays held until then (_ghost_slot).
        self._ghosts: dict[tuple[str, str], dict[str, float]] = {}
        self._parked: dict[_Gate, list[tuple[int, int, int, str]]] = {}
        self._gates: dict[_Gate, float] = {}
        #: Throughput rollups: queue -> minute (minutes since the epoch) -> [completed,
        #: failed, retried]; minutes older than HISTORY_MINUTES are pruned as new ones start.
        self._rollups: dict[str, dict[int, list[int]]] = {}
        #: Event streams (typedq.events) by queue: a ring of the last events_max events,
        #: the last event number, and the readers waiting for the next event.
        self._events: dict[str, deque[QueueEvent]] = {}
        self._event_seq: dict[str, int] = {}
        self._event_waiters: dict[str, anyio.Event] = {}

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
        for event in self._event_waiters.values():
            event.set()
        self._event_waiters.clear()

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

    # -- bookkeeping ---------------------------------------------------------------

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def _move(self, job: _Job, state: JobState) -> None:
        counts = self._counts[job.message.queue]
        counts[job.state] -= 1
        counts[state] += 1
        job.state = state
        # Broker-wide, so no later incarnation of this id reuses a version (D-stale).
        self._versions += 1
        job.version = self._versions

    def _to_waiting(
        self, job: _Job, *, keep_order: bool, at_head: bool = False, due: float | None = None
    ) -> None:
        """Waiting: at its old place (``keep_order``), at the tail of its priority level,
        or at its head (``at_head``: the latest so placed first out). ``due``: it is due
        again from then (a retry, hand-back, recovery, hand-off; its queue wait counts
        from it); None keeps its due time (a scheduled job's, or none)."""
        self._move(job, JobState.WAITING)
        if at_head:
            job.order = -self._next()
        elif not keep_order:
            job.order = self._next()
        if due is not None:
            job.run_at = due
        self._waiting[job.message.queue].push(
            (-job.message.priority, job.order, job.version, job.message.id)
        )

    def _check_room(self, adding: Mapping[str, int], limit: int, what: str) -> None:
        """Raise QueueFull when adding ``adding[queue]`` jobs would pass ``limit`` pending
        (waiting + scheduled) jobs in a queue; ``what`` names them (``{extra}``: how many)."""
        for queue, extra in adding.items():
            counts = self._counts[queue]
            pending = counts[JobState.WAITING] + counts[JobState.SCHEDULED]
            if pending + extra > limit:
                raise QueueFull(
                    f"queue {queue!r} holds {pending} pending jobs; "
                    f"{what.format(extra=extra)} would pass max_queue_length={limit}"
                )

    def _to_scheduled(self, job: _Job, run_at: float) -> None:
        self._move(job, JobState.SCHEDULED)
        job.run_at = run_at
        heapq.heappush(self._scheduled, (run_at, job.version, job.message.id))

    def _to_final(self, job: _Job, state: JobState, now: float) -> None:
        """Final ``state``, counted in the minute's rollup, with retention applied."""
        self._finish(job, state, now)
        if state is _COMPLETED:
            self._roll(job.message.queue, 0, now)
        elif state is _FAILED:
            self._roll(job.message.queue, 1, now)
        self._trim(state, now)

    def _finish(self, job: _Job, state: JobState, now: float) -> None:
        """Final ``state`` without the rollup and retention, which a batch applies once."""
        message = job.message
        job_id = message.id
        self._active.pop(job_id, None)
        if job.slot is not None:
            self._free_slot(job)
        counts = self._counts[message.queue]  # _move, inlined: this runs once per job
        counts[job.state] -= 1
        counts[state] += 1
        job.state = state
        self._versions += 1
        job.version = self._versions
        job.finished_at = now
        job.lease_until = 0.0
        job.active_token = None
        self._finished[state][job_id] = now
        if self._finish_waiters:
            waiter = self._finish_waiters.pop(job_id, None)
            if waiter is not None:
                waiter.set()
        if self._events:
            ring = self._events.get(message.queue)
            if ring is not None:
                self._emit(ring, job, state)
        if job.flow_id is not None:
            self._flow_settled(job, state, job.result, job.error, now)

    def _roll(self, queue: str, field: int, now: float, count: int = 1) -> None:
        """Count ``count`` completions (0), final failures (1) or retries (2) in ``now``'s
        minute."""
        minute = int(now // 60)
        minutes = self._rollups.setdefault(queue, {})
        row = minutes.get(minute)
        if row is None:
            for old in [m for m in minutes if m <= minute - HISTORY_MINUTES]:
                del minutes[old]
            row = minutes[minute] = [0, 0, 0]
        row[field] += count

    def _emit(self, ring: deque[QueueEvent], job: _Job, state: JobState) -> None:
        queue = job.message.queue
        seq = self._event_seq[queue] = self._event_seq[queue] + 1
        data = job.result if state is JobState.COMPLETED else job.error
        ring.append(
            QueueEvent(
                seq=seq,
                id=job.message.id,
                task=job.message.task,
                state=state,
                data=data or b"",
                attempt=job.attempt,
            )
        )
        while len(ring) > self.settings.events_max:
            ring.popleft()
        waiter = self._event_waiters.pop(queue, None)
        if waiter is not None:
            waiter.set()

    def _trim(self, state: JobState, now: float) -> None:
        """Drop the oldest finished jobs of ``state`` past its count or age bound."""
        retention = self.settings.retention
        if state is _COMPLETED:
            ttl, cap = retention.completed_ttl, retention.completed_max
        else:
            ttl, cap = retention.failed_ttl, retention.failed_max
        finished = self._finished[state]
        jobs = self._jobs
        all_counts, trimmed = self._counts, self._trimmed
        # Past the count bound: the oldest go, without looking at their age.
        for _ in range(len(finished) - cap):
            job = jobs.pop(finished.popitem(last=False)[0])
            all_counts[job.message.queue][state] -= 1
            counted = trimmed[job.message.queue]
            counted[state] = counted.get(state, 0) + 1
        expired = now - ttl
        while finished:
            job_id, finished_at = next(iter(finished.items()))
            if finished_at > expired:
                break
            del finished[job_id]
            job = jobs.pop(job_id)
            all_counts[job.message.queue][state] -= 1
            counted = trimmed[job.message.queue]
            counted[state] = counted.get(state, 0) + 1

    def _promote_due(self, now: float) -> None:
        scheduled = self._scheduled
        while scheduled and scheduled[0][0] <= now:
            _, version, job_id = heapq.heappop(scheduled)
            job = self._jobs.get(job_id)
            if job is not None and job.version == version and job.state is JobState.SCHEDULED:
                self._to_waiting(job, keep_order=False)

    def _next_run_at(self) -> float | None:
        """The run_at of the earliest live scheduled entry; stale heads are dropped."""
        scheduled = self._scheduled
        while scheduled:
            run_at, version, job_id = scheduled[0]
            job = self._jobs.get(job_id)
            if job is not None and job.version == version and job.state is JobState.SCHEDULED:
                return run_at
            heapq.heappop(scheduled)
        return None

    def _head(self, queue: str) -> _Entry | None:
        line = self._waiting.get(queue)
        while line:
            entry = line.peek()
            assert entry is not None
            job = self._jobs.get(entry[3])
            if job is not None and job.version == entry[2] and job.state is _WAITING:
                return entry
            line.pop()
        return None

    def _fenced(self, job_id: str, token: str) -> tuple[_Job | None, FinishOutcome]:
        job = self._jobs.get(job_id)
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
        now = self.clock()
        limit = self.settings.max_queue_length
        if limit:
            adding: dict[str, int] = defaultdict(int)
            fresh: set[str] = set()
            for message in messages:
                # Only jobs this call creates count: an existing id, or an id repeated
                # within the batch after its first occurrence, adds nothing.
                if message.id not in self._jobs and message.id not in fresh:
                    fresh.add(message.id)
                    adding[message.queue] += 1
            # The call's cap is the smallest of every queue it names, also of queues whose
            # jobs all exist already: the Redis broker's, which learns which are new only
            # inside its script (Broker.queue_cap).
            cap = self.queue_cap({m.queue for m in messages})
            self._check_room(adding, cap, "adding {extra}")
        # One pass, no per-job calls: the job, its heap entry and its outcome. Counters
        # and per-queue lookups live in locals and are stored back once.
        jobs = self._jobs
        all_counts = self._counts
        waiting = self._waiting
        scheduled = self._scheduled
        seq = self._seq
        version = self._versions
        outcomes: list[EnqueueOutcome] = []
        append = outcomes.append
        last_queue = None
        last_key = 0
        counts: dict[JobState, int] = {}
        fifo: deque[_Entry] | None = None  # the level of (last_queue, last_key), once used
        for message in messages:
            job_id = message.id
            if job_id in jobs:
                append(EnqueueOutcome(job_id, False))
                continue
            queue = message.queue
            key = -message.priority
            if queue != last_queue:
                last_queue, last_key, fifo = queue, key, None
                counts = all_counts[queue]
                self._queues.add(queue)  # the queue registry: producers' queues too
            elif key != last_key:
                last_key, fifo = key, None
            seq += 1
            version += 1
            eta = message.eta
            run_at = eta if eta > 0 else (now + message.delay if message.delay > 0 else 0.0)
            if run_at > now:
                jobs[job_id] = _Job(message, now, seq, version, _SCHEDULED, run_at=run_at)
                counts[_SCHEDULED] += 1
                heapq.heappush(scheduled, (run_at, version, job_id))
            else:
                jobs[job_id] = _Job(message, now, seq, version)
                counts[_WAITING] += 1
                if fifo is None:
                    fifo = waiting[queue].level(key).fifo
                # A new order is above every order given before: the tail of its level.
                fifo.append((key, seq, version, job_id))
            append(EnqueueOutcome(job_id, True))
        self._seq = seq
        self._versions = version
        return outcomes

    async def get(self, ids: Sequence[str], *, queue: str | None = None) -> list[JobRecord | None]:
        self._check()
        return [job.snapshot() if (job := self._jobs.get(i)) is not None else None for i in ids]

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
        job = self._jobs.get(job_id)
        if job is None:
            return None
        if not job.state.is_final:
            event = self._finish_waiters.get(job_id)
            if event is None:
                event = self._finish_waiters[job_id] = anyio.Event()
            with anyio.move_on_after(timeout):
                await event.wait()
            job = self._jobs.get(job_id)
        return job.snapshot() if job is not None and job.state.is_final else None

    async def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        self._check()
        job = self._jobs.get(job_id)
        if job is None:
            return CancelOutcome.NOT_FOUND
        if job.state.is_final:
            return CancelOutcome.ALREADY_FINAL
        if job.state is JobState.ACTIVE:
            job.cancel_requested = True
            assert self._cancels is not None
            self._cancels.set()
            self._cancels = anyio.Event()
            return CancelOutcome.REQUESTED
        now = self.clock()
        job.error = _encode(
            broker_failure(
                "cancelled", cancelled_while(job.state.value), attempt=job.attempt, failed_at=now
            )
        )
        self._to_final(job, JobState.CANCELLED, now)
        return CancelOutcome.CANCELLED

    async def counts(self, queue: str) -> dict[JobState, int]:
        self._check()
        return dict(self._counts[queue])

    # -- worker side ---------------------------------------------------------------

    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """Declare tasks' limits; every later claim enforces them (see :meth:`_admit`)."""
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
        record = self._claim_record(claim_id)
        if record is not None:
            # A re-sent claim: the first copy's jobs still held under it, nothing new.
            prefix = claim_id + "."
            return [
                self._claimed(job)
                for job_id in record
                if (job := self._active.get(job_id)) is not None
                and (job.active_token or "").startswith(prefix)
            ]
        now = self.clock()
        if self._scheduled:
            self._promote_due(now)
        now_us = round(now * _MICRO)
        if self._gates:
            self._unpark(queues, now_us)
        limits = self.limits
        lease_until = time.monotonic() + lease
        # Take the best entry of the queues' lines until `limit` jobs are taken: O(1) per
        # job for one queue, O(queues) for several. A stale entry (the job moved on since
        # it was pushed) is dropped on the way, which is all that lazy deletion asks.
        lines = [line for queue in queues if (line := self._waiting.get(queue))]
        jobs = self._jobs
        active = self._active
        all_counts = self._counts
        version = self._versions
        claimed: list[ClaimedJob] = []
        ids: list[str] = []
        last_queue = None
        counts: dict[JobState, int] = {}
        while lines and len(claimed) < limit:
            line = lines[0] if len(lines) == 1 else min(lines, key=_best)
            entry = line.pop()
            if not line:
                lines = [other for other in lines if other is not line]
            if entry is None:
                continue
            job = jobs.get(entry[3])
            if job is None or job.version != entry[2] or job.state is not _WAITING:
                continue
            if limits and not self._admit(job, entry, now_us):
                continue  # parked by its closed gate; the claim goes on with other jobs
            message = job.message
            if message.queue != last_queue:
                last_queue = message.queue
                counts = all_counts[last_queue]
            counts[_WAITING] -= 1
            counts[_ACTIVE] += 1
            version += 1
            job.version = version
            job.state = _ACTIVE
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
        self._versions = version
        if claimed:
            # A tuple of strings: the GC stops tracking it, though it is kept a minute.
            self._claims[claim_id] = (time.monotonic(), tuple(ids))
        return claimed

    # -- limits (typedq.limits) -------------------------------------------------------

    def _admit(self, job: _Job, entry: tuple[int, int, int, str], now_us: int) -> bool:
        """Take ``job``'s rate token and concurrency slot, or park it by its closed gate.

        The same rules as the Redis claim script: concurrency first, then the sliding window.
        """
        message = job.message
        spec = self.limits.get(message.task)
        if spec is None:
            return True
        slot = (message.task, message.concurrency_key)
        if spec.concurrency and self._held(slot, now_us) >= spec.concurrency:
            self._park((message.queue, "c", *slot), entry, self._ghost_ends(slot))
            return False
        if spec.rate:
            bucket = (message.task, message.rate_key)
            starts = self._window(bucket, spec.per_us, now_us)
            if len(starts) >= spec.rate:
                # Open once the start `rate` places back leaves the window.
                opens = starts[len(starts) - spec.rate] + spec.per_us
                self._park((message.queue, "r", *bucket), entry, opens)
                return False
            # Spaced starts (RateLimit.spacing_us): the next turn, taken up to early_us
            # before it; the start is recorded at its turn.
            turn = max(now_us, starts[-1] + spec.spacing_us) if starts else now_us
            if spec.spacing_us and turn > now_us + spec.early_us:
                self._park((message.queue, "r", *bucket), entry, turn - spec.early_us)
                return False
            starts.append(turn if spec.spacing_us else now_us)
        if spec.concurrency:
            self._slots.setdefault(slot, set()).add(message.id)
            job.slot = slot
        return True

    def _window(self, bucket: tuple[str, str], per_us: int, now_us: int) -> deque[int]:
        """The bucket's start times in ``(now - per, now]``, oldest first (older ones go)."""
        starts = self._starts.get(bucket)
        if starts is None:
            starts = self._starts[bucket] = deque()
        while starts and starts[0] <= now_us - per_us:
            starts.popleft()
        return starts

    def _park(self, gate: _Gate, entry: tuple[int, int, int, str], opens_us: float) -> None:
        heapq.heappush(self._parked.setdefault(gate, []), entry)
        self._gates[gate] = opens_us

    def _unpark(self, queues: Sequence[str], now_us: int) -> None:
        """Give the open gates of ``queues`` back as many of their parked jobs as their
        bucket admits now, best first (heap entries keep their place); the claim admits
        or parks them again. A gate whose task this broker does not limit (any more)
        gives back all of them."""
        wanted = set(queues)
        for gate in [g for g, opens in self._gates.items() if opens <= now_us and g[0] in wanted]:
            queue, kind, task, key = gate
            parked = self._parked.get(gate, [])
            spec = self.limits.get(task)
            room, opens = len(parked), 0.0
            if spec is not None and kind == "c" and spec.concurrency:
                room = spec.concurrency - self._held((task, key), now_us)
                opens = self._ghost_ends((task, key))
            elif spec is not None and kind == "r" and spec.rate:
                starts = self._window((task, key), spec.per_us, now_us)
                room = spec.rate - len(starts)
                opens = starts[len(starts) - spec.rate] + spec.per_us if room <= 0 else now_us
                if room > 0 and spec.spacing_us and starts:
                    # Spaced: the turns from the next one to now + early_us.
                    turn = max(now_us, starts[-1] + spec.spacing_us)
                    if turn > now_us + spec.early_us:
                        room, opens = 0, turn - spec.early_us
                    else:
                        room = min(room, (now_us + spec.early_us - turn) // spec.spacing_us + 1)
            closed = room <= 0
            line = self._waiting[queue]
            while parked and room > 0:
                entry = heapq.heappop(parked)
                job = self._jobs.get(entry[3])
                if job is not None and job.version == entry[2] and job.state is JobState.WAITING:
                    line.push(entry)
                    room -= 1  # (an entry of a job that left waiting is dropped)
            if parked and closed:
                # Full now (so someone holds a slot or a recent start): closed until then.
                # Otherwise it stays open and the next claim counts again.
                self._gates[gate] = opens
            elif not parked:
                del self._gates[gate]
                self._parked.pop(gate, None)

    def _held(self, slot: tuple[str, str], now_us: float) -> int:
        """How many of ``slot``'s places are held; ghosts whose lease ended leave first."""
        ghosts = self._ghosts.get(slot)
        if ghosts:
            holders = self._slots.get(slot, set())
            for ghost in [g for g, ends in ghosts.items() if ends <= now_us]:
                del ghosts[ghost]
                holders.discard(ghost)
            if not ghosts:
                del self._ghosts[slot]
            if not holders:
                self._slots.pop(slot, None)
        return len(self._slots.get(slot, ()))

    def _ghost_ends(self, slot: tuple[str, str]) -> float:
        """When a full slot frees a place by itself: its first ghost's end, else never."""
        return min(self._ghosts.get(slot, {}).values(), default=float("inf"))

    def _ghost_slot(self, job: _Job) -> None:
        """An operator deletes active ``job`` while its handler may still run: its place
        in the slot goes to a ghost until its lease would have ended (by then its worker,
        told the lease is lost, has cancelled the handler); the same rule as the Redis
        scripts' ghost_slot."""
        slot = job.slot
        if slot is None:
            return
        now_us = self.clock() * _MICRO
        ends = now_us + (job.lease_until - time.monotonic()) * _MICRO
        if ends <= now_us:
            self._free_slot(job)
            return
        job.slot = None
        holders = self._slots.setdefault(slot, set())
        holders.discard(job.message.id)
        ghost = "~" + job.message.id
        holders.add(ghost)
        self._ghosts.setdefault(slot, {})[ghost] = ends
        gate = (job.message.queue, "c", *slot)
        if gate in self._gates and self._gates[gate] > ends:
            self._gates[gate] = ends
            self.wake()

    def _free_slot(self, job: _Job) -> None:
        """Release the concurrency slot ``job`` holds and open the gate of its key."""
        slot = job.slot
        if slot is None:
            return
        job.slot = None
        holders = self._slots.get(slot)
        if holders is not None:
            holders.discard(job.message.id)
            if not holders:
                del self._slots[slot]
        gate = (job.message.queue, "c", *slot)
        if gate in self._gates:
            self._gates[gate] = 0.0
            self.wake()

    def _next_gate(self, queues: Sequence[str]) -> float | None:
        """When (seconds of `clock`) the earliest gate of ``queues`` opens, if one will."""
        times = [opens for gate, opens in self._gates.items() if gate[0] in queues]
        earliest = min(times, default=float("inf"))
        return None if earliest == float("inf") else earliest / _MICRO

    @staticmethod
    def _claimed(job: _Job) -> ClaimedJob:
        assert job.active_token is not None
        return ClaimedJob(
            message=job.message,
            token=job.active_token,
            attempt=job.attempt,
            enqueued_at=job.enqueued_at,
            stalls=job.stalls,
            run_at=job.run_at,
        )

    def _claim_record(self, claim_id: str) -> tuple[str, ...] | None:
        """The job ids a claim with this id took, while it is remembered; drops the
        records older than CLAIM_RECORD_TTL (oldest first: they are kept in order)."""
        expired = time.monotonic() - CLAIM_RECORD_TTL
        while self._claims:
            oldest = next(iter(self._claims.values()))
            if oldest[0] >= expired:
                break
            self._claims.popitem(last=False)
        record = self._claims.get(claim_id)
        return None if record is None else record[1]

    def has_due_jobs(self) -> bool:
        """True when some job is waiting, or scheduled at or before the clock's now."""
        if any(self._head(queue) is not None for queue in list(self._waiting)):
            return True
        now = self.clock()
        if any(opens <= now * _MICRO for opens in self._gates.values()):
            return True
        return any(
            run_at <= now
            and (job := self._jobs.get(job_id)) is not None
            and job.version == version
            and job.state is JobState.SCHEDULED
            for run_at, version, job_id in self._scheduled
        )

    def _due_soon(self, queues: Sequence[str]) -> float:
        """Seconds until something in ``queues`` may be claimable (0 = now)."""
        if any(self._head(q) is not None for q in queues):
            return 0.0
        due = [t for t in (self._next_run_at(), self._next_gate(queues)) if t is not None]
        if due:
            return max(0.0, min(due) - self.clock())
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
        lease_until = time.monotonic() + lease
        statuses = []
        for job_id, token in leases:
            job = self._active.get(job_id)
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
        now = self.clock()
        jobs = self._jobs
        outcomes: list[FinishOutcome] = []
        done: dict[str, int] = {}  # completions per queue, for the minute's rollup
        for item in items:
            job = jobs.get(item.id)
            token = item.token
            if job is not None and job.state is _ACTIVE and job.active_token == token:
                job.result = item.result
                job.done_token = token
                if item.span:
                    self._note_span(job, item.span)
                self._finish(job, _COMPLETED, now)
                queue = job.message.queue
                done[queue] = done.get(queue, 0) + 1
                outcomes.append(_OK)
            else:
                outcomes.append(self._fenced(item.id, token)[1])
        # Once per batch, not per job: the rollup, and retention (the batch's jobs count
        # against the bound once they are all in).
        for queue, count in done.items():
            self._roll(queue, 0, now, count)
        if done:
            self._trim(_COMPLETED, now)
        return outcomes

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        self._check()
        now = self.clock()
        outcomes = []
        ended: set[JobState] = set()
        for item in items:
            job, outcome = self._fenced(item.id, item.token)
            if job is not None:
                job.add_error(item.error)
                job.done_token = item.token
                if item.cancelled or (item.retry_delay is None) or job.cancel_requested:
                    if item.span:
                        self._note_span(job, item.span)
                    state = _CANCELLED if item.cancelled or job.cancel_requested else _FAILED
                    self._finish(job, state, now)
                    if state is _FAILED:
                        self._roll(job.message.queue, 1, now)
                    ended.add(state)
                else:
                    self._active.pop(job.message.id, None)
                    self._free_slot(job)
                    job.active_token = None
                    self._roll(job.message.queue, 2, now)
                    if item.refund:
                        job.attempt -= 1  # put back unspent (RateLimited)
                    if item.retry_delay > 0:
                        self._to_scheduled(job, now + item.retry_delay)
                    else:
                        self._to_waiting(job, keep_order=False, due=now)
            outcomes.append(outcome)
        for state in ended:
            self._trim(state, now)
        self.wake()
        return outcomes

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        self._check()
        outcomes = []
        for item in items:
            job, outcome = self._fenced(item.id, item.token)
            if job is not None:
                self._active.pop(job.message.id, None)
                self._free_slot(job)
                job.active_token = None
                job.done_token = item.token
                job.attempt -= 1  # handed back unrun: the attempt was not spent
                if job.cancel_requested:
                    now = self.clock()
                    # A final state carries its record: Job.result() decodes it.
                    job.error = _encode(
                        broker_failure(
                            "cancelled",
                            CANCELLED_ON_HAND_BACK,
                            attempt=job.attempt,
                            worker_id=job.worker_id,
                            failed_at=now,
                        )
                    )
                    self._to_final(job, JobState.CANCELLED, now)
                else:
                    self._to_waiting(job, keep_order=True, due=self.clock())
            outcomes.append(outcome)
        self.wake()
        return outcomes

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        self._check()
        job = self._active.get(job_id)
        if job is None or job.active_token != token:
            return False
        job.progress = progress
        return True

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        self._check()
        return [i for i in ids if (job := self._active.get(i)) is not None and job.cancel_requested]

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
        now = self.clock()
        for state in self._finished:
            self._trim(state, now)
        deadline = time.monotonic()
        mine = set(holding)
        expired = [
            job
            for job in self._active.values()
            if job.lease_until < deadline and job.message.id not in mine
        ][:limit]
        for job in expired:
            job.stalls += 1
            job.done_token = None
            if job.cancel_requested or job.stalls > self.settings.max_stalls:
                cancelled = job.cancel_requested
                record = _encode(
                    broker_failure(
                        "cancelled" if cancelled else "stalled",
                        CANCELLED_WORKER_LOST
                        if cancelled
                        else stalled_message(job.stalls, self.settings.max_stalls),
                        attempt=job.attempt,
                        worker_id=job.worker_id,
                        failed_at=now,
                    )
                )
                if cancelled:
                    job.error = record
                else:
                    job.add_error(record)
                self._to_final(job, JobState.CANCELLED if cancelled else JobState.FAILED, now)
            else:
                self._active.pop(job.message.id, None)
                self._free_slot(job)
                job.active_token = None
                self._to_waiting(job, keep_order=True, due=now)
        now_us = now * _MICRO
        windows = {spec.per_us for spec in self.limits.values() if spec.rate}
        longest = max(windows, default=0)
        for bucket in [b for b, s in self._starts.items() if not s or s[-1] <= now_us - longest]:
            del self._starts[bucket]  # nothing left in any window: as good as new
        if expired:
            self.wake()
        return len(expired)

    # -- schedules ---------------------------------------------------------------------

    def _now_us(self) -> int:
        return round(self.clock() * 1_000_000)

    async def broker_time_us(self) -> int:
        self._check()
        return self._now_us()

    async def sleep_until_us(self, when_us: int) -> None:
        self._check()
        delta = (when_us - self._now_us()) / 1_000_000
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
        now = self._now_us()
        if prune:
            keep = {name for name, _ in schedules}
            for name in [n for n in self._schedules if n not in keep]:
                del self._schedules[name]
        states = []
        for name, digest in schedules:
            state = self._schedules.get(name)
            if state is None or state.digest != digest:
                state = self._schedules[name] = ScheduleState(
                    name=name, digest=digest, last_tick_us=now
                )
            states.append(state)
        return states

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        self._check()
        return [self._fire(firing) for firing in firings]

    def _fire(self, f: TickFiring) -> tuple[FireOutcome, ScheduleState | None]:
        state = self._schedules.get(f.name)
        now = self._now_us()
        if (
            state is None
            or state.digest != f.digest
            or state.last_tick_us != f.expected_last_us
            or f.new_last_us <= f.expected_last_us
            or f.new_last_us > now  # a tick is never fired before its time, by our clock
        ):
            return FireOutcome.STALE, state
        if f.messages and f.overlap != "allow" and state.last_job:
            previous = self._jobs.get(state.last_job)
            if previous is not None and not previous.state.is_final:
                if f.overlap == "queue":
                    return FireOutcome.HELD, state
                state = self._schedules[f.name] = msgspec.structs.replace(
                    state,
                    last_tick_us=f.new_last_us,
                    skipped=state.skipped + f.skipped + len(f.messages),
                )
                return FireOutcome.OVERLAP_SKIPPED, state
        outcome = FireOutcome.FIRED
        fired = len(f.messages)
        if f.messages:
            try:
                self._enqueue(f.messages)
                self.wake()
            except QueueFull:
                outcome, fired = FireOutcome.FULL, 0
        state = self._schedules[f.name] = msgspec.structs.replace(
            state,
            last_tick_us=f.new_last_us,
            last_job=f.messages[-1].id if fired else state.last_job,
            last_fired_us=now if fired else state.last_fired_us,
            fired=state.fired + fired,
            skipped=state.skipped + f.skipped + len(f.messages) - fired,
        )
        return outcome, state

    async def schedule_states(self) -> list[ScheduleState]:
        self._check()
        return [self._schedules[name] for name in sorted(self._schedules)]

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
            job for job in self._jobs.values() if job.message.queue == queue and job.state in wanted
        ]:
            for job in doomed:
                self._delete(job, react=False)
            for job in doomed:
                self._flow_removed(job)
            removed += len(doomed)
        return removed

    def _delete(self, job: _Job, *, react: bool = True) -> None:
        del self._jobs[job.message.id]
        if self._active.pop(job.message.id, None) is not None:
            self._ghost_slot(job)  # its handler may still run: the slot is held
        else:
            self._free_slot(job)
        self._counts[job.message.queue][job.state] -= 1
        if job.state.is_final:
            self._finished[job.state].pop(job.message.id, None)
        waiter = self._finish_waiters.pop(job.message.id, None)
        if waiter is not None:
            waiter.set()
        if react:
            self._flow_removed(job)

    def _flow_removed(self, job: _Job) -> None:
        """A deleted job of a flow had not finished: its flow treats it as failed with
        reason ``flow_broken`` (attempt 0, like the Redis twin ``flow_removed``)."""
        if job.flow_id is not None and not job.state.is_final:
            now = self.clock()
            record = _encode(
                broker_failure("flow_broken", FLOW_BROKEN_MESSAGE, attempt=0, failed_at=now)
            )
            self._flow_settled(job, JobState.FAILED, None, record, now)

    # -- workflows (see typedq.broker.flow) ------------------------------------------

    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        self._check()
        for spec in flows:
            check_numbers((*spec.members, *spec.steps))
        out: list[EnqueueOutcome | Exception] = []
        for spec in flows:
            try:
                out.append(self._enqueue_flow(spec))
            except (QueueFull, ConfigError) as exc:
                out.append(exc)
        self.wake()
        return out

    def _enqueue_flow(self, spec: FlowSpec) -> EnqueueOutcome:
        if spec.id in self._jobs:
            return EnqueueOutcome(spec.id, False)
        jobs = [*spec.members, *spec.steps]
        taken = next((m.id for m in jobs if m.id in self._jobs), None)
        if taken is not None:
            raise ConfigError(id_taken(taken, spec.id))
        limit = self.settings.max_queue_length
        if limit:
            adding: dict[str, int] = defaultdict(int)
            for message in jobs:
                adding[message.queue] += 1
            self._check_room(adding, self.queue_cap(adding), "this flow's {extra} jobs")
        now = self.clock()
        flow = _Flow(spec)
        self._flows[spec.id] = flow
        for index, message in enumerate(spec.members):
            job = self._new_job(message, now, spec.id)
            job.flow_member = index
            self._to_waiting(job, keep_order=True)
        for index, message in enumerate(spec.steps):
            job = self._new_job(message, now, spec.id)
            job.flow_step = index
            if index == len(spec.steps) - 1:
                job.flow_shape = (len(spec.steps), len(spec.members))
            if index == 0 and not spec.fan_out:
                self._to_waiting(job, keep_order=True)
            else:
                # Held: scheduled, but outside the due-time heap, so no clock (however
                # far a test's fake clock moves) ever promotes it; only the hand-off does.
                self._move(job, JobState.SCHEDULED)
                job.run_at = HELD_AT
        if spec.fan_out and not spec.members:
            self._fan_in(flow, now)
        return EnqueueOutcome(spec.id, True)

    def _new_job(self, message: JobMessage, now: float, flow_id: str) -> _Job:
        # A job id taken by an unrelated job is replaced in no case: flow ids are fresh.
        job = _Job(message, now, self._next())
        job.flow_id = flow_id
        self._jobs[message.id] = job
        self._counts[message.queue][JobState.WAITING] += 1  # _move subtracts from it
        self._queues.add(message.queue)
        return job

    def _note_span(self, job: _Job, span: str) -> None:
        """Keep a fan-out member's process span for its callback's links (as flow_settle
        in common.lua: the first settle of the first MAX_SPAN_LINKS members)."""
        index = job.flow_member
        flow = None if job.flow_id is None else self._flows.get(job.flow_id)
        if flow is not None and 0 <= index < MAX_SPAN_LINKS and not flow.settled[index]:
            flow.links[index] = span

    def _flow_settled(
        self, job: _Job, state: JobState, result: bytes | None, error: bytes | None, now: float
    ) -> None:
        """A job of a flow reached a final state (or was removed): hand off or end."""
        assert job.flow_id is not None
        flow = self._flows.get(job.flow_id)
        if flow is None:
            return  # the flow has ended: a late member or a cancelled step
        if job.flow_member >= 0:
            index = job.flow_member
            if flow.settled[index]:
                return  # settled before (a retried member): counted once
            flow.settled[index] = 1
            flow.tally[state] = flow.tally.get(state, 0) + 1
            ok = state is JobState.COMPLETED
            if flow.collect:
                flow.outcomes[index] = collect_element(result if ok else None, error)
            elif ok:
                flow.outcomes[index] = result
            elif flow.failed is None or index < flow.failed[0]:
                flow.failed = (index, state, error)
            flow.remaining -= 1
            if flow.remaining == 0:
                self._fan_in(flow, now)
            return
        if state is JobState.COMPLETED:
            if job.flow_step == flow.steps - 1:
                del self._flows[flow.id]
            else:
                self._release(flow, job.flow_step + 1, result or b"\xc0", now)
        elif job.flow_step == flow.steps - 1 and state is JobState.CANCELLED:
            # The flow's own job was cancelled first: cancel everything else. (Removed,
            # it fails the rest with flow_broken like any removed step: a purge that
            # takes a held step and the flow's own job gives one answer in any order.)
            self._end_flow(flow, JobState.CANCELLED, None, now)
        else:
            self._end_flow(flow, state, error, now)

    def _fan_in(self, flow: _Flow, now: float) -> None:
        if flow.failed is not None:
            _, state, error = flow.failed
            self._end_flow(flow, state, error, now)
            return
        payload = fan_in_payload([o or b"\xc0" for o in flow.outcomes])
        flow.outcomes = []
        links = ",".join(flow.links[i] for i in sorted(flow.links))
        self._release(flow, 0, payload, now, links)

    def _release(
        self, flow: _Flow, index: int, payload: bytes, now: float, links: str = ""
    ) -> None:
        """Give held step ``index`` its input: waiting now (or, a collector, completed).
        ``links``: the members' spans, for a fan-in callback that carries a trace context."""
        job = self._jobs.get(step_id(flow.id, index, flow.steps))
        if job is None or job.state is not JobState.SCHEDULED:
            record = _encode(
                broker_failure("flow_broken", FLOW_BROKEN_MESSAGE, attempt=0, failed_at=now)
            )
            self._end_flow(flow, JobState.FAILED, record, now)
            return
        if flow.collector and index == flow.steps - 1:
            job.result = payload
            self._to_final(job, JobState.COMPLETED, now)  # the flow's job: ends the flow
            return
        if links and job.message.trace_context:
            job.message = msgspec.structs.replace(job.message, payload=payload, trace_links=links)
        else:
            job.message = msgspec.structs.replace(job.message, payload=payload)
        # At the head of its priority level (the latest released first, like a push at
        # the head of the Redis level list): a flow under way finishes before new work.
        self._to_waiting(job, keep_order=False, at_head=True, due=now)
        self.wake()

    def _end_flow(self, flow: _Flow, state: JobState, error: bytes | None, now: float) -> None:
        """End a flow that did not complete: every job of it not yet final ends in ``state``
        with ``error`` (None: a cancel record); a running one is asked to cancel."""
        self._flows.pop(flow.id, None)
        ids = [member_id(flow.id, i) for i in range(flow.members)]
        ids += [step_id(flow.id, k, flow.steps) for k in range(flow.steps)]
        for job_id in ids:
            job = self._jobs.get(job_id)
            if job is None or job.state.is_final:
                continue
            if job.state is JobState.ACTIVE:
                job.cancel_requested = True
                assert self._cancels is not None
                self._cancels.set()
                self._cancels = anyio.Event()
                continue
            job.error = error or _encode(
                broker_failure("cancelled", CANCELLED_WITH_FLOW, attempt=job.attempt, failed_at=now)
            )
            self._to_final(job, state if error is not None else JobState.CANCELLED, now)

    def _flow_retry(self, job: _Job) -> bool:
        """A failed or cancelled job of a flow is retried: may it run again? A step that
        ran, of a flow that has ended, resumes the flow (its later steps, ended with it
        and never run, are held again); a fan-out member, a step that never ran, a job
        of a running flow or of a flow whose later steps are gone may not (see the Redis
        twin, ``flow_retry`` in common.lua)."""
        assert job.flow_id is not None
        if job.flow_member >= 0 or job.flow_id in self._flows:
            return False
        if not job.message.payload:
            return False  # held when its flow ended: never ran (a payload is never b"")
        own = self._jobs.get(job.flow_id)
        if own is None or own.flow_shape is None:
            return False
        steps, members = own.flow_shape
        later = [
            self._jobs.get(step_id(job.flow_id, k, steps)) for k in range(job.flow_step + 1, steps)
        ]
        held: list[_Job] = []
        for step in later:
            if step is None or step.state not in (JobState.FAILED, JobState.CANCELLED):
                return False
            if step.message.payload:
                return False  # ran (released): not a step this flow's end stopped
            held.append(step)
        for step in held:
            self._finished[step.state].pop(step.message.id, None)
            step.error = None
            step.finished_at = 0.0
            self._move(step, JobState.SCHEDULED)
            step.run_at = HELD_AT
        flow = _Flow(FlowSpec(id=job.flow_id, steps=tuple(self._flow_steps(job.flow_id, steps))))
        flow.members = members
        self._flows[job.flow_id] = flow
        return True

    def _flow_steps(self, flow_id: str, steps: int) -> list[JobMessage]:
        out = []
        for k in range(steps):
            step = self._jobs.get(step_id(flow_id, k, steps))
            assert step is not None
            out.append(step.message)
        return out

    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None:
        self._check()
        job = self._jobs.get(flow_id)
        if job is not None and job.flow_id is not None:
            flow_id = job.flow_id
        flow = self._flows.get(flow_id)
        if flow is not None:
            return FlowState(
                id=flow_id,
                steps=flow.steps,
                members=flow.members,
                pending=flow.remaining,
                completed=flow.tally.get(JobState.COMPLETED, 0),
                failed=flow.tally.get(JobState.FAILED, 0),
                cancelled=flow.tally.get(JobState.CANCELLED, 0),
            )
        own = self._jobs.get(flow_id)
        if own is None or own.flow_shape is None:
            return None
        return FlowState(id=flow_id, steps=own.flow_shape[0], members=own.flow_shape[1], pending=-1)

    # -- operations ------------------------------------------------------------------

    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        self._check()
        places = self._places(queue, state)
        if not state.is_final:
            places.sort()
        return [key[2] for key in places[offset : offset + limit]]

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        # A cursor is the place of the last job listed, (number, order, id) in the
        # state's order: the page goes on after that place, wherever the jobs before it
        # went meanwhile, so a job that stays in the state is listed once. A page costs
        # one pass over the queue's jobs (no sort of the whole state).
        self._check()
        letter = _CURSOR_LETTERS[state]
        after = None if cursor is None else _cursor_place(cursor, letter)
        limit = max(0, min(limit, 1000))
        places = self._places(queue, state)
        if after is not None:
            places = [place for place in places if place > after]
        # Final states come in order; the others are taken smallest first.
        page = places[: limit + 1] if state.is_final else heapq.nsmallest(limit + 1, places)
        ids = [place[2] for place in page[:limit]]
        if len(page) <= limit or not ids:
            return JobList(ids, None)
        a, b, last = page[limit - 1]
        return JobList(ids, f"{letter}{a!r}:{b}:{last}")

    def _places(self, queue: str, state: JobState) -> list[tuple[float, int, str]]:
        """The jobs of ``queue`` in ``state`` as places in the state's order: waiting
        (-priority, order), scheduled (due time, order), active (start time, order),
        final states most recently finished first (-version: a job's version is set when
        it finishes and stays while it is finished), each with its id. Final states come
        in order; the others unsorted."""
        if state.is_final:
            jobs = self._jobs
            return [
                (-jobs[job_id].version, 0, job_id)
                for job_id in reversed(self._finished[state])
                if jobs[job_id].message.queue == queue
            ]
        jobs_in = [j for j in self._jobs.values() if j.message.queue == queue and j.state is state]
        if state is JobState.WAITING:
            return [(-j.message.priority, j.order, j.message.id) for j in jobs_in]
        if state is JobState.SCHEDULED:
            return [(j.run_at, j.order, j.message.id) for j in jobs_in]
        return [(j.started_at, j.order, j.message.id) for j in jobs_in]

    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        self._check()
        outcomes = []
        for job_id in ids:
            job = self._jobs.get(job_id)
            if job is None:
                outcomes.append(RetryOutcome.NOT_FOUND)
                continue
            if job.state not in (JobState.FAILED, JobState.CANCELLED):
                outcomes.append(RetryOutcome.NOT_RETRYABLE)
                continue
            if job.flow_id is not None and not self._flow_retry(job):
                outcomes.append(RetryOutcome.IN_FLOW)
                continue
            self._finished[job.state].pop(job_id, None)
            job.attempt = 0
            job.stalls = 0
            job.started_at = job.finished_at = 0.0
            job.result = job.error = job.progress = None
            job.cancel_requested = False
            job.worker_id = None
            # A token from before the retry answers LEASE_LOST, not ALREADY_FINISHED:
            # the job has started a new life that no old lease may speak for.
            job.done_token = None
            self._to_waiting(job, keep_order=False, due=self.clock())
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
            job = self._jobs.get(job_id)
            ok = job is not None and (wanted is None or job.state in wanted)
            if ok:
                assert job is not None
                self._delete(job)
            removed.append(ok)
        return removed

    # -- observability -------------------------------------------------------------

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        self._check()
        now = self.clock()
        oldest: dict[str, float] = {}
        wanted = set(queues)
        for queue in wanted:
            for _, _, version, job_id in self._waiting.get(queue) or ():
                job = self._jobs.get(job_id)
                if job is not None and job.version == version and job.state is JobState.WAITING:
                    # Waiting since it became due: its due time when it has one (a
                    # retry's, a hand-back's, a delayed job's, ...), else its enqueue or
                    # the time its eta or delay named.
                    if job.run_at > 0:
                        due = job.run_at
                    else:
                        m = job.message
                        due = m.eta if m.eta > 0 else job.enqueued_at + m.delay
                        due = max(job.enqueued_at, due)
                    oldest[queue] = min(oldest.get(queue, now), due)
        # Due jobs not promoted yet (promotion happens at claim) are waiting too.
        for run_at, version, job_id in self._scheduled:
            if run_at <= now:
                job = self._jobs.get(job_id)
                if (
                    job is not None
                    and job.version == version
                    and job.message.queue in wanted
                    and job.state is JobState.SCHEDULED
                ):
                    queue = job.message.queue
                    oldest[queue] = min(oldest.get(queue, now), run_at)
        return [
            QueueStats(
                queue=q,
                counts=dict(self._counts[q]) if q in self._counts else dict.fromkeys(JobState, 0),
                oldest_waiting=max(0.0, now - oldest[q]) if q in oldest else 0.0,
                trimmed=dict(self._trimmed.get(q, {})),
            )
            for q in queues
        ]

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        self._check()
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        now = int(self.clock() // 60)
        out = []
        for queue in queues:
            rows = self._rollups.get(queue, {})
            out.append(
                [
                    MinuteRollup(m * 60, *rows.get(m, (0, 0, 0)))
                    for m in range(now - minutes + 1, now + 1)
                ]
            )
        return out

    def _live_workers(self) -> dict[str, tuple[float, WorkerInfo]]:
        now = time.monotonic()
        for worker_id in [w for w, (until, _) in self._workers.items() if until <= now]:
            del self._workers[worker_id]
        return self._workers

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        self._check()
        check_worker_id(info.id)
        self._live_workers()[info.id] = (time.monotonic() + ttl, info)
        self._queues.update(info.queues)

    async def unregister_worker(self, worker_id: str) -> None:
        self._check()
        self._workers.pop(worker_id, None)

    async def list_workers(self) -> list[WorkerInfo]:
        self._check()
        return [info for _, (_, info) in sorted(self._live_workers().items())]

    async def list_queues(self) -> list[str]:
        self._check()
        return sorted(self._queues | {q for q, c in self._counts.items() if any(c.values())})

    async def enable_events(self, queue: str) -> int:
        self._check()
        self._events.setdefault(queue, deque())
        return self._event_seq.setdefault(queue, 0)

    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead:
        self._check()
        if self._event_seq.get(queue, 0) <= after:
            waiter = self._event_waiters.get(queue)
            if waiter is None:
                waiter = self._event_waiters[queue] = anyio.Event()
            with anyio.move_on_after(timeout):
                await waiter.wait()
            self._check()
        ring = self._events.get(queue)
        if not ring or ring[-1].seq <= after:
            return EventRead(events=[])
        # The ring's numbers are consecutive: the first one after `after` is found by index.
        start = max(0, after + 1 - ring[0].seq)
        events = [ring[i] for i in range(start, min(len(ring), start + limit))]
        return EventRead(events=events, missed=max(0, events[0].seq - after - 1))
