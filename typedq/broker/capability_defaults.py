"""The capabilities' defaults: what a :class:`~typedq.broker.base.Broker` does for a
capability its backend has not implemented (raise :class:`~typedq.errors.Unsupported`).

:class:`CapabilityDefaults` is a base of :class:`~typedq.broker.base.Broker`: it has
one method per method of each capability protocol (:mod:`typedq.broker.capabilities`),
marked :func:`capability_default`. A backend adds a capability by overriding its
methods; :func:`typedq.broker.capabilities.supports` tells a capability's default (still
marked) from a backend's own. ``flow_state``'s default answers None (no job is a
flow's) instead of raising, so a caller asking about any job needs no check first.

These methods' docstrings are the reference for what each capability does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeVar

from ..errors import Unsupported
from ..limits import LimitSpec

if TYPE_CHECKING:
    from .flow import FlowSpec, FlowState
    from .flowviews import FlowKeyPage, FlowKind
    from .messages import (
        EnqueueControl,
        EnqueueOutcome,
        EventRead,
        FireOutcome,
        JobMessage,
        JobState,
        MinuteRollup,
        RetryOutcome,
        ScheduleState,
        TickFiring,
        WorkerInfo,
    )
    from .runs import (
        AppendOutcome,
        RunAppend,
        RunReader,
        RunRecord,
        RunSignal,
        RunSpec,
        SignalOutcome,
    )
    from .schemas import FingerprintPage, SchemaRecord
    from .streams import StreamAppend, StreamEntry

__all__ = ["CapabilityDefaults", "capability_default", "is_capability_default"]


_F = TypeVar("_F", bound=Callable[..., Any])

#: The attribute that marks a :class:`~typedq.broker.base.Broker` method's default as
#: "lacks the capability".
_LACKING = "__typedq_capability_default__"


def capability_default(method: _F) -> _F:
    """Mark a :class:`~typedq.broker.base.Broker` method as the default of a capability's
    method: a broker whose class still has it lacks that capability (see
    :mod:`typedq.broker.capabilities`)."""
    setattr(method, _LACKING, True)
    return method


def is_capability_default(method: object) -> bool:
    """Whether ``method`` is a capability's default (the broker does not implement it)."""
    return bool(getattr(method, _LACKING, False))


