"""Tasks: typed handlers bound to a queue (the typed producer API they share with stub
tasks is :class:`~typedq.taskbase.TaskBase`, importable from here).

``@app.task`` turns ``async def send_invoice(inv: SendInvoice) -> Receipt`` into a
``Task[SendInvoice, Receipt]``: ``enqueue`` accepts only a ``SendInvoice`` and returns a
``Job[Receipt]``, and calling the task still runs the function.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeAlias,
    TypeVar,
    overload,
)

from typing_extensions import Unpack

from .context import JobContext
from .errors import ConfigError
from .fair import Fair
from .flowcontrol import Debounce

# The ``X as X`` imports from handlers, queues, taskoptions and taskbase re-export what was
# split out of this module (issue 25): every name is still importable from typedq.task.
from .handlers import count_params
from .handlers import handler_types as handler_types
from .job import StreamJob, TEmit_co
from .limits import ConcurrencyLimit, RateLimit
from .queues import check_limits_partitions as check_limits_partitions
from .queues import check_partitions as check_partitions
from .queues import check_queues as check_queues
from .queues import expand_queues as expand_queues
from .streams import LocalEmitter
from .taskbase import Enqueuer as Enqueuer
from .taskbase import TaskBase as TaskBase
from .taskbase import TEmit as TEmit
from .taskbase import TIn as TIn
from .taskbase import TIn_contra as TIn_contra
from .taskbase import TMid as TMid
from .taskbase import TNext as TNext
from .taskbase import TOut as TOut
from .taskbase import _Owner as _Owner
from .taskoptions import DEFAULT_QUEUE as DEFAULT_QUEUE
from .taskoptions import UNSET as UNSET
from .taskoptions import BatchOptions as BatchOptions
from .taskoptions import EnqueueOptions as EnqueueOptions
from .taskoptions import TaskDefaults as TaskDefaults
from .taskoptions import TaskOptions as TaskOptions
from .taskoptions import Unset as Unset

#: The old payload an upcaster takes (typedq.upcast).
TOld = TypeVar("TOld")

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .broker.base import Broker, ClaimedJob
    from .client import Client
    from .resources import Resource
    from .schedule import Schedule
    from .upcast import Upcaster

__all__ = [
    "UNSET",
    "BatchOptions",
    "EnqueueOptions",
    "EmitTaskDecorator",
    "Enqueuer",
    "Registry",
    "StreamTask",
    "Task",
    "TaskBase",
    "TaskDecorator",
    "TaskDefaults",
    "TaskOptions",
    "Unset",
]


class Registry(Protocol):
    """What a registered :class:`Task` belongs to, as a worker sees it: an
    :class:`~typedq.App` (this keeps the worker independent of the App class)."""

    @property
    def name(self) -> str: ...
    @property
    def client(self) -> Client: ...
    @property
    def broker(self) -> Broker: ...
    @property
    def lease(self) -> float: ...
    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]: ...
    @property
    def queues(self) -> list[str]: ...
    @property
    def resources(self) -> tuple[Resource[Any], ...]: ...
    @property
    def schedules(self) -> Mapping[str, Schedule[Any]]: ...
    @property
    def step_hook(self) -> Callable[[ClaimedJob, bytes], Awaitable[None]] | None:
        """Told of each durable run's step that returned (job, result), before its
        completion is recorded; None: the app has no durable runs."""
        ...


class Task(TaskBase[TIn, TOut]):
    """A registered handler with typed input ``TIn`` and output ``TOut``.

    Calling the task runs the handler directly (for unit tests) and returns an
    awaitable of its result, whether the handler is ``async def`` or plain ``def``.
    Enqueueing is inherited from :class:`TaskBase`.

    :param app: the app it is registered in (workers of that app run it)
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        app: Registry,
        options: TaskOptions,
        input_type: type[TIn],
        output_type: type[TOut],
        key: Callable[[TIn], str] | None = None,
        max_payload_bytes: int | None = None,
        rate_limit: RateLimit[TIn] | None = None,
        concurrency: ConcurrencyLimit[TIn] | None = None,
        unique_for: timedelta | float | None = None,
        debounce: Debounce[TIn] | None = None,
        emits: type[Any] | None = None,
        fair: Fair[TIn] | None = None,
    ) -> None:
        super().__init__(
            owner=app,
            options=options,
            input_type=input_type,
            output_type=output_type,
            key=key,
            max_payload_bytes=max_payload_bytes,
            rate_limit=rate_limit,
            concurrency=concurrency,
            unique_for=unique_for,
            debounce=debounce,
            emits=emits,
            fair=fair,
        )
        self.app = app
        self.fn = fn
        self.is_async = inspect.iscoroutinefunction(fn)
        self.takes_context = count_params(fn) >= 2
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        #: Upcasters by the old input fingerprint they take (:meth:`upcast`).
        self.upcasters: dict[str, Upcaster[TIn]] = {}

    def upcast(
        self, from_fingerprint: str
    ) -> Callable[[Callable[[TOld], TIn]], Callable[[TOld], TIn]]:
        """Register a function turning a payload of the old input schema
        ``from_fingerprint`` into this task's input model (see :mod:`typedq.upcast`);
        workers apply it to the jobs carrying that fingerprint instead of failing them
        with ``schema_mismatch``.

        :raises ConfigError: see :class:`~typedq.upcast.Upcaster`, or a second upcaster
            of the same fingerprint
        """
        from .upcast import Upcaster

        def register(fn: Callable[[TOld], TIn]) -> Callable[[TOld], TIn]:
            if from_fingerprint in self.upcasters:
                raise ConfigError(
                    f"task {self.name!r} already upcasts from {from_fingerprint} "
                    f"({self.upcasters[from_fingerprint].name})"
                )
            self.upcasters[from_fingerprint] = Upcaster(from_fingerprint, fn, self.input)
            return fn

        return register

    # -- running ----------------------------------------------------------------

    def __call__(self, payload: TIn, ctx: JobContext[Any] | None = None) -> Awaitable[TOut]:
        """Run the handler here, now, without the queue: ``await send_invoice(inv)``.
        Items it emits are checked, and dropped (no job has a stream)."""
        return self.invoke(payload, ctx or self._local_context())

    def _local_context(self) -> JobContext[Any]:
        return JobContext(
            job_id="local",
            task=self.name,
            queue=self.queue,
            attempt=1,
            enqueued_at=0.0,
            emitter=None if self.emits is None else LocalEmitter(self.emits, self.name),
        )

    async def invoke(self, payload: TIn, ctx: JobContext[Any]) -> TOut:
        """Call the handler in this task (async) or inline (sync); the worker threads sync ones."""
        args = (payload, ctx) if self.takes_context else (payload,)
        if self.is_async:
            return typing.cast(TOut, await self.fn(*args))
        return typing.cast(TOut, self.fn(*args))


