"""What a broker can do beyond the core store: one ``typing.Protocol`` per capability.

The core store is :class:`~typedq.broker.base.Broker`'s abstract methods (the module
docstring of :mod:`typedq.broker.base` lists them). A backend adds a capability by
overriding its methods; :class:`~typedq.broker.base.Broker` keeps a default for each
that raises :class:`~typedq.errors.Unsupported`, so a caller holding a ``Broker`` may
call any of them and learn at the call that the backend lacks it.

:func:`supports` tells whether a broker (or its class) has a capability: every method
of the protocol is present and is not the Broker's default. A client checks what its
app's declarations need once, as it connects (:func:`require`): an app with schedules
on a broker without them fails there, in one line, instead of at its first tick.

The protocols restate the methods' signatures (mypy and the seam's tests check them
against Broker's); the docstrings of the Broker's defaults
(:mod:`typedq.broker.capability_defaults`) are the reference for what each does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..errors import Unsupported
from .base import Broker
from .capability_defaults import is_capability_default

if TYPE_CHECKING:
    from ..limits import LimitSpec
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

__all__ = [
    "CAPABILITIES",
    "CORE",
    "CORE_WITH_DEFAULTS",
    "EventStreams",
    "FingerprintCounts",
    "FlowControl",
    "Flows",
    "JobStreams",
    "Limits",
    "Observability",
    "OperatorActions",
    "Runs",
    "SchemaRegistry",
    "TransactionalEnqueue",
    "Schedules",
    "capabilities_of",
    "members",
    "require",
    "supports",
]

#: The core store a backend must implement (Broker's abstract methods).
CORE = (
    "connect",
    "close",
    "enqueue",
    "cancel",
    "get",
    "counts",
    "list_jobs",
    "claim",
    "renew",
    "complete",
    "fail",
    "release",
    "set_progress",
    "recover_stalled",
)

#: Core methods with a working default (derived from the core, or polling) that a
#: backend overrides to be faster, plus Broker's plain helpers.
CORE_WITH_DEFAULTS = (
    "enqueue_batches",
    "complete_and_claim",
    "page_jobs",
    "queue_stats",
    "wait_finished",
    "wait_for_jobs",
    "wait_for_handoff",
    "end_handoff",
    "cancel_requests",
    "wait_cancel_requests",
    "set_partitions",
    "queue_cap",
    # A job stream's reader leaves (a no-op where readers are not counted).
    "leave_stream",
)


@runtime_checkable
class Flows(Protocol):
    """Workflows (:mod:`typedq.workflow`): a flow stored in one call, its jobs handed
    off inside the broker."""

    async def enqueue_flows(
        self, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome | Exception]: ...

    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None: ...


@runtime_checkable
class Schedules(Protocol):
    """Schedules (:mod:`typedq.schedule`): the broker's clock and the schedule states,
    fired by compare-and-set."""

    async def broker_time_us(self) -> int: ...

    async def sleep_until_us(self, when_us: int) -> None: ...

    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]: ...

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]: ...

    async def schedule_states(self) -> list[ScheduleState]: ...


@runtime_checkable
class Limits(Protocol):
    """Task limits (:mod:`typedq.limits`): the broker's ``claim`` enforces the rate and
    concurrency limits declared here (kept in its ``limits`` mapping)."""

    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None: ...


@runtime_checkable
class FlowControl(Protocol):
    """Unique windows and debounce (:mod:`typedq.flowcontrol`): keyed enqueues whose
    marker the broker keeps, atomically with the job."""

    async def enqueue_controlled(
        self, items: Sequence[tuple[JobMessage, EnqueueControl]]
    ) -> list[EnqueueOutcome]: ...


@runtime_checkable
class FlowViews(Protocol):
    """Read-only pages of a queue's flow control for ``typedq inspect`` and the dashboard:
    fair keys with jobs waiting, debounce keys, unique keys held
    (:mod:`typedq.broker.flowviews`)."""

    async def flow_keys(
        self, queue: str, kind: FlowKind, *, cursor: str | None = None, limit: int = 100
    ) -> FlowKeyPage: ...


@runtime_checkable
class Observability(Protocol):
    """What metrics, the dashboard and ``typedq inspect`` read besides the core: the
    per-minute throughput rollups and the worker and queue registries."""

    async def history(
        self, queues: Sequence[str], minutes: int = 60
    ) -> list[list[MinuteRollup]]: ...

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None: ...

    async def unregister_worker(self, worker_id: str) -> None: ...

    async def list_workers(self) -> list[WorkerInfo]: ...

    async def list_queues(self) -> list[str]: ...


@runtime_checkable
class EventStreams(Protocol):
    """Per-queue streams of final-state events (:mod:`typedq.events`)."""

    async def enable_events(self, queue: str) -> int: ...

    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead: ...


@runtime_checkable
class JobStreams(Protocol):
    """Per-job streams of typed items a task emits (:mod:`typedq.streams`,
    ``@app.task(emits=...)``); values in :mod:`typedq.broker.streams`."""

    async def append_streams(self, appends: Sequence[StreamAppend]) -> list[bool]: ...

    async def read_stream(
        self,
        job_id: str,
        *,
        queue: str,
        after: str,
        timeout: float,
        limit: int = 1000,
        reader: str = "",
    ) -> list[StreamEntry]: ...


@runtime_checkable
class OperatorActions(Protocol):
    """What an operator does to jobs (``typedq inspect``, the dashboard): retry the
    failed, remove jobs, purge a queue's states."""

    async def retry(
        self, ids: Sequence[str], *, queue: str | None = None
    ) -> list[RetryOutcome]: ...

    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]: ...

    async def purge(self, queue: str, states: Sequence[JobState]) -> int: ...