class CapabilityDefaults:
    """The capabilities' methods as a broker without them has them: each raises
    :class:`~typedq.errors.Unsupported` (``flow_state`` answers None)."""

    #: The limits of the tasks this process's workers run, by task name
    #: (:meth:`set_limits`); the claim enforces them. Empty: a claim costs nothing more.
    limits: Mapping[str, LimitSpec] = MappingProxyType({})

    def _unsupported(self, what: str) -> Unsupported:
        """The error of a capability's default: this broker cannot do ``what``."""
        return Unsupported(f"{type(self).__name__} does not support {what}")

    # -- workflows (typedq.workflow; capability Flows) -------------------------------------

    @capability_default
    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        """Store workflows (:mod:`typedq.broker.flow`), each atomically with all its jobs.

        Per flow: its outcome (``created`` is False when a job with the flow's id already
        existed: nothing was stored) or the error that refused it (QueueFull when its jobs
        would pass ``max_queue_length``: nothing of it was stored).
        """
        raise self._unsupported("workflows")

    @capability_default
    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None:
        """The shape and progress of the flow that the job ``flow_id`` belongs to (the
        flow's own job, a step or a member); None if it is no flow's (or it is gone).

        :param queue: the job's queue, when the caller knows it (see
            :meth:`~typedq.broker.base.Broker.get`)

        This default, of a broker without workflows, answers None: no job is a flow's."""
        return None

    # -- schedules (typedq.schedule; capability Schedules) ---------------------------------

    @capability_default
    async def broker_time_us(self) -> int:
        """The broker's clock, integer microseconds since the epoch (Redis ``TIME``)."""
        raise self._unsupported("schedules")

    @capability_default
    async def sleep_until_us(self, when_us: int) -> None:
        """Sleep until the broker's clock reaches ``when_us``, or a little less (the
        caller checks the time again). Cancel the caller's scope to wake early."""
        raise self._unsupported("schedules")

    @capability_default
    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]:
        """Reconcile schedule states with definitions ``(name, digest)``, atomically.

        A schedule with no state, or a state of another digest, gets a fresh one starting
        at the broker's now (nothing fires from stale state); an equal digest keeps its
        state. ``prune`` deletes the states of every schedule not listed. Returns the
        states of the listed schedules, in order.
        """
        raise self._unsupported("schedules")

    @capability_default
    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        """Apply each firing atomically (see :class:`~typedq.broker.messages.TickFiring`);
        per firing its outcome and the schedule's state afterwards (``None``: the schedule
        has no state)."""
        raise self._unsupported("schedules")

    @capability_default
    async def schedule_states(self) -> list[ScheduleState]:
        """Every schedule state the broker holds, by name."""
        raise self._unsupported("schedules")

    # -- unique windows and debounce (typedq.flowcontrol; capability FlowControl) ---------

    @capability_default
    async def enqueue_controlled(
        self, items: Sequence[tuple[JobMessage, EnqueueControl]]
    ) -> list[EnqueueOutcome]:
        """Enqueue keyed jobs under a unique window or a debounce, each atomically, in
        order (docs/flow-control.md; the rules are the embedded broker's,
        :mod:`typedq.broker.memory.control`).

        Unique (``control.unique_for`` > 0): while the key's marker names a job that is
        waiting, scheduled or active, or one that completed less than ``unique_for``
        ago, the answer is that job (``created`` False) and nothing is stored; else the
        job is stored and the marker names it. A job that failed for good or was
        cancelled frees its key at once.

        Debounce (``control.wait`` > 0): while the key's marker names a job still
        scheduled and not due yet, that job takes the new envelope's payload and
        options (id and queue kept) and its run time becomes ``min(now + wait,
        enqueued_at + max_wait)`` (``created`` False); else the job is stored,
        scheduled ``wait`` from now, and the marker names it.

        :raises QueueFull: a new job would pass ``max_queue_length`` (nothing stored)
        """
        raise self._unsupported("unique windows and debounce (unique_for=, debounce=)")

    # -- views of flow control (typed inspect, the dashboard; capability FlowViews) -------

    @capability_default
    async def flow_keys(
        self, queue: str, kind: FlowKind, *, cursor: str | None = None, limit: int = 100
    ) -> FlowKeyPage:
        """One page of up to ``limit`` (at most 1,000) of ``queue``'s flow-control keys
        of ``kind`` (:class:`~typedq.broker.flowviews.FlowKey` says what each holds):
        ``"fair"``, fair keys with jobs waiting; ``"debounce"``, debounce keys and their
        collecting jobs; ``"unique"``, unique keys held (by a job not finished, or for
        a window not ended). From ``cursor`` (None: the first page); the answer's
        cursor continues, None at the end. A page costs in proportion to ``limit`` (on
        Redis, a SCAN/HSCAN step of the queue's slot with COUNT ``limit``: a page may
        be short, even empty, before the end; follow the cursor), never to the whole
        keyspace. Read-only. A cursor is opaque, for the same queue and kind; another
        string raises ValueError.
        """
        raise self._unsupported("views of flow control (typedq inspect --flow)")

    # -- task limits (typedq.limits; capability Limits) ------------------------------------

    @capability_default
    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """Declare the rate and concurrency limits of tasks (a worker does, at start-up).

        Every later ``claim`` of this broker object enforces them atomically with the
        claim (see :mod:`typedq.limits`); a task not named here is not limited by this
        process's claims. Merged with earlier calls (workers of one app share a broker).
        A broker whose claim enforces limits overrides this with :meth:`_merge_limits`.
        """
        raise self._unsupported("task limits (rate_limit=, concurrency=)")

    def _merge_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """What :meth:`set_limits` does on a broker that enforces limits."""
        self.limits = MappingProxyType({**self.limits, **limits})

    # -- observability (metrics, the dashboard, ``typedq inspect``; capability Observability) ---

    @capability_default
    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        """Per queue, the last ``minutes`` minutes' rollups, oldest first, one per minute
        (zeros where nothing happened), the current minute last.

        The rollups are kept in the broker (so they survive restarts of workers and
        dashboards), bounded to :data:`~typedq.broker.messages.HISTORY_MINUTES`; every
        completion, final failure and retry counts in the minute it happened.

        :raises ValueError: ``minutes`` is not between 1 and
            :data:`~typedq.broker.messages.HISTORY_MINUTES`
        :raises Unsupported: the broker keeps no rollups
        """
        raise self._unsupported("throughput history (it keeps no rollups)")

    @capability_default
    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        """Add or refresh ``info`` in the worker registry for ``ttl`` seconds (a worker's
        heartbeat); its queues join the queue registry for good.

        :raises Unsupported: the broker keeps no registry
        """
        raise self._unsupported("a worker registry")

    @capability_default
    async def unregister_worker(self, worker_id: str) -> None:
        """Remove a worker from the registry (a clean shutdown); unknown ids are ignored."""
        raise self._unsupported("a worker registry")

    @capability_default
    async def list_workers(self) -> list[WorkerInfo]:
        """The workers whose last heartbeat has not expired, by id."""
        raise self._unsupported("a worker registry")

    @capability_default
    async def list_queues(self) -> list[str]:
        """Every queue a worker ever registered or this app's producers ever enqueued to
        (each producer process adds a queue at its first enqueue to it), sorted."""
        raise self._unsupported("a queue registry")

    # -- events (typedq.events; capability EventStreams) -----------------------------------

    @capability_default
    async def enable_events(self, queue: str) -> int:
        """Start (or keep) writing ``queue``'s event stream, capped near
        ``settings.events_max``: every job of the queue that reaches a final state from
        now on adds a :class:`~typedq.broker.messages.QueueEvent`. Idempotent.

        :return: the number of the last event written so far (0: none yet)
        """
        raise self._unsupported("event streams")

    @capability_default
    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead:
        """The events of ``queue`` numbered after ``after`` (at most ``limit``), waiting
        up to ``timeout`` seconds for one when there is none yet (never polling).

        ``missed`` counts the events after ``after`` that the cap already dropped.
        """
        raise self._unsupported("event streams")

    # -- job streams (typedq.streams; capability JobStreams) ------------------------------

    @capability_default
    async def append_streams(self, appends: Sequence[StreamAppend]) -> list[bool]:
        """Add each :class:`~typedq.broker.streams.StreamAppend`'s items (then its end
        entry, when it has one) to its job's stream, atomically per append; True for each
        one taken, False for one its token no longer holds (the lease was lost, or the
        job did not end by this token).

        A ``fresh`` append first empties the stream (a previous run's entries); positions
        keep growing across that, so a reader after a position misses nothing new. The
        stream keeps about the last :data:`~typedq.broker.streams.STREAM_MAX` entries and
        expires ``ttl`` seconds after the append.
        """
        raise self._unsupported("job streams")

    @capability_default
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
        """The entries of ``job_id``'s stream after position ``after`` (``""``: from the
        start), oldest first, at most ``limit``; when there are none yet, wait up to
        ``timeout`` seconds for one (never polling). An empty list: none came.

        ``reader`` (non-empty: an id unique to one reader, ``job.stream()``'s) counts the
        caller among the stream's readers (``flow_keys(kind="stream")``'s ``readers``)
        until :meth:`leave_stream`, or :data:`~typedq.broker.streams.READER_TTL` seconds
        after this read's wait, whichever comes first.
        """
        raise self._unsupported("job streams")

    async def leave_stream(self, job_id: str, *, queue: str, reader: str) -> None:
        """Stop counting ``reader`` among the readers of ``job_id``'s stream (its
        ``job.stream()`` ended or was closed). A broker that counts no readers has
        nothing to forget: the default does nothing."""
        return None

    # -- operator actions (``typedq inspect``, the dashboard; capability OperatorActions) ---

    @capability_default
    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        """Put failed or cancelled jobs back to ``waiting`` at once, each atomically.
        ``queue``: as for :meth:`~typedq.broker.base.Broker.get`.

        A retried job keeps its id, envelope and priority; its attempt and stall counts
        start again from zero (the task's retry budget applies afresh), and its finish
        time, result and error record are cleared. Jobs in any other state are left
        unchanged (``NOT_RETRYABLE``).
        """
        raise self._unsupported("operator actions (retry)")

    @capability_default
    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]:
        """Delete jobs (their data and every index entry); True for each one deleted.
        ``queue``: as for :meth:`~typedq.broker.base.Broker.get`.

        :param states: delete a job only while it is in one of these states (checked
            atomically with the delete), so a job that moved on since it was listed is
            kept; ``None`` deletes in any state. Deleting an active job makes its
            worker's finish answer ``NOT_FOUND``; a waiter on it is woken. A job of a
            workflow deleted before it finished (the flow's own job too) fails the rest
            of its flow with ``flow_broken``; ids are acted on in order.
        """
        raise self._unsupported("operator actions (remove)")

    @capability_default
    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        """Delete the jobs of ``queue`` in ``states``; return how many.

        Jobs of a workflow among them end their flow as :meth:`remove` does (a job that
        had not finished fails the rest with ``flow_broken``), and the count is exactly
        the jobs deleted, whatever order the backend deletes them in: a job of such a flow
        that is itself in ``states`` on ``queue`` is deleted (and counted), never left
        failed, and a fan-in callback that deleting its last members releases into a
        purged state is deleted too. Nothing of the queue is left in ``states`` (but what
        arrives meanwhile).
        """
        raise self._unsupported("operator actions (purge)")

    # -- durable runs (typedq.durable; capability Runs) ----------------------------------

    @capability_default
    async def create_runs(self, specs: Sequence[RunSpec]) -> list[tuple[bool, RunRecord]]:
        """Create each run and enqueue its first turn; per spec, ``(created, record)``.

        Idempotent by run id: a spec whose id exists already changes nothing and answers
        ``(False, the existing record)``, whatever its fields.
        """
        raise self._unsupported("durable runs")

    @capability_default
    async def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        """Each run's record (state, log, inbox, result or failure), None if unknown."""
        raise self._unsupported("durable runs")

    @capability_default
    async def append_runs(self, appends: Sequence[RunAppend]) -> list[AppendOutcome]:
        """Apply each compare-and-append (:class:`~typedq.broker.runs.RunAppend`): only
        while the run runs and its log still has ``expected`` entries; then set what it
        waits for (waking it at once if that is already true) or finish it."""
        raise self._unsupported("durable runs")

    @capability_default
    async def signal_runs(self, signals: Sequence[RunSignal]) -> list[SignalOutcome]:
        """Add each payload to its run's inbox for the signal (oldest first); wake a run
        that waits for it. A finished run refuses (``FINISHED``), keeping nothing."""
        raise self._unsupported("durable runs")

    @capability_default
    async def wake_runs(self, wakes: Sequence[tuple[str, float]]) -> list[bool]:
        """Enqueue a turn of each ``(run_id, at)``: now (``at`` <= the broker's time, or
        0) or at ``at`` (epoch seconds, broker clock). False: unknown or finished run."""
        raise self._unsupported("durable runs")

    @capability_default
    async def cancel_runs(self, run_ids: Sequence[str]) -> list[bool]:
        """Cancel each running run (state ``cancelled``) and the jobs it waits on.
        False: unknown or already finished."""
        raise self._unsupported("durable runs")

    @capability_default
    async def wait_run(
        self, run_id: str, seen: int, timeout: float | None, *, reader: RunReader | None = None
    ) -> RunRecord | None:
        """Wait, without polling, until the run's log has more than ``seen`` entries or
        the run has ended, at most ``timeout`` seconds (None: no bound); then its record
        as it is (on timeout too). None: no such run (or it went, by retention).
        ``seen`` ``sys.maxsize`` waits for the end only (a backend may then skip the
        wake-ups of a growing log). ``reader``: how a backend that reads the run reads
        it (``get_runs`` of one id by default; a client's coalescing reader)."""
        raise self._unsupported("durable runs")

    @capability_default
    async def page_runs(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[str], str | None]:
        """A page of the app's run ids (running and ended ones retention keeps): about
        ``limit`` of them (a hint: a backend may answer a few more or fewer, none while
        more follow) and the cursor of the next page, None after the last. Bounded work
        per call (``typedq verify`` reads the runs' stored payloads page by page); a run
        created or ended while the pages are read may be met or not, never twice in one
        walk on a quiet broker."""
        raise self._unsupported("durable runs")

    # -- the schema registry (``typedq verify``; capability SchemaRegistry) -----------------

    @capability_default
    async def record_schemas(self, records: Sequence[SchemaRecord]) -> list[bool]:
        """Keep each record unless one of its ``(task, fingerprint)`` is kept already
        (the first one stays, with the broker's time of it as ``first_seen``); per
        record, True when it was new. One round trip on a networked broker."""
        raise self._unsupported("a schema registry")

    @capability_default
    async def schema_records(self) -> list[SchemaRecord]:
        """Every record kept, by task and then by ``first_seen``."""
        raise self._unsupported("a schema registry")

    @capability_default
    async def forget_schemas(self, keys: Sequence[tuple[str, str]]) -> list[bool]:
        """Delete the records of these ``(task, fingerprint)`` pairs (``typedq verify
        --forget``: no producer of that schema runs any more); True per record deleted.
        A process that still runs with one does not record it again until it restarts."""
        raise self._unsupported("a schema registry")

    # -- counting jobs by fingerprint (``typedq verify``; capability FingerprintCounts) ----

    @capability_default
    async def count_fingerprints(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 1000
    ) -> FingerprintPage:
        """Count the jobs of ``queue`` in ``state`` by the ``(task, fingerprint)`` of their
        envelopes, a page at a time: at most ``limit`` jobs from ``cursor`` (None: the
        state's start; a backend may count fewer, and bounds ``limit`` to what one call
        does quickly), and the cursor to go on from (None after the state's last job).
        The counting happens where the jobs are stored and only the counts come back, so
        counting every job costs no job's transfer; each call is bounded work (on Redis,
        one script call of a few milliseconds), so a broker holding millions of jobs is
        counted without blocking it for long.

        Pages in a state's order, as ``page_jobs`` walks it (active jobs may be walked
        in another order): on a broker at rest the pages count every job of the state
        once; a job that moves while the pages are read may be counted in two states or
        in none. Every job is counted, a durable run's turns too (the caller tells them
        by their task). :class:`ValueError` for a cursor this call did not make."""
        raise self._unsupported("counting jobs by fingerprint")

    # -- transactional enqueue (``within=``; capability TransactionalEnqueue) --------------

    @capability_default
    async def enqueue_within(
        self, conn: object, messages: Sequence[JobMessage]
    ) -> list[EnqueueOutcome]:
        """Store ``messages`` through ``conn``, the caller's own database connection, in
        the transaction it has open: they exist if and only if it commits (and workers
        hear of them at the commit). Per message its outcome, as ``enqueue`` answers.
        A connection the broker cannot use (another database, an unknown driver) is an
        :class:`~typedq.errors.InvalidOption`."""
        raise self._unsupported("enqueue within a transaction")

    @capability_default
    async def enqueue_flows_within(
        self, conn: object, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome]:
        """Store workflows (:mod:`typedq.broker.flow`) through ``conn``, in the
        transaction it has open, as :meth:`enqueue_within` stores jobs: per flow its
        outcome (``created`` False: a job with the flow's id existed). A flow refused
        (QueueFull, a derived id taken: ConfigError) raises, and the caller's
        transaction is aborted with it."""
        raise self._unsupported("enqueue within a transaction")
