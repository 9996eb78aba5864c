"""The broker interface: what every backend implements, batch-first.

A broker moves envelopes (:class:`JobMessage`) between states and knows no tasks,
models or runtime. Every method that touches jobs takes a batch, so a networked
backend does one round trip per call, never one per job.

The values it speaks (envelopes, claims, settles, outcomes, snapshots, and the
capabilities' values) are in :mod:`typedq.broker.messages`, the broker-wide settings in
:mod:`typedq.broker.settings`; this module re-exports them all, so this module alone is
the seam.

States: ``waiting`` (claimable now), ``scheduled`` (delayed or backing off),
``active`` (claimed under a lease), and the final ``completed``, ``failed`` and
``cancelled``. Time for delays comes from the broker's clock (Redis ``TIME`` on
Redis), never from a client's.

The lease protocol (fencing): ``claim`` gives each job a fresh random ``token``. Every
later transition of that job (``renew``, ``complete``, ``fail``, ``release``) names
the token and takes effect only while the token is still the job's own. A lease that
expires is recovered by ``recover_stalled``: the job goes back to ``waiting`` (its
stall count is bumped), or, past ``max_stalls``, to ``failed`` with reason ``stalled``.
Transitions are idempotent per token: re-sending a ``complete`` that already took
effect answers ``ALREADY_FINISHED`` and changes nothing.

The seam: what a new backend implements
=======================================

**The core store** (the abstract methods of :class:`Broker`, 14): a backend is a
Broker once it has these.

- lifetime: ``connect``, ``close``
- producer: ``enqueue``, ``cancel``
- reads: ``get``, ``counts``, ``list_jobs``
- worker: ``claim``, ``renew``, ``complete``, ``fail``, ``release``,
  ``set_progress``, ``recover_stalled``

**Core methods with a default** (10) that a backend overrides to be faster or to push
instead of poll: ``enqueue_batches`` (one ``enqueue`` per batch), ``complete_and_claim``
(two calls), ``page_jobs`` (pages by offset), ``queue_stats`` (``counts`` per queue),
``wait_finished`` (polls ``get``), ``wait_for_jobs`` (sleeps a little),
``wait_for_handoff`` and ``end_handoff`` (``wait_for_jobs``, no direct hand-off),
``cancel_requests`` (none: ``renew`` answering ``CANCEL_REQUESTED`` is the backstop) and
``wait_cancel_requests`` (sleeps). Plus the plain helpers ``set_partitions`` and
``queue_cap`` (``CORE_WITH_DEFAULTS`` in :mod:`typedq.broker.capabilities` lists all 12).

**Capabilities** (:mod:`typedq.broker.capabilities`, one ``typing.Protocol`` each): a
backend adds them by overriding their methods; until it does, the defaults it inherits
(:class:`~typedq.broker.capability_defaults.CapabilityDefaults`, a base of
:class:`Broker`) raise :class:`~typedq.errors.Unsupported` (``flow_state`` answers None:
no job is a flow's).

- ``Flows`` (2): ``enqueue_flows``, ``flow_state`` (typedq.workflow)
- ``Schedules`` (5): ``broker_time_us``, ``sleep_until_us``, ``sync_schedules``,
  ``fire_schedules``, ``schedule_states`` (typedq.schedule)
- ``Limits`` (1): ``set_limits``, whose backend's ``claim`` enforces them (typedq.limits)
- ``Observability`` (5): ``history``, ``register_worker``, ``unregister_worker``,
  ``list_workers``, ``list_queues`` (metrics, the dashboard, ``typedq inspect``)
- ``EventStreams`` (2): ``enable_events``, ``read_events`` (typedq.events)
- ``OperatorActions`` (3): ``retry``, ``remove``, ``purge`` (``typedq inspect``, the
  dashboard)
- ``Runs`` (8): ``create_runs``, ``get_runs``, ``append_runs``, ``signal_runs``,
  ``wake_runs``, ``cancel_runs``, ``wait_run``, ``page_runs`` (typedq.durable,
  ``typedq verify``; values in :mod:`typedq.broker.runs`)
- ``FlowControl`` (1): ``enqueue_controlled``, keyed enqueues under a unique window or a
  debounce (typedq.flowcontrol, docs/flow-control.md)
- ``FlowViews`` (1): ``flow_keys``, bounded pages of a queue's fair keys, debounce keys
  and unique keys held (``typedq inspect``, the dashboard; values in
  :mod:`typedq.broker.flowviews`)
- ``SchemaRegistry`` (3): ``record_schemas``, ``schema_records``,
  ``forget_schemas`` (``typedq verify``; values in :mod:`typedq.broker.schemas`)
- ``FingerprintCounts`` (1): ``count_fingerprints``, a page of a queue's jobs in one
  state counted by ``(task, fingerprint)`` where they are stored (``typedq verify``'s
  exact counts)
- ``JobStreams`` (2): ``append_streams``, ``read_stream`` (typed streams from a task:
  ``emits=``, ``job.stream()``; values in :mod:`typedq.broker.streams`)
- ``TransactionalEnqueue`` (2): ``enqueue_within``, ``enqueue_flows_within``, jobs and
  workflows stored in the caller's own database transaction (``task.enqueue(...,
  within=conn)``, ``flow.enqueue(..., within=conn)``: the PostgreSQL broker)

A client checks the capabilities its app's declarations need once, when it connects
(:func:`typedq.broker.capabilities.require`): an app with schedules, task limits or
event streams on a broker lacking them fails there, in one line. What only some callers
use (the worker registry, history, operator actions, workflows) raises Unsupported
where it is called, and the runtime does without (a worker on a broker with no registry
sends no heartbeat).
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING

import anyio

from ..errors import BrokerError, QueueFull
from .capability_defaults import CapabilityDefaults, capability_default, is_capability_default

# The values the seam speaks live in .messages and .settings; they are re-exported here
# (``__all__``), so ``from typedq.broker.base import JobMessage`` keeps working.
from .messages import (
    CLAIM_RECORD_TTL,
    ERROR_HISTORY,
    HISTORY_MINUTES,
    MAX_SPAN_LINKS,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueControl,
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
    check_claim_id,
    new_claim_id,
)
from .settings import BrokerSettings, Retention

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

__all__ = [
    "CLAIM_RECORD_TTL",
    "ERROR_HISTORY",
    "HISTORY_MINUTES",
    "MAX_SPAN_LINKS",
    "Broker",
    "BrokerSettings",
    "CancelOutcome",
    "ClaimedJob",
    "Completion",
    "EnqueueControl",
    "EnqueueOutcome",
    "EventRead",
    "Failure",
    "FireOutcome",
    "FinishOutcome",
    "JobList",
    "JobMessage",
    "JobRecord",
    "JobState",
    "LeaseStatus",
    "MinuteRollup",
    "QueueEvent",
    "QueueStats",
    "Release",
    "Retention",
    "RetryOutcome",
    "WorkerInfo",
    "ScheduleState",
    "TickFiring",
    "capability_default",
    "check_claim_id",
    "is_capability_default",
    "new_claim_id",
]


#: How long the polling defaults of the core (``wait_finished``, ``wait_for_jobs``,
#: ``wait_cancel_requests``) sleep at most between looks, in seconds.
_POLL = 0.5


class Broker(CapabilityDefaults, abc.ABC):
    """A job store and dispatcher. Methods are coroutine functions; batches in, batches out."""

    settings: BrokerSettings
    #: The partitioned queues of the apps using this broker object: queue -> partitions
    #: (:meth:`set_partitions`); they share ``max_queue_length`` (:meth:`queue_cap`).
    partitions: Mapping[str, int] = MappingProxyType({})
    #: Whether the reads and appends of concurrent durable-run turns of a process are
    #: worth coalescing into one ``get_runs`` / ``append_runs`` call each (a broker whose
    #: calls are round trips).
    coalesce_run_calls: bool = False
    #: Whether ``append_runs`` honours :attr:`~typedq.broker.runs.RunAppend.fence` (a
    #: step's worker then records the step's result with the run's next decision, no
    #: turn job between them); a broker without it is never sent a fenced append.
    fenced_run_appends: bool = False
    #: With ``fenced_run_appends``: whether the fence may be a job of another queue than
    #: the run's (Redis Cluster: no, the run's script reads it on the run's slot).
    fences_other_queues: bool = True

    def set_partitions(self, partitions: Mapping[str, int]) -> None:
        """Declare partitioned queues (queue -> number of partitions); an app does, at
        connect. Merged with earlier calls."""
        split = {q: p for q, p in partitions.items() if p > 1}
        self.partitions = MappingProxyType({**self.partitions, **split})

    def queue_cap(self, queues: Iterable[str]) -> int:
        """The ``max_queue_length`` one call that stores jobs in ``queues`` holds each of
        them to (0 = no cap). A queue split into P partitions shares the cap: each
        partition holds at most ceil(cap / P) pending jobs, so the queue as a whole never
        holds more than cap + P - 1 (each partition is checked atomically on its own; on
        Redis Cluster they are on different slots). One call storing jobs in queues of
        different caps holds them all to the smallest."""
        cap = self.settings.max_queue_length
        if cap <= 0 or not self.partitions:
            return cap
        out = cap
        for queue in queues:
            parent, sep, index = queue.rpartition(".p")
            if sep and index.isdigit() and (split := self.partitions.get(parent)):
                out = min(out, -(-cap // split))
        return out

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open connections / start background work. Called by ``async with app``."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release everything ``connect`` took. Safe to call twice."""

    # -- producer side -------------------------------------------------------------

    @abc.abstractmethod
    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        """Store jobs atomically per message, in order; an existing id is not replaced.

        Safe to re-send: ids are chosen by the client, so a retry creates nothing new.
        """

    async def enqueue_batches(
        self, batches: Sequence[Sequence[JobMessage]]
    ) -> list[list[EnqueueOutcome] | Exception]:
        """Store ``batches`` in order, each atomically; per batch its outcomes or the error
        that refused it (a refused batch stored nothing; later batches are still tried).

        Keeps FIFO across the batches of one ``enqueue_many``. This default sends them one
        after the other; a networked backend pipelines them in one round trip.
        """
        results: list[list[EnqueueOutcome] | Exception] = []
        for batch in batches:
            try:
                results.append(await self.enqueue(batch))
            except (QueueFull, BrokerError) as exc:
                results.append(exc)
        return results

    @abc.abstractmethod
    async def get(self, ids: Sequence[str], *, queue: str | None = None) -> list[JobRecord | None]:
        """Snapshots of the jobs, ``None`` for unknown (or expired) ids.

        :param queue: the queue of every job in ``ids``, when the caller knows it (a job
            handle does): a broker that finds jobs through their queue (Redis) looks
            only there. Without it such a broker looks in every queue it knows. A job id
            is unique per queue.
        """

    async def wait_finished(
        self,
        job_id: str,
        timeout: float | None,
        *,
        queue: str | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> JobRecord | None:
        """Wait, without polling, until the job is final; return it, or ``None`` on timeout.

        Returns ``None`` at once if the job does not exist. ``queue``: as for :meth:`get`.

        :param task_status: ``started()`` once the wait is armed: from then on, the job
            reaching a final state wakes it (on Redis: once subscribed). Tests start it
            with ``await tg.start(...)`` instead of sleeping until it listens.

        This default polls :meth:`get` (backing off to every half second); the brokers
        of typedq are woken by the job's finish instead.
        """
        task_status.started()
        deadline = None if timeout is None else anyio.current_time() + timeout
        pause = 0.01
        while True:
            (record,) = await self.get([job_id], queue=queue)
            if record is None or record.state.is_final:
                return record
            left = _POLL if deadline is None else deadline - anyio.current_time()
            if left <= 0:
                return None
            await anyio.sleep(min(pause, left))
            pause = min(2 * pause, _POLL)

    @abc.abstractmethod
    async def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        """Cancel a waiting/scheduled job, or ask the worker running it to cancel it.
        ``queue``: as for :meth:`get`."""

    @abc.abstractmethod
    async def counts(self, queue: str) -> dict[JobState, int]:
        """How many jobs of ``queue`` are in each state."""

    # -- worker side ---------------------------------------------------------------

    @abc.abstractmethod
    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        """Move up to ``limit`` due jobs to ``active`` under fresh leases.

        Highest priority first, then oldest. Promotes scheduled jobs that are due.
        A worker asks only for as many jobs as it has free slots.

        :param claim_id: the caller's id for this claim (:func:`new_claim_id`). A claim
            re-sent with the same id (its answer was lost) claims nothing new: it returns
            the jobs the first copy claimed that are still held under it. The record is
            kept for :data:`CLAIM_RECORD_TTL` seconds. ``None``: a fresh id, so the
            claim cannot be re-sent.
        """

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        """Return when a job may be claimable in ``queues``, or after ``timeout`` seconds.

        A hint, not a promise: the caller claims afterwards and may get nothing. This
        default sleeps up to half a second (the caller looks again: it polls).
        """
        await anyio.sleep(max(0.0, min(timeout, _POLL)))

    async def wait_for_handoff(
        self,
        queues: Sequence[str],
        free: int,
        timeout: float,
        *,
        worker_id: str,
        lease: float,
    ) -> list[ClaimedJob]:
        """:meth:`wait_for_jobs` for a worker with ``free`` idle slots, after a claim of
        ``queues`` that came up short: a backend that can hand new jobs straight to a
        waiting worker returns them (at most ``free``, claimed under ``lease`` for
        ``worker_id``, as :meth:`claim` would) instead of waking it to claim. Until
        :meth:`end_handoff`, or a wait that returns no job, the worker claims nothing
        for those slots itself (the backend may still be handing jobs to them).
        This default waits with :meth:`wait_for_jobs` and returns no job."""
        await self.wait_for_jobs(queues, timeout)
        return []

    async def end_handoff(self, worker_id: str) -> None:
        """The worker stops waiting (shutdown): no more jobs are handed to it, and those
        handed but not taken are handed back. This default has nothing to end."""

    @abc.abstractmethod
    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        """Extend the leases ``(job_id, token)`` by ``lease`` seconds from now."""

    @abc.abstractmethod
    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        """Finish jobs as completed, fenced by token."""

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
        """``complete(items)``, then ``claim(queues, limit, ...)``: the slots a worker frees
        are refilled in the same round trip where the backend can pipeline the two.
        Re-sending both with the same ``claim_id`` is safe (finishes are fenced, the
        claim returns its first copy's jobs).

        The completions take effect before the claim, so a worker never holds more
        claimed jobs than it has slots. This default makes two calls.
        """
        outcomes = await self.complete(items)
        claimed = (
            await self.claim(queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id)
            if limit
            else []
        )
        return outcomes, claimed

    @abc.abstractmethod
    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        """Record failed attempts, fenced by token: retry later, or fail/cancel for good."""

    @abc.abstractmethod
    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        """Hand claimed jobs back unrun; they are waiting again at once."""

    @abc.abstractmethod
    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        """Store progress for a running job; False if the lease is no longer ours."""

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        """Which of the given active job ids have a pending cancel request.

        This default answers none: ``renew`` answering ``CANCEL_REQUESTED`` is how the
        worker of a broker without it learns of a cancel (at its next renewal)."""
        return []

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Return soon after any ``cancel`` of a running job, or after ``timeout``.

        Lets a worker react to ``job.cancel()`` at once; ``renew`` answering
        ``CANCEL_REQUESTED`` is the backstop. It may also return early with nothing
        requested (e.g. when its subscription is made or remade): callers look again.

        :param task_status: ``started()`` once the wait is armed: from then on, a cancel
            request wakes it (on Redis: once subscribed to the cancel channel).

        This default only sleeps ``timeout`` (see :meth:`cancel_requests`).
        """
        task_status.started()
        await anyio.sleep(timeout)

    @abc.abstractmethod
    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        """Recover up to ``limit`` jobs whose lease expired; return how many.

        Safe to run from any number of workers at once: each job is recovered once.

        :param holding: ids of the jobs the caller itself runs and renews (a worker's
            reaper passes its own): left alone even when their lease has expired. The
            caller is late renewing them (its loop was blocked, or its process was not
            scheduled for a moment), and recovering them would run them a second time on
            the same worker; another worker's pass still recovers them if the caller
            really stopped renewing. Read when the call is sent (after any other
            round trip it makes first), so a live view (``dict.keys()``) stays current.
        """

    # -- listing (``typedq inspect``) ---------------------------------------------------

    @abc.abstractmethod
    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        """Ids of up to ``limit`` jobs of ``queue`` in ``state``, skipping the first ``offset``.

        The order is the state's own: ``waiting`` in claim order (priority, then age),
        ``scheduled`` by due time, ``active`` by start time, and the final states most
        recently finished first. ``limit`` is at most 1000. ``offset`` counts jobs: on a
        state that does not change, ``offset=0, limit=n``, then ``offset=n``, ... list
        every job exactly once, every page full but the last. Skipping costs the backend
        work in proportion to ``offset``: to walk a whole state, use :meth:`page_jobs`,
        whose cursors also hold while jobs move (an offset shifts when jobs before it
        leave or arrive).
        """

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        """One page of up to ``limit`` ids of ``queue``'s jobs in ``state`` (the order of
        :meth:`list_jobs`), from ``cursor`` (None: the first page); the answer's cursor
        continues after the page, and is None when the state has no more jobs.

        On a state that does not change, following the cursors lists every job exactly
        once, every page full but the last. While jobs move, a cursor names a place in
        the state's order, not a count: a job that is in the state for the whole walk is
        listed exactly once (on Redis's waiting lists, unless the job at the cursor's
        place was cancelled or removed meanwhile, or more than 1,000 entries ahead of it
        were claimed); a job that enters the state is listed if its place is after the
        cursor, and one that leaves and comes back may be listed again (a page is not a
        snapshot). docs/observability.md ("Paging a state") has the details. Each page
        costs the backend work in proportion to ``limit`` (plus entries it passes over),
        not to how deep it is. A cursor is opaque, valid for the same queue and state
        of the same broker; another string raises ValueError.

        This default pages by offset (a broker that overrides it names a place): enough
        for a static state, but jobs leaving before the cursor shift the later pages.
        """
        offset = cursor_position(cursor)
        limit = max(0, min(limit, 1000))
        ids = await self.list_jobs(queue, state, offset=offset, limit=limit)
        more = len(ids) == limit > 0 and bool(
            await self.list_jobs(queue, state, offset=offset + limit, limit=1)
        )
        return JobList(ids, str(offset + limit) if more else None)

    # -- queue stats (metrics; the rest of observability is a capability) ---------------

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        """Counts per state and the oldest waiting job's age, per queue, in one call (what
        a metrics scrape asks). This default calls ``counts`` per queue and reports no
        age; the brokers of typedq answer in one round trip."""
        return [QueueStats(queue=q, counts=await self.counts(q)) for q in queues]


def bad_cursor(cursor: str) -> ValueError:
    """The error for a :meth:`Broker.page_jobs` cursor the broker did not answer (or
    answered for another state)."""
    return ValueError(
        f"invalid page cursor {cursor!r}: pass None for the first page, then the cursor "
        "the previous page answered (for the same queue and state)"
    )


def cursor_position(cursor: str | None) -> int:
    """The position a :meth:`Broker.page_jobs` cursor stands for."""
    if cursor is None:
        return 0
    if not cursor.isdigit() or len(cursor) > 18:
        raise bad_cursor(cursor)
    return int(cursor)
