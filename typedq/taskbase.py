"""A task as producers see it (:class:`TaskBase`): its name, queue, options and typed
input and output, building envelopes and enqueueing them; the typed producer interface
(:class:`Enqueuer`) it shares with a generated stub task; and the type variables of
tasks. :class:`typedq.task.Task` adds the handler; every name here is importable from
:mod:`typedq.task` as before.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Protocol,
    TypeVar,
)

import msgspec
import pydantic
from typing_extensions import Unpack

from .broker.base import JobMessage
from .errors import ConfigError, InvalidOption, PartialEnqueue, Unsupported
from .fair import Fair, check_fair
from .flowcontrol import Debounce, check_flow_control
from .job import Job, StreamJob
from .limits import ConcurrencyLimit, RateLimit, check_limit_option, limit_key
from .names import (
    check_job_id,
    key_job_id,
    new_job_id,
    new_job_ids,
    partition_queue,
    partition_queues,
)
from .queues import check_limits_partitions
from .serde import Codec, codec_for, is_model_type
from .taskoptions import (
    UNSET,
    BatchOptions,
    CallOptions,
    EnqueueOptions,
    TaskOptions,
    Unset,
    call_options,
)

if TYPE_CHECKING:
    from .client import Client
    from .workflow import Chain, FanOut

__all__ = ["Enqueuer", "TIn", "TOut", "TaskBase"]

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

    async def enqueue(
        self,
        payload: TIn_contra,
        *,
        within: object | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> Job[TOut]:
        """Enqueue one job and return its handle."""
        ...

    async def enqueue_many(
        self,
        payloads: Iterable[TIn_contra],
        *,
        within: object | None = None,
        **options: Unpack[BatchOptions],
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

    async def enqueue(
        self, payload: TIn, *, within: object | None = None, **options: Unpack[EnqueueOptions]
    ) -> Job[TOut]:
        """Enqueue one job and return its handle.

        Concurrent calls are coalesced into one broker round trip.

        :param payload: the input model
        :param within: your database connection with a transaction open (a psycopg 3
            ``AsyncConnection``, an asyncpg ``Connection``, a SQLAlchemy ``AsyncSession``
            or ``AsyncConnection``): the job is stored in that transaction and exists if
            and only if it commits. Needs the PostgreSQL broker; on another broker it
            raises Unsupported (docs/producers.md "Enqueue in your transaction")
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
        if within is not None:
            self._refuse_controlled_within()
            message = self.message(payload, **options)
            (outcome,) = await self._owner.client._enqueue_within(within, [message])
            return self._job(outcome.id, created=outcome.created)
        if self.flow_control is not None:
            return await self._enqueue_controlled(payload, options)
        message = self.message(payload, **options)
        outcome = await self._owner.client._enqueue(message)  # checked by message()
        return self._job(outcome.id, created=outcome.created)

    def _refuse_controlled_within(self) -> None:
        """``within=`` stores plain jobs only (so far): a unique window's or a debounce's
        key lives in the broker's own bookkeeping, outside the caller's transaction."""
        if self.flow_control is not None:
            raise Unsupported(
                f"task {self.name!r}: within= cannot enqueue a task with unique_for= or "
                "debounce= yet; enqueue it after your transaction commits"
            )

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
        self,
        payloads: Iterable[TIn],
        *,
        within: object | None = None,
        **options: Unpack[BatchOptions],
    ) -> list[Job[TOut]]:
        """Enqueue many jobs in few round trips; the jobs come back in input order.

        With ``within=`` (see :meth:`enqueue`) every job is stored in your transaction, in
        one call: all of them exist if and only if it commits.

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
        if within is not None:
            self._refuse_controlled_within()
            checked = self._options(options, UNSET, UNSET)
            messages = self._build_many(payloads, checked)
            outcomes = await self._owner.client._enqueue_within(within, messages)
            return [self._job(o.id, created=o.created) for o in outcomes]
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
