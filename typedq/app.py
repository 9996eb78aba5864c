"""The App: a namespace of tasks, a broker connection, and workers for them."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from typing_extensions import Unpack

from .appbase import DEFAULT_MAX_PAYLOAD, AppBase
from .broker.base import Broker, BrokerSettings, ClaimedJob, Retention
from .broker.capabilities import EventStreams, FlowControl, JobStreams, Limits, Runs, Schedules
from .broker.runs import RUN_SCHEMA_PREFIX
from .clock import SYSTEM_CLOCK, Clock
from .context import JobContext
from .durable.host import (
    TURN_PREFIX,
    TURN_RETRIES,
    DurableDecorator,
    DurableTask,
    RunTurn,
)
from .durable.replay import DurableFunction
from .durable.types import durable_types
from .errors import ConfigError
from .fair import Fair
from .flowcontrol import Debounce
from .limits import ConcurrencyLimit, RateLimit
from .names import check_name
from .options import check_int_option
from .resources import Resource, Resources, check_factory
from .schedule import Schedule, ScheduleOptions
from .task import (
    AsyncContextHandler,
    AsyncHandler,
    EmitTaskDecorator,
    StreamTask,
    SyncContextHandler,
    SyncHandler,
    Task,
    TaskDecorator,
    TaskDefaults,
    TaskOptions,
    TEmit,
    TIn,
    TOut,
    check_limits_partitions,
    check_partitions,
    handler_types,
)
from .worker import Worker

if TYPE_CHECKING:
    from types import TracebackType

    from .serde import Codec
    from .tracing import Tracing

__all__ = ["App"]

T = TypeVar("T")


class App(AppBase):
    """A named set of tasks sharing one broker.

    :param name: the namespace of every key and queue (``[A-Za-z0-9][A-Za-z0-9_.-]*``)
    :param broker: a URL or a Broker; ``None`` uses ``$TYPEDQ_BROKER``, else ``memory://``
    :param max_payload_bytes: the largest encoded input accepted by ``enqueue`` and by workers
    :param lease: seconds a worker's claim lasts without renewal (renewed every third of it)
    :param max_stalls: lease expiries after which a job fails with reason ``stalled``
    :param retention: bounds on kept finished jobs (memory stays bounded)
    :param max_queue_length: refuse enqueues past this many pending jobs per queue (0 = no cap;
        a partitioned queue's partitions share it: ceil(cap / partitions) each)
    :param tracing: OpenTelemetry spans for enqueues and for this app's workers: True
        (the global TracerProvider) or a :class:`~typedq.tracing.Tracing`; needs
        ``pip install 'typedq[otel]'``; off by default (see docs/observability.md)
    :param event_streams: workers turn their queues' event streams on at start-up (else
        the first ``app.events(...)`` does; see :mod:`typedq.events`)
    :param events_max: about how many events each queue's event stream keeps
    """

    def __init__(
        self,
        name: str,
        *,
        broker: str | Broker | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD,
        lease: float = 30.0,
        max_stalls: int = 3,
        retention: Retention | None = None,
        max_queue_length: int = 0,
        tracing: bool | Tracing = False,
        event_streams: bool = False,
        events_max: int = 10_000,
    ) -> None:
        if lease <= 0:
            raise ConfigError(f"lease must be > 0 seconds, got {lease}")
        check_int_option("events_max", events_max, 1, 2**31 - 1, subject=f"App({name!r})")
        super().__init__(
            name,
            broker=broker,
            settings=BrokerSettings(
                namespace=check_name("app", name),
                max_stalls=max_stalls,
                retention=retention or Retention(),
                max_queue_length=max_queue_length,
                events_max=events_max,
            ),
            max_payload_bytes=max_payload_bytes,
            tracing=tracing,
        )
        self.lease = lease
        #: Workers turn their queues' event streams on at start-up (typedq.events).
        self.event_streams = event_streams
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._resources: dict[str, Resource[Any]] = {}
        self._schedules: dict[str, Schedule[Any]] = {}
        self._durables: dict[str, DurableTask[Any, Any]] = {}

    def __repr__(self) -> str:
        return f"App({self.name!r}, tasks={sorted(self._tasks)})"

    # -- tasks -------------------------------------------------------------------------

    @property
    def tasks(self) -> Mapping[str, Task[Any, Any]]:
        """The registered tasks by name."""
        return dict(self._tasks)

    @property
    def queues(self) -> list[str]:
        """Every queue some task of this app stores jobs in, sorted: a partitioned
        queue's partitions (``emails.p0`` ...) stand for it."""
        return sorted({q for t in self._tasks.values() for q in t.queues})

    @overload
    def task(self, fn: AsyncContextHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def task(self, fn: AsyncHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def task(self, fn: SyncContextHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def task(self, fn: SyncHandler[TIn, TOut], /) -> Task[TIn, TOut]: ...
    @overload
    def task(
        self,
        *,
        name: str | None = None,
        key: Callable[[Any], str] | None = None,
        rate_limit: RateLimit[Any] | None = None,
        concurrency: ConcurrencyLimit[Any] | None = None,
        unique_for: timedelta | float | None = None,
        debounce: Debounce[Any] | None = None,
        fair: Fair[Any] | None = None,
        emits: None = None,
        **defaults: Unpack[TaskDefaults],
    ) -> TaskDecorator: ...
    @overload
    def task(
        self,
        *,
        emits: type[TEmit],
        name: str | None = None,
        key: Callable[[Any], str] | None = None,
        rate_limit: RateLimit[Any] | None = None,
        concurrency: ConcurrencyLimit[Any] | None = None,
        unique_for: timedelta | float | None = None,
        debounce: Debounce[Any] | None = None,
        fair: Fair[Any] | None = None,
        **defaults: Unpack[TaskDefaults],
    ) -> EmitTaskDecorator[TEmit]: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        key: Callable[[Any], str] | None = None,
        rate_limit: RateLimit[Any] | None = None,
        concurrency: ConcurrencyLimit[Any] | None = None,
        unique_for: timedelta | float | None = None,
        debounce: Debounce[Any] | None = None,
        fair: Fair[Any] | None = None,
        emits: type[Any] | None = None,
        **defaults: Unpack[TaskDefaults],
    ) -> Any:
        """Register a handler as a task: ``@app.task`` or ``@app.task(retries=3, ...)``.

        The handler takes one model (msgspec Struct or Pydantic model) and optionally a
        :class:`~typedq.JobContext`, and returns a model or ``None``; it may be
        ``async def`` or plain ``def`` (run in a worker thread).

        The options ``queue`` to ``partitions`` are :class:`~typedq.task.TaskDefaults`
        (``Producer.task`` takes the same).

        :param name: the task name (default: the function's ``__name__``)
        :param queue: the queue its jobs go to
        :param retries: how many times a failed attempt is retried
        :param backoff: delays between retries (default: exponential from 1 s, max 300 s)
        :param timeout: seconds per attempt, ``None`` for no limit
        :param priority: default priority; higher runs first
        :param errors: domain error models the handler may raise with ``Reject``
        :param partitions: split the queue into this many sub-queues (``emails.p0`` ...,
            1 to 256; see :class:`~typedq.task.TaskOptions`); workers of the queue claim
            from all of them in turn
        :param key: derive the job id from the input, so equal keys dedupe
        :param rate_limit: at most ``limit`` starts per ``per`` seconds, across every
            worker (per key with ``key=``): :class:`~typedq.RateLimit`
        :param concurrency: at most ``limit`` running at once (per key with ``key=``),
            across every worker: :class:`~typedq.ConcurrencyLimit`
        :param unique_for: with ``key=``: one job per key while it is pending or running,
            and for this long (a timedelta or seconds) after it completed; an enqueue of
            a held key returns the holder (``created`` False). docs/flow-control.md
        :param debounce: :class:`~typedq.Debounce`: enqueues of one key collapse into one
            job that runs ``wait`` after the last (with its payload), at the latest
            ``max_wait`` after the first. docs/flow-control.md
        :param emits: the model of the items the handler streams: it takes a
            ``JobContext[emits]`` and calls ``await ctx.emit(item)``; the producer reads
            them with ``job.stream()`` (docs/streams.md; the broker needs JobStreams)
        :param fair: :class:`~typedq.Fair`: the task's waiting jobs are claimed
            round-robin across the key's values (weighted), not FIFO. docs/flow-control.md
        :raises ConfigError: a bad limit or fair=, or conflicting or out-of-range unique_for /
            debounce (naming the task and the fix)
        """

        def register(handler: Callable[..., Any]) -> Task[Any, Any]:
            input_type, output_type = handler_types(handler)
            options = TaskOptions.of(name or handler.__name__, defaults)
            if options.name in self._tasks:
                raise ConfigError(
                    f"app {self.name!r} already has a task named {options.name!r}; "
                    "pass @app.task(name=...) to register another"
                )
            check_limits_partitions(options, rate_limit, concurrency)
            check_partitions(options, [t.options for t in self._tasks.values()])
            self._declare_partitions({options.queue: options.partitions})
            task: Task[Any, Any] = (Task if emits is None else StreamTask)(
                handler,
                app=self,
                options=options,
                input_type=input_type,
                output_type=output_type,
                key=key,
                max_payload_bytes=self.max_payload_bytes,
                rate_limit=rate_limit,
                concurrency=concurrency,
                unique_for=unique_for,
                debounce=debounce,
                emits=emits,
                fair=fair,
            )
            self._tasks[options.name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    # -- durable runs (typedq.durable) --------------------------------------------------

    @property
    def durables(self) -> Mapping[str, DurableTask[Any, Any]]:
        """The durable functions by name."""
        return dict(self._durables)

    @property
    def step_hook(self) -> Callable[[ClaimedJob, bytes], Awaitable[None]] | None:
        """:meth:`after_step` for a worker of this app, or None when it has no durable
        functions (the worker then checks nothing per job)."""
        return self.after_step if self._durables else None

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            # Runs this process kept paused for their next turn (typedq.durable.resume):
            # closed now, not whenever they are collected.
            for durable in self._durables.values():
                durable.close_paused()

    async def after_step(self, claimed: ClaimedJob, result: bytes) -> None:
        """A step job of a durable run returned ``result`` in a worker of this app, before
        its completion is recorded: when this process keeps the run paused at that step,
        its next turn runs here and now
        (:meth:`DurableTask.after_step <typedq.durable.host.DurableTask.after_step>`)."""
        # A step recovered from a stall (its worker died, maybe in the turn that ran
        # here after it) leaves its next turn to a turn job: a turn that keeps killing
        # its worker fails as a turn, never as the step that succeeded.
        message = claimed.message
        broker = self.broker
        if (
            claimed.stalls
            or not broker.fenced_run_appends
            or (message.queue != message.run_queue and not broker.fences_other_queues)
        ):
            return
        run_id = message.id.rpartition(":")[0]
        for durable in self._durables.values():
            if run_id in durable._paused or run_id in durable._appending:
                await durable.after_step(claimed, result)
                return

    @overload
    def durable(self, fn: DurableFunction[TIn, TOut], /) -> DurableTask[TIn, TOut]: ...
    @overload
    def durable(
        self, *, name: str | None = None, **defaults: Unpack[TaskDefaults]
    ) -> DurableDecorator: ...

    def durable(
        self,
        fn: DurableFunction[Any, Any] | None = None,
        *,
        name: str | None = None,
        **defaults: Unpack[TaskDefaults],
    ) -> Any:
        """Register a durable function: ``@app.durable`` or ``@app.durable(queue=...)``.

        ``async def f(run: Run, inp: Model) -> Model | None``, re-run against its log
        after every suspension or crash (docs/durable.md). Its options are those of its
        turn task ``typedq.run.<name>`` (see :class:`~typedq.durable.host.DurableTask`);
        ``retries`` defaults to 10 there, as a turn is a replay.

        :param name: the durable function's name (default: the function's ``__name__``)
        """

        def register(fn: DurableFunction[Any, Any]) -> DurableTask[Any, Any]:
            input_type, output_type = durable_types(fn)
            run_name = check_name("durable", name or fn.__name__)
            if run_name in self._durables:
                raise ConfigError(f"app {self.name!r} already has a durable {run_name!r}")
            if defaults.get("partitions", 1) != 1:
                raise ConfigError(f"durable {run_name!r}: a run's queue takes no partitions")
            durable: DurableTask[Any, Any] = DurableTask(
                fn, app=self, name=run_name, input_type=input_type, output_type=output_type
            )

            # A turn is a replay, safe to run again: retried by default, so that a broker
            # hiccup in a turn does not leave the run without a next turn.
            options: TaskDefaults = {"retries": TURN_RETRIES, **defaults}
            retries = options.get("retries", TURN_RETRIES)

            async def turn(turn: RunTurn, ctx: JobContext) -> None:
                try:
                    await durable.turn(turn.run_id)
                except Exception as exc:
                    if ctx.attempt > retries:
                        # Its last attempt: no turn would come again, so the run fails
                        # with why instead of waiting for ever.
                        await durable.fail_run(turn.run_id, exc, attempts=ctx.attempt)
                    raise

            durable.turn_task = self.task(name=TURN_PREFIX + run_name, **options)(turn)
            self._durables[run_name] = durable
            return durable

        if fn is not None:
            return register(fn)
        return register

    # -- resources -------------------------------------------------------------------

    @property
    def resources(self) -> tuple[Resource[Any], ...]:
        """The registered resources, in the order workers open them."""
        return tuple(self._resources.values())

    @overload
    def resource(
        self, fn: Callable[[], AsyncIterator[T]], /, *, name: str | None = None
    ) -> Resource[T]: ...
    @overload
    def resource(
        self, fn: Callable[[Resources], AsyncIterator[T]], /, *, name: str | None = None
    ) -> Resource[T]: ...
    @overload
    def resource(
        self,
        fn: Callable[[], contextlib.AbstractAsyncContextManager[T]],
        /,
        *,
        name: str | None = None,
    ) -> Resource[T]: ...
    @overload
    def resource(
        self,
        fn: Callable[[Resources], contextlib.AbstractAsyncContextManager[T]],
        /,
        *,
        name: str | None = None,
    ) -> Resource[T]: ...

    def resource(self, fn: Callable[..., Any], /, *, name: str | None = None) -> Resource[Any]:
        """Register a resource every worker of this app opens at start and closes at
        shutdown (a database pool, an HTTP client); returns its typed handle.

        ``fn`` is an async generator that yields the value (code after the ``yield``
        closes it) or a function returning an async context manager
        (``@contextlib.asynccontextmanager``). Handlers read the value with
        ``ctx.get(handle)``. Workers open resources in registration order, before they
        claim jobs, and close them in reverse order once in-flight jobs have settled.
        ``fn`` may take one parameter, the :class:`~typedq.resources.Resources` opened
        before it, to build on them: ``async def repo(opened: Resources)`` reads
        ``opened.get(db)``.

        An async context manager class works as it is: ``app.resource(httpx.AsyncClient)``.

        :param name: the resource's name in logs and errors (default: ``fn.__name__``);
            ``app.resource(partial(Client, base_url=...), name="billing_api")``
        :raises ConfigError: ``fn`` takes other parameters, returns instead of yielding,
            or its name is taken
        """
        default = check_factory(fn)
        if name == "":
            raise ConfigError("a resource name must not be empty")
        name = name or default
        if name in self._resources:
            raise ConfigError(
                f"app {self.name!r} already has a resource named {name!r}; rename the "
                "function or pass app.resource(fn, name=...)"
            )
        handle: Resource[Any] = Resource(fn, name=name, app=self.name)
        self._resources[name] = handle
        return handle

    # -- schedules -------------------------------------------------------------------

    @property
    def schedules(self) -> Mapping[str, Schedule[Any]]:
        """The declared schedules by name."""
        return dict(self._schedules)

    def schedule(
        self, task: Task[TIn, Any], payload: TIn, **options: Unpack[ScheduleOptions]
    ) -> Schedule[TIn]:
        """Enqueue ``task`` with ``payload`` on every tick of a cron expression or interval.

        ``app.schedule(send_digest, Digest(kind="daily"), cron="0 8 * * *")`` or
        ``app.schedule(poll_feeds, PollFeeds(), every=30)``. Workers of this app run the
        schedules; each tick is enqueued exactly once however many workers run, by the
        broker's clock. The handler reads its tick from ``ctx.scheduled_for``. See
        docs/schedules.md.

        :param task: a task of this app
        :param payload: the input each tick enqueues (the task's input model)
        :param cron: a five-field cron expression (minute hour day month weekday)
        :param every: an interval (seconds or timedelta); ticks are multiples of it since
            the Unix epoch
        :param name: the schedule's identity (default ``<task>.every-<n>s`` or
            ``<task>.cron-<hash>``); renaming a schedule starts it afresh
        :param tz: the time zone of the cron expression (IANA name or ZoneInfo; default UTC)
        :param missed: ticks missed while no worker ran (later than ``grace``): ``"skip"``
            them, fire the newest ``"once"``, or an int N: fire the newest N
        :param grace: seconds after its time within which a tick is on time (default:
            the interval, at most 60 s; 60 s for cron)
        :param max_lateness: never fire a tick later than this after its time (it is
            skipped and counted); None: no bound
        :param overlap: while the previous tick's job is unfinished: ``"allow"`` firing,
            ``"skip"`` the tick, or ``"queue"`` it until that job finishes
        :raises ConfigError: both or neither of ``cron``/``every``, an invalid cron
            expression, ``every <= 0``, a payload of another model, a task of another
            app, or a name already taken
        """
        if task._owner is not self:
            raise ConfigError(
                f"schedule of task {task.name!r}: the task belongs to another app; schedule "
                f"it on that app, or register it with @{self.name}.task"
            )
        sched: Schedule[TIn] = Schedule(task, payload, **options)
        if sched.name in self._schedules:
            raise ConfigError(
                f"app {self.name!r} already has a schedule named {sched.name!r}; pass "
                "app.schedule(..., name='<another name>') to declare a second one"
            )
        self._schedules[sched.name] = sched
        return sched

    def _requirements(self) -> dict[type[Any], str]:
        """The broker capabilities this app's declarations need, checked at connect:
        schedules, task limits (its workers' claims enforce them) and event streams."""
        needs: dict[type[Any], str] = {}
        if self._schedules:
            needs[Schedules] = f"schedules {', '.join(sorted(self._schedules))}"
        limited = sorted(
            name
            for name, task in self._tasks.items()
            if task.rate_limit is not None or task.concurrency is not None
        )
        if limited:
            needs[Limits] = f"rate_limit/concurrency of tasks {', '.join(limited)}"
        if self.event_streams:
            needs[EventStreams] = "App(event_streams=True)"
        controlled = sorted(n for n, t in self._tasks.items() if t.flow_control is not None)
        if controlled:
            needs[FlowControl] = f"unique_for/debounce of tasks {', '.join(controlled)}"
        if self._durables:
            needs[Runs] = f"durable functions {', '.join(sorted(self._durables))}"
        emitting = sorted(name for name, task in self._tasks.items() if task.emits is not None)
        if emitting:
            needs[JobStreams] = f"emits= of tasks {', '.join(emitting)}"
        return needs

    def _schema_sources(self) -> list[tuple[str, Codec[Any], Codec[Any]]]:
        """The tasks, then each durable function's run input and result as
        ``run:<name>`` (runs keep their input's fingerprint: ``typedq verify``)."""
        durables = [
            (f"{RUN_SCHEMA_PREFIX}{d.name}", d.input, d.output) for d in self._durables.values()
        ]
        return super()._schema_sources() + durables

    # -- workers -------------------------------------------------------------------

    def worker(
        self,
        *,
        concurrency: int = 16,
        prefetch: int = 0,
        queues: list[str] | None = None,
        grace: float = 10.0,
        allow_unknown_queues: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> Worker[Any, Any]:
        """A worker for every task of this app (an async context manager).

        :param concurrency: how many jobs run at once (claimed only for free slots)
        :param prefetch: jobs held beyond ``concurrency`` (claimed ahead, or being recorded
            while the next runs; see :class:`~typedq.worker.Worker`); 0: none
        :param queues: which queues to take jobs from (default: every queue of the app)
        :param grace: seconds in-flight jobs may finish at shutdown before being cancelled
        :param allow_unknown_queues: take jobs from ``queues`` no task of this app uses
            (else such a queue, a typo as a rule, is a ConfigError)
        :param clock: what the worker reads time from and sleeps on (a
            :class:`~typedq.clock.VirtualClock` in tests)
        """
        return Worker(
            self,
            concurrency=concurrency,
            prefetch=prefetch,
            queues=queues,
            grace=grace,
            allow_unknown_queues=allow_unknown_queues,
            clock=clock,
        )