@runtime_checkable
class Runs(Protocol):
    """Durable runs (:mod:`typedq.durable`): a run's record and log, compare-and-append,
    signal inboxes, and turns enqueued by the broker when the run has something to do
    (values in :mod:`typedq.broker.runs`)."""

    async def create_runs(self, specs: Sequence[RunSpec]) -> list[tuple[bool, RunRecord]]: ...

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]: ...

    async def append_runs(self, appends: Sequence[RunAppend]) -> list[AppendOutcome]: ...

    async def signal_runs(self, signals: Sequence[RunSignal]) -> list[SignalOutcome]: ...

    async def wake_runs(self, wakes: Sequence[tuple[str, float]]) -> list[bool]: ...

    async def cancel_runs(self, run_ids: Sequence[str]) -> list[bool]: ...

    async def wait_run(
        self, run_id: str, seen: int, timeout: float | None, *, reader: RunReader | None = None
    ) -> RunRecord | None: ...

    async def page_runs(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[str], str | None]: ...


@runtime_checkable
class SchemaRegistry(Protocol):
    """The schema registry (:mod:`typedq.broker.schemas`): each task's input and output
    JSON Schemas per input fingerprint, as producers and workers knew them, for
    ``typedq verify``."""

    async def record_schemas(self, records: Sequence[SchemaRecord]) -> list[bool]: ...

    async def schema_records(self) -> list[SchemaRecord]: ...

    async def forget_schemas(self, keys: Sequence[tuple[str, str]]) -> list[bool]: ...


@runtime_checkable
class FingerprintCounts(Protocol):
    """Jobs counted by ``(task, fingerprint)`` where they are stored, a bounded page of
    one queue's state per call, for ``typedq verify``'s exact counts
    (:class:`~typedq.broker.schemas.FingerprintPage`). Without it, verify reads a
    bounded sample of the jobs through ``page_jobs`` and ``get``."""

    async def count_fingerprints(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 1000
    ) -> FingerprintPage: ...


@runtime_checkable
class TransactionalEnqueue(Protocol):
    """Enqueue inside the caller's own database transaction (``task.enqueue(...,
    within=conn)``): the jobs exist if and only if that transaction commits. Only a
    broker that lives in the caller's database can (the PostgreSQL broker)."""

    async def enqueue_within(
        self, conn: object, messages: Sequence[JobMessage]
    ) -> list[EnqueueOutcome]: ...

    async def enqueue_flows_within(
        self, conn: object, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome]: ...


#: Every capability, in the order of the seam's description (typedq.broker.base).
CAPABILITIES: tuple[type[Any], ...] = (
    Flows,
    Schedules,
    Limits,
    Observability,
    EventStreams,
    OperatorActions,
    Runs,
    FlowControl,
    FlowViews,
    SchemaRegistry,
    FingerprintCounts,
    JobStreams,
    TransactionalEnqueue,
)


def members(capability: type[Any]) -> tuple[str, ...]:
    """The method names of a capability protocol, in definition order."""
    return tuple(
        name
        for name, value in vars(capability).items()
        if not name.startswith("_") and callable(value)
    )


def supports(broker: Broker | type[Broker], capability: type[Any]) -> bool:
    """Whether ``broker`` (an instance or a class) has ``capability``: it has each of
    the protocol's methods, and none is Broker's default (which raises Unsupported)."""
    cls = broker if isinstance(broker, type) else type(broker)
    for name in members(capability):
        method = getattr(cls, name, None)
        if method is None or is_capability_default(method):
            return False
    return True


def capabilities_of(broker: Broker | type[Broker]) -> tuple[type[Any], ...]:
    """The capabilities ``broker`` (an instance or a class) has, in :data:`CAPABILITIES`
    order."""
    return tuple(cap for cap in CAPABILITIES if supports(broker, cap))


def require(broker: Broker, needs: Mapping[type[Any], str], *, user: str) -> None:
    """Raise Unsupported, in one line, unless ``broker`` has every capability ``needs``
    names (capability -> what of ``user`` needs it). Checked when a client connects.

    :param user: who needs them, for the message (``"app 'shop'"``)
    """
    missing = [f"{cap.__name__} ({why})" for cap, why in needs.items() if not supports(broker, cap)]
    if missing:
        raise Unsupported(
            f"broker {type(broker).__name__} lacks what {user} uses: {'; '.join(missing)}. "
            "Use a broker that has it (memory:// or redis://), or drop the declaration"
        )