class StreamTask(Task[TIn, TOut], Generic[TIn, TOut, TEmit_co]):
    """A task whose handler emits ``TEmit_co`` items (``@app.task(emits=...)``): its job
    handles are :class:`~typedq.job.StreamJob`, whose ``stream()`` yields them."""

    def job(self, job_id: str) -> StreamJob[TOut, TEmit_co]:
        """A handle on an existing job of this task, by id."""
        return typing.cast("StreamJob[TOut, TEmit_co]", super().job(job_id))

    async def enqueue(
        self, payload: TIn, *, within: object | None = None, **options: Unpack[EnqueueOptions]
    ) -> StreamJob[TOut, TEmit_co]:
        """Enqueue one job and return its handle (see :meth:`TaskBase.enqueue`)."""
        job = await super().enqueue(payload, within=within, **options)
        return typing.cast("StreamJob[TOut, TEmit_co]", job)

    # list is invariant, so mypy calls this narrower return an incompatible override;
    # every element is a StreamJob, which is a Job[TOut].
    async def enqueue_many(  # type: ignore[override]
        self,
        payloads: Iterable[TIn],
        *,
        within: object | None = None,
        **options: Unpack[BatchOptions],
    ) -> list[StreamJob[TOut, TEmit_co]]:
        """Enqueue many jobs in few round trips (see :meth:`TaskBase.enqueue_many`)."""
        jobs = await super().enqueue_many(payloads, within=within, **options)
        return typing.cast("list[StreamJob[TOut, TEmit_co]]", jobs)


AsyncHandler: TypeAlias = Callable[[TIn], Awaitable[TOut]]
AsyncContextHandler: TypeAlias = Callable[[TIn, JobContext], Awaitable[TOut]]
SyncHandler: TypeAlias = Callable[[TIn], TOut]
SyncContextHandler: TypeAlias = Callable[[TIn, JobContext], TOut]
#: A handler of an emitting task (``@app.task(emits=TEmit)``): its context is
#: ``JobContext[TEmit]``.
AsyncEmitHandler: TypeAlias = Callable[[TIn, JobContext[TEmit]], Awaitable[TOut]]
SyncEmitHandler: TypeAlias = Callable[[TIn, JobContext[TEmit]], TOut]
BackoffKind: TypeAlias = Literal["fixed", "exponential"]


class TaskDecorator(Protocol):
    """What ``app.task(...)`` with options returns: applied to a handler, makes a Task."""

    @overload
    def __call__(self, fn: AsyncContextHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def __call__(self, fn: AsyncHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def __call__(self, fn: SyncContextHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def __call__(self, fn: SyncHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...


class EmitTaskDecorator(Protocol[TEmit]):
    """What ``app.task(emits=Token, ...)`` returns: applied to a handler taking a
    ``JobContext[Token]``, makes a ``StreamTask[TIn, TOut, Token]``."""

    @overload
    def __call__(
        self, fn: AsyncEmitHandler[TIn, TEmit, TOut], /
    ) -> StreamTask[TIn, TOut, TEmit]: ...
    @overload
    def __call__(self, fn: AsyncHandler[TIn, TOut], /) -> StreamTask[TIn, TOut, TEmit]: ...
    @overload
    def __call__(
        self, fn: SyncEmitHandler[TIn, TEmit, TOut], /
    ) -> StreamTask[TIn, TOut, TEmit]: ...
    @overload
    def __call__(self, fn: SyncHandler[TIn, TOut], /) -> StreamTask[TIn, TOut, TEmit]: ...
