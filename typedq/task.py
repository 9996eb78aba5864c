"""Tasks: typed handlers bound to a queue, and the typed producer API.

``@app.task`` turns ``async def send_invoice(inv: SendInvoice) -> Receipt`` into a
``Task[SendInvoice, Receipt]``: ``enqueue`` accepts only a ``SendInvoice`` and returns a
``Job[Receipt]``, and calling the task still runs the function.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Sequence
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

import msgspec
import pydantic
from typing_extensions import Unpack

from .broker.base import JobMessage
from .context import JobContext
from .errors import ConfigError, InvalidOption, PartialEnqueue
from .fair import Fair, check_fair
from .flowcontrol import Debounce, check_flow_control

# The ``X as X`` imports from handlers, queues and taskoptions re-export what was split out
# of this module (issue 25): every name is still importable from typedq.task.
from .handlers import count_params
from .handlers import handler_types as handler_types
from .job import Job, StreamJob, TEmit_co
from .limits import ConcurrencyLimit, RateLimit, check_limit_option, limit_key
from .names import (
    check_job_id,
    key_job_id,
    new_job_id,
    new_job_ids,
    partition_queue,
    partition_queues,
)
from .queues import check_limits_partitions as check_limits_partitions
from .queues import check_partitions as check_partitions
from .queues import check_queues as check_queues
from .queues import expand_queues as expand_queues
from .serde import Codec, codec_for, is_model_type
from .streams import LocalEmitter
from .taskoptions import DEFAULT_QUEUE as DEFAULT_QUEUE
from .taskoptions import UNSET as UNSET
from .taskoptions import BatchOptions as BatchOptions
from .taskoptions import CallOptions, call_options
from .taskoptions import EnqueueOptions as EnqueueOptions
from .taskoptions import TaskDefaults as TaskDefaults
from .taskoptions import TaskOptions as TaskOptions
from .taskoptions import Unset as Unset

#: The old payload an upcaster takes (typedq.upcast).
TOld = TypeVar("TOld")

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .broker.base import Broker
    from .client import Client
    from .resources import Resource
    from .schedule import Schedule
    from .upcast import Upcaster
    from .workflow import Chain, FanOut

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

#: A task's input: a model, or a list of models (a fan-in callback, :mod:`typedq.workflow`).
TIn = TypeVar(
    "TIn",
    bound=msgspec.Struct | pydantic.BaseModel | Sequence[msgspec.Struct | pydantic.BaseModel],
)
TOut = TypeVar("TOut", bound=msgspec.Struct | pydantic.BaseModel | None)
TIn_contra = TypeVar(
    "TIn_contra",
    bound=msgspec.Struct | pydantic.BaseModel | Sequence[msgspec.Struct | pydantic.BaseModel],
    contravariant=True,
)
#: What an emitting task's handler emits (``emits=``).
TEmit = TypeVar("TEmit", bound=msgspec.Struct | pydantic.BaseModel)
#: The next step's output (``then``).
TNext = TypeVar("TNext", bound=msgspec.Struct | pydantic.BaseModel | None)
#: A task's output as the next step's input (``then``).
TMid = TypeVar("TMid", bound=msgspec.Struct | pydantic.BaseModel)


class _Owner(Protocol):
    """What a task is bound to: an App or a producer-only Client."""

    @property
    def client(self) -> Client: ...


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


class Enqueuer(Protocol[TIn_contra, TOut]):
    """The typed producer interface shared by a :class:`Task` and a generated stub task.

    Helpers that only enqueue take an ``Enqueuer[TIn, TOut]`` and accept either: the real
    task (in the worker's codebase) or its :class:`~typedq.producer.TaskStub` (in a
    producer service that cannot import the handlers). mypy checks both the same way.
    """

    @property
    def name(self) -> str:
        """The registered task name."""
        ...

    @property
    def queue(self) -> str:
        """The queue its jobs go to."""
        ...

    def message(self, payload: TIn_contra, **options: Unpack[EnqueueOptions]) -> JobMessage:
        """Build the envelope ``enqueue`` would send."""
        ...

    def job(self, job_id: str) -> Job[TOut]:
        """A handle on an existing job of this task, by id."""
        ...

    async def enqueue(self, payload: TIn_contra, **options: Unpack[EnqueueOptions]) -> Job[TOut]:
        """Enqueue one job and return its handle."""
        ...

    async def enqueue_many(
        self, payloads: Iterable[TIn_contra], **options: Unpack[BatchOptions]
    ) -> list[Job[TOut]]:
        """Enqueue many jobs in few round trips."""
        ...


class TaskBase(Generic[TIn, TOut]):
    """A task as producers see it: name, queue, options and typed input/output, no handler.

    :class:`Task` (a registered handler) and :class:`~typedq.producer.TaskStub` (a
    generated declaration for producers) both derive from it, so they share one typed
    producer API: ``enqueue`` accepts only a ``TIn`` and returns a ``Job[TOut]``.

    :param owner: what the task is bound to (an App, a Producer or a Client): its
        ``client`` sends the jobs
    :param options: name, queue and defaults
    :param input_type: the input model
    :param output_type: the output model, or ``type(None)``
    :param key: derive the job id from the input, so equal keys dedupe
    :param max_payload_bytes: the largest encoded input accepted
    :param rate_limit: the task's rate limit; its key function runs here, at the
        producer, and the key travels in the envelope
    :param concurrency: the task's concurrency limit (its key, likewise)
    :param unique_for: one job per key (``key=``) while it is pending or running and
        this long after it completed (a timedelta or seconds; docs/flow-control.md)
    :param debounce: collapse enqueues of one key into one job (docs/flow-control.md)
    :param emits: the model its handler emits (``ctx.emit``), None for none
    :param fair: claim its jobs round-robin across keys (docs/flow-control.md); its key
        function runs here, at the producer, and the key travels in the envelope
    :raises ConfigError: conflicting or out-of-range options, naming the fix
    """

    def __init__(
        self,
        *,
        owner: _Owner,
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
        self.options = options
        self.name = options.name
        self.queue = options.queue
        self.key = key
        #: The task's unique window or debounce (None: neither; its enqueues take the
        #: plain path, which never looks at this but once).
        self.flow_control = check_flow_control(
            self.name, key, unique_for, debounce, options.partitions
        )
        # A key-derived id dedups only while the job exists; a unique window or a
        # debounce gives each job a fresh id and lets the broker's marker dedup.
        self._id_key = key if self.flow_control is None else None
        check_limit_option(self.name, "rate_limit", rate_limit, RateLimit)
        check_limit_option(self.name, "concurrency", concurrency, ConcurrencyLimit)
        check_limits_partitions(options, rate_limit, concurrency)
        self.rate_limit = rate_limit
        self.concurrency = concurrency
        #: The task's fair shares (None: its jobs wait FIFO within their priority).
        self.fair = check_fair(self.name, fair, options.partitions)
        self.input: Codec[TIn] = codec_for(input_type, max_bytes=max_payload_bytes)
        self.output: Codec[TOut] = codec_for(output_type)
        #: The model the handler emits (``ctx.emit``), or None: the task streams nothing.
        self.emits: Codec[Any] | None = None
        if emits is not None:
            if not is_model_type(emits):
                raise ConfigError(
                    f"task {self.name!r}: emits={emits!r} must be a msgspec.Struct or "
                    "pydantic.BaseModel subclass (the model of the items ctx.emit sends)"
                )
            self.emits = codec_for(emits)
        self._owner = owner

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, queue={self.queue!r}, "
            f"input={self.input.type.__qualname__}, output={self.output.name})"
        )

    # -- producing --------------------------------------------------------------

    def message(self, payload: TIn, **options: Unpack[EnqueueOptions]) -> JobMessage:
        """Build the envelope ``enqueue`` would send (validated and encoded).

        :raises InvalidOption: a number out of its range (see :meth:`enqueue`)
        """
        # Every option is checked before the payload is encoded or anything is sent,
        # so a bad number fails this call alone, with a message naming it.
        checked = self._options(
            options, options.get("retries", UNSET), options.get("timeout", UNSET)
        )
        return self._build(payload, options.get("job_id"), checked)

    def _options(
        self,
        options: BatchOptions,
        retries: int | Unset,
        timeout: float | Unset | None,
    ) -> CallOptions:
        """The per-call options, checked and in envelope form (not given: the defaults)."""
        return call_options(self.options, options, retries, timeout)

    def _build(self, payload: TIn, job_id: str | None, options: CallOptions) -> JobMessage:
        if job_id is not None:
            check_job_id(job_id)
        elif self._id_key is not None:
            job_id = key_job_id(self.name, self._id_key(payload))
        else:
            job_id = new_job_id()
        fair_key, fair_weight = (
            ("", 0) if self.fair is None else self.fair.share(self.name, payload)
        )
        return JobMessage(
            id=job_id,
            task=self.name,
            queue=self.queue_for(job_id),
            payload=self.input.encode(payload),
            fingerprint=self.input.fingerprint,
            priority=options.priority,
            eta=options.eta,
            delay=options.delay,
            max_retries=options.max_retries,
            timeout=options.timeout,
            rate_key=limit_key(self.name, self.rate_limit.key, payload)
            if self.rate_limit is not None
            else "",
            concurrency_key=limit_key(self.name, self.concurrency.key, payload)
            if self.concurrency is not None
            else "",
            fair_key=fair_key,
            fair_weight=fair_weight,
        )

    def _build_many(self, payloads: Iterable[TIn], options: CallOptions) -> list[JobMessage]:
        """The envelopes :meth:`_build` makes for ``payloads`` (new ids), made in one pass:
        the payloads encoded in one loop and each envelope a copy of one template with its
        id, queue and payload. A key function or a limit key (code run per payload) takes
        the job-by-job path."""
        if (
            self._id_key is not None
            or self.rate_limit is not None
            or self.concurrency is not None
            or self.fair is not None
        ):
            return [self._build(payload, None, options) for payload in payloads]
        data = self.input.encode_many(payloads)
        template = JobMessage(
            id="",
            task=self.name,
            queue=self.queue,
            payload=b"",
            fingerprint=self.input.fingerprint,
            priority=options.priority,
            eta=options.eta,
            delay=options.delay,
            max_retries=options.max_retries,
            timeout=options.timeout,
        )
        copy = msgspec.structs.replace
        ids = new_job_ids(len(data))
        if self.options.partitions == 1:
            return [copy(template, id=i, payload=p) for i, p in zip(ids, data, strict=True)]
        queue_for = self.queue_for
        return [
            copy(template, id=i, queue=queue_for(i), payload=p)
            for i, p in zip(ids, data, strict=True)
        ]

    def _job(self, job_id: str, *, created: bool) -> Job[TOut]:
        # An emitting task's handles are StreamJobs (StreamTask's methods say so to mypy).
        return (Job if self.emits is None else StreamJob)(
            self._owner.client,
            job_id,
            self.name,
            self.output,
            self.options.errors,
            created=created,
            queue=self.queue_for(job_id),
            emits=self.emits,
        )

    def queue_for(self, job_id: str) -> str:
        """The queue job ``job_id`` of this task is stored in: the task's queue, or the
        partition of it the id hashes to (see :func:`~typedq.names.partition_queue`)."""
        return partition_queue(self.queue, self.options.partitions, job_id)

    @property
    def queues(self) -> list[str]:
        """The queues this task's jobs are stored in: its queue, or its partitions."""
        return partition_queues(self.queue, self.options.partitions)

    def job(self, job_id: str) -> Job[TOut]:
        """A handle on an existing job of this task, by id."""
        return self._job(check_job_id(job_id), created=False)

    async def enqueue(self, payload: TIn, **options: Unpack[EnqueueOptions]) -> Job[TOut]:
        """Enqueue one job and return its handle.

        Concurrent calls are coalesced into one broker round trip.

        :param payload: the input model
        :param delay: run no sooner than this many seconds from now (finite, 0 to
            :data:`~typedq.options.MAX_SECONDS`, or a timedelta)
        :param eta: run no sooner than this time (aware datetime or epoch seconds, finite,
            0 to :data:`~typedq.options.MAX_SECONDS`); a past time runs at once
        :param priority: override the task's priority (an int from :data:`~typedq.options.MIN_PRIORITY`
            to :data:`~typedq.options.MAX_PRIORITY`)
        :param job_id: a unique id; enqueueing an id that exists returns that job
            (``job.created`` is False): idempotent producers
        :param retries: override the task's retries for this job (0 to :data:`~typedq.options.MAX_RETRIES`)
        :param timeout: override the task's timeout for this job (seconds > 0, or None)

        A task with ``unique_for=`` or ``debounce=`` enqueues through its key: a held
        key (or a debounced job still collecting) returns that job, ``created`` False
        (docs/flow-control.md).

        :raises InvalidOption: a number that is not finite or out of its range, or the
            key function failed (nothing is sent, and concurrent enqueues are not affected)
        :raises PayloadTooLarge, EncodeError, InvalidName, NotConnected, QueueFull:
        """
        if self.flow_control is not None:
            return await self._enqueue_controlled(payload, options)
        message = self.message(payload, **options)
        outcome = await self._owner.client._enqueue(message)  # checked by message()
        return self._job(outcome.id, created=outcome.created)

    async def _enqueue_controlled(self, payload: TIn, options: EnqueueOptions) -> Job[TOut]:
        """Enqueue under the task's unique window or debounce (typedq.flowcontrol): the
        key computed and the options checked before anything is sent."""
        spec = self.flow_control
        assert spec is not None
        if spec.wait > 0:
            if options.get("job_id") is not None:
                raise ConfigError(
                    f"task {self.name!r}: a debounced job's id is the broker's to pick (one "
                    "job per key); drop job_id= or the task's debounce="
                )
            if options.get("delay") or options.get("eta") is not None:
                raise InvalidOption(
                    f"task {self.name!r}: a debounced job runs Debounce.wait after the last "
                    "enqueue; drop delay=/eta= (or the task's debounce=)"
                )
        control = spec.control(payload)
        message = self.message(payload, **options)
        outcome = await self._owner.client._enqueue_controlled(message, control)
        return self._job(outcome.id, created=outcome.created)

    async def enqueue_many(
        self, payloads: Iterable[TIn], **options: Unpack[BatchOptions]
    ) -> list[Job[TOut]]:
        """Enqueue many jobs in few round trips; the jobs come back in input order.

        Every payload is checked (its model class, that it encodes, its size) and every
        id made before anything is sent, so a bad one enqueues nothing. Field values are
        not validated here: the worker validates them, and a payload that does not
        validate fails as ``invalid_payload``. The jobs go in chunks, in input order (jobs
        of equal priority are claimed in that order), each chunk stored atomically.

        :raises PartialEnqueue: some chunks were stored and others refused; ``exc.jobs``
            are the stored jobs and ``exc.unsent`` the envelopes of the others, whose ids
            are fixed: ``await app.client.enqueue_many(exc.unsent)`` stores them without
            duplicates (then ``task.job(id)`` gives their handles)
        :raises QueueFull, BrokerError: every chunk was refused (nothing was stored)
        """
        if self.flow_control is not None:
            # One job after the other, each under the task's unique window or debounce.
            return [
                await self._enqueue_controlled(p, typing.cast(EnqueueOptions, options))
                for p in list(payloads)
            ]
        checked = self._options(options, UNSET, UNSET)  # checked once for all
        messages = self._build_many(payloads, checked)
        client = self._owner.client
        try:
            outcomes = await client._enqueue_many(messages)  # checked
        except PartialEnqueue as exc:
            exc.jobs = [self._job(o.id, created=o.created) for o in exc.outcomes if o is not None]
            raise
        # The handles made inline (each job's queue is its envelope's: no hash again).
        name, output, errors, emits = self.name, self.output, self.options.errors, self.emits
        handle = Job if emits is None else StreamJob
        return [
            handle(
                client, o.id, name, output, errors, created=o.created, queue=m.queue, emits=emits
            )
            for o, m in zip(outcomes, messages, strict=True)
        ]

    # -- workflows (typedq.workflow) --------------------------------------------------

    def then(self: TaskBase[TIn, TMid], task: TaskBase[TMid, TNext]) -> Chain[TIn, TNext]:
        """A chain: this task, then ``task`` on its result (mypy: ``task`` must take this
        task's output). ``await chain.enqueue(payload)`` gives the last step's ``Job``.

        :raises ConfigError: the types do not meet (for callers mypy does not check)
        """
        from .workflow import Chain

        return Chain([self, task])

    def map(self, inputs: Iterable[TIn]) -> FanOut[TOut]:
        """A fan-out of this task over ``inputs``: ``await fan.enqueue()`` gives
        ``Job[list[TOut]]`` (results in input order); ``fan.then(callback)`` fans in.

        Every input is checked and encoded here, so a bad one fails this call.
        """
        from .workflow import FanOut

        return FanOut(self, inputs)


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
        from .errors import ConfigError
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
        self, payload: TIn, **options: Unpack[EnqueueOptions]
    ) -> StreamJob[TOut, TEmit_co]:
        """Enqueue one job and return its handle (see :meth:`TaskBase.enqueue`)."""
        return typing.cast("StreamJob[TOut, TEmit_co]", await super().enqueue(payload, **options))

    # list is invariant, so mypy calls this narrower return an incompatible override;
    # every element is a StreamJob, which is a Job[TOut].
    async def enqueue_many(  # type: ignore[override]
        self, payloads: Iterable[TIn], **options: Unpack[BatchOptions]
    ) -> list[StreamJob[TOut, TEmit_co]]:
        """Enqueue many jobs in few round trips (see :meth:`TaskBase.enqueue_many`)."""
        jobs = await super().enqueue_many(payloads, **options)
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
