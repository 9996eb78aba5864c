"""The worker runtime: claim for free slots, run handlers under leases, settle outcomes.

A :class:`Worker` is made of parts, each a module of this package:

- :mod:`.jobs`: the table of running jobs (slots, threads that outlive their attempt)
  and the shutdown :class:`~.jobs.Phase` every part reads;
- :mod:`.claimer`: the claim loop, which asks the broker for at most as many jobs as
  there are free slots (capacity first, then claim), so a claimed job starts at once;
- :mod:`.runner`: ``concurrency`` long-lived runners that take claimed jobs off the
  table and run each in a context and cancel scope of its own;
- :mod:`.leases`: lease renewal (every third of the lease, every running job in one
  call), the reaper of stalled jobs, and the cancel listener;
- :mod:`.heartbeat`: the worker's entry in the broker's worker registry;
- :mod:`.shutdown`: the four bounded phases of a graceful shutdown.

Outcomes are settled through batchers (:mod:`typedq.settling`), re-sent until the
broker answers; the job keeps its slot and its lease meanwhile (backpressure). Sync
handlers run in threads, which cannot be killed: a thread that outlives its attempt
(timeout, lost lease) keeps its slot until it returns, and its late result is discarded.

Shutdown (leaving ``async with``, ``stop()``, or cancelling ``run``) stops claiming,
lets in-flight jobs finish within ``grace`` seconds, then cancels them: async handlers
are handed back to the queue unspent; sync handlers' threads are waited for (their
leases still renewed) for at most one more lease, settled with their real outcome if
they return, and otherwise abandoned: logged, and back in the queue once their lease
expires. ``stop(force=True)`` skips both waits. The internals run in a shielded scope
so that the caller's cancellation starts this bounded path instead of tearing handlers
down mid-write.

Every time a worker reads and every sleep it takes go through its :class:`~typedq.clock.Clock`
(``Worker(..., clock=...)``): the system clock, or a virtual clock in tests.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, overload

import anyio
from anyio.abc import TaskGroup, TaskStatus

from ..broker.base import Broker, ClaimedJob, WorkerInfo
from ..clock import SYSTEM_CLOCK, Clock
from ..errors import ConfigError
from ..execution import Executor
from ..limits import LimitSpec
from ..observe import Observers, WorkerObserver
from ..resources import Resource, open_resources
from ..schedule import Scheduler
from ..settling import Settler
from ..task import Registry, Task, TIn, TOut
from .claimer import Claimer
from .heartbeat import Heartbeat
from .jobs import Phase, RunningJobs
from .leases import LeaseKeeper
from .runner import JobRunner
from .shutdown import Shutdown
from .stats import WorkerStats
from .target import WorkerScope

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("typedq.worker")

T = TypeVar("T")


class Worker(Generic[TIn, TOut]):
    """Runs jobs: ``async with Worker(send_invoice, concurrency=8): ...``.

    ``Worker(task)`` runs one task and is typed by it (``Worker[SendInvoice, Receipt]``);
    ``Worker(app)`` (what ``app.worker()`` returns) runs every task of an app. Leaving the
    block, ``stop()``, or cancelling ``run()`` is a graceful shutdown.

    :param target: the task to run, or the app whose tasks to run (a producer stub is
        refused: a worker needs the handler)
    :param concurrency: how many jobs run at once
    :param prefetch: how many jobs the worker may hold beyond ``concurrency``: claimed
        ahead to start the moment a handler returns, or finished and being recorded while
        the next one runs (default 0: a job waits in the broker until a slot is free, so
        an idle worker of the group can take it). Raises throughput when handlers are
        short (the broker's round trip overlaps the next handler); a prefetched job
        waits behind the running ones, so keep it 0 for long jobs
    :param queues: with an app, the queues to take jobs from (default: every queue of it);
        one no task of the app uses is a ConfigError (a typo would run nothing, quietly)
    :param allow_unknown_queues: take jobs from such queues anyway
    :param grace: seconds in-flight jobs may finish at shutdown before being cancelled
        and handed back (sync handlers, which cannot be cancelled, get at most one lease
        more before they are abandoned)
    :param clock: what the worker reads time from and sleeps on (a
        :class:`~typedq.clock.VirtualClock` in tests)
    """

    @overload
    def __init__(
        self,
        target: Task[TIn, TOut],
        /,
        *,
        concurrency: int = 16,
        prefetch: int = 0,
        grace: float = 10.0,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None: ...
    @overload
    def __init__(
        self: Worker[Any, Any],
        target: Registry,
        /,
        *,
        concurrency: int = 16,
        prefetch: int = 0,
        queues: Sequence[str] | None = None,
        grace: float = 10.0,
        allow_unknown_queues: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None: ...

    def __init__(
        self,
        target: Task[TIn, TOut] | Registry,
        /,
        *,
        concurrency: int = 16,
        prefetch: int = 0,
        queues: Sequence[str] | None = None,
        grace: float = 10.0,
        allow_unknown_queues: bool = False,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        scope = WorkerScope.of(target, queues, allow_unknown_queues=allow_unknown_queues)
        app = scope.app
        self._scope = scope
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if prefetch < 0:
            raise ConfigError(f"prefetch must be >= 0, got {prefetch}")
        if grace < 0:
            raise ConfigError(f"grace must be >= 0, got {grace}")
        self.app: Registry = app
        self.tasks = scope.tasks
        self.queues = scope.queues
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.grace = grace
        self.lease = app.lease
        self.clock = clock
        self.id = f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}"
        self.stats = WorkerStats()
        #: Told what this worker does (``observe``); None: nobody listens.
        self._observer: Observers | None = None
        #: Test doubles standing in for resources (``provide``): not opened.
        self._provided: dict[Resource[Any], Any] = {}
        self._started = False
        # The parts (see the module's docstring); none touches the event loop until run.
        broker = self._broker
        self._phase = Phase()
        # The table's slots: the running jobs and the prefetched ones.
        self._jobs = jobs = RunningJobs(
            concurrency + prefetch, worker_id=self.id, stats=self.stats, phase=self._phase
        )
        self._settler = Settler(
            broker,
            worker_id=self.id,
            queues=self.queues,
            lease=self.lease,
            stats=self.stats,
            stopping=self._is_stopping,
            start=jobs.start,
            # Outcomes are settled by the runners (or, with prefetch, for them): at most
            # one per slot at once.
            concurrency=concurrency + prefetch,
            clock=clock,
        )
        self._runner = JobRunner(
            worker_id=self.id,
            jobs=jobs,
            executor=Executor(
                self.tasks,
                worker_id=self.id,
                threads=anyio.CapacityLimiter(concurrency),
                progress=self._report_progress,
                thread_exited=jobs.thread_exited,
                clock=clock,
                broker=broker,
            ),
            settler=self._settler,
            stats=self.stats,
            tracing=app.client.tracing,  # the app's OpenTelemetry tracing; None: off
            clock=clock,
        )
        self._runner.after_step = app.step_hook
        self._claimer = Claimer(
            broker,
            worker_id=self.id,
            queues=self.queues,
            lease=self.lease,
            jobs=jobs,
            phase=self._phase,
            clock=clock,
        )
        self._leases = LeaseKeeper(
            broker, worker_id=self.id, lease=self.lease, jobs=jobs, clock=clock
        )
        self._heartbeat = Heartbeat(
            broker,
            worker_id=self.id,
            queues=self.queues,
            concurrency=concurrency,
            jobs=jobs,
            clock=clock,
        )
        self._shutdown = Shutdown(
            worker_id=self.id,
            lease=self.lease,
            jobs=jobs,
            phase=self._phase,
            claimer=self._claimer,
            settler=self._settler,
            stats=self.stats,
            clock=clock,
        )
        # What needs a running event loop is made by run() and __aenter__.
        self._stop: anyio.Event | None = None
        #: Cancelled by stop(): a resource hanging while it opens must not hang the worker.
        self._opening: anyio.CancelScope | None = None
        #: The shielded scope of the worker's own tasks: cancelled when shutdown is done.
        self._serve_scope: anyio.CancelScope | None = None
        #: The task group of ``async with worker``.
        self._outer_tg: TaskGroup | None = None
        #: The scheduler's scope (typedq.schedule): shutdown cancels it first.
        self._scheduler_scope: anyio.CancelScope | None = None

    def __repr__(self) -> str:
        return f"Worker(id={self.id!r}, tasks={sorted(self.tasks)}, concurrency={self.concurrency})"

    def _broker(self) -> Broker:
        # Read at each use: a test may swap an app's broker.
        return self.app.broker

    def _is_stopping(self) -> bool:
        return self._phase.stopping

    @property
    def renew_interval(self) -> float:
        """Seconds between lease renewals (a third of the lease)."""
        return self._leases.renew_interval

    @property
    def reaper_interval(self) -> float:
        """Seconds between recoveries of stalled jobs (half a lease, at most 5)."""
        return self._leases.reaper_interval

    @property
    def heartbeat(self) -> float:
        """Seconds between heartbeats into the broker's worker registry; the entry
        expires after three missed ones. Set it before the worker starts."""
        return self._heartbeat.interval

    @heartbeat.setter
    def heartbeat(self, seconds: float) -> None:
        self._heartbeat.interval = seconds

    @property
    def started_at(self) -> float:
        """When the worker started (epoch seconds; 0 until it does)."""
        return self._heartbeat.started_at

    @property
    def running(self) -> int:
        """How many jobs run right now (including those whose outcome is being recorded)."""
        return len(self._jobs.running)

    @property
    def busy_threads(self) -> int:
        """Handler threads still running for attempts that already ended (timed out,
        lease lost): each keeps a slot taken until it returns."""
        return len(self._jobs.orphans)

    @property
    def free_slots(self) -> int:
        """``concurrency`` minus running jobs minus threads of ended attempts."""
        return self._jobs.free_slots

    def in_flight(self) -> list[tuple[str, str]]:
        """``(job id, task name)`` of each job this worker still holds: running, or its
        outcome not yet recorded (what a shutdown waits for)."""
        return self._jobs.in_flight()

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._outer_tg = tg
        try:
            await tg.start(self.run)
        except BaseException as exc:
            if isinstance(exc, Exception):
                # The worker could not start (a resource failed to open, say): raise its
                # error as it is, not wrapped in the task group's exception group.
                await tg.__aexit__(None, None, None)
            else:
                await tg.__aexit__(type(exc), exc, exc.__traceback__)
            self._outer_tg = None
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        self.stop()
        tg, self._outer_tg = self._outer_tg, None
        assert tg is not None
        if isinstance(exc, Exception):
            # The block's own error: shut down gracefully, then let it propagate as it
            # is (handed to the task group, it would come out wrapped in a group).
            await tg.__aexit__(None, None, None)
            return None
        return await tg.__aexit__(exc_type, exc, tb)

    def provide(self, resource: Resource[T], value: T) -> Self:
        """Use ``value`` for ``resource`` instead of opening it (a test double); call it
        before the worker starts. ``typedq.testing.run_worker(resources=...)`` calls it.
        """
        if self._started:
            raise RuntimeError("provide() must be called before the worker starts")
        self._provided[resource] = value
        return self

    def stop(self, *, force: bool = False) -> None:
        """Ask for a graceful shutdown; ``run`` returns when it is done.

        :param force: do not wait: cancel running jobs now and hand them back to the
            queue; sync handlers' threads are abandoned at once (their jobs come back
            when their leases expire)
        """
        if self._stop is not None:
            self._stop.set()
        if self._opening is not None:
            self._opening.cancel()  # only while opening resources: entered nowhere else
        if force:
            self.grace = 0.0
            self._shutdown.force()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()`` or cancellation, then shut down gracefully."""
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True
        self._heartbeat.started_at = self.clock.time()
        # The broker enforces the tasks' limits inside every claim (typedq.limits).
        limits = {
            name: spec
            for name, task in self.tasks.items()
            if (spec := LimitSpec.of(task.rate_limit, task.concurrency)) is not None
        }
        if limits:
            self.app.broker.set_limits(limits)
        self._stop = anyio.Event()
        self._opening = anyio.CancelScope()
        # Resources open after the broker connects and before any claim; they close
        # after the shutdown (in-flight jobs settled) and before the broker disconnects.
        # Jobs find them through the context their tasks inherit from here.
        async with (
            self.app.client,
            self.app.client.serving(),
            open_resources(
                self.app.resources, self._provided, where=f"worker {self.id}", abort=self._opening
            ),
            anyio.create_task_group() as outer,
        ):
            if getattr(self.app, "event_streams", False):
                # Before any claim: every job this worker finishes has its event.
                for queue in self.queues:
                    await self.app.broker.enable_events(queue)
            await outer.start(self._serve)
            log.info(
                "worker %s started: tasks=%s queues=%s concurrency=%d",
                self.id,
                sorted(self.tasks),
                self.queues,
                self.concurrency,
            )
            if self._observer is not None:
                self._observer.worker_started(self)
            task_status.started()
            try:
                await self._stop.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._stop_parts()
                if self._observer is not None:
                    self._observer.worker_stopped(self)

    async def _serve(self, *, task_status: TaskStatus[None]) -> None:
        # Shielded once started: only _stop_parts ends it, after the graceful shutdown.
        # Not before: a worker cancelled while it starts (run()'s start of this task is
        # cancelled, and waits for this task to end) must stop here, not serve forever.
        with anyio.CancelScope() as scope:
            self._serve_scope = scope
            async with anyio.create_task_group() as tg:
                await tg.start(self._settler.run)
                if self.prefetch:
                    self._runner.behind = tg
                for _ in range(self.concurrency):
                    tg.start_soon(self._runner.run)
                tg.start_soon(self._claimer.run)
                tg.start_soon(self._leases.renew_loop)
                tg.start_soon(self._leases.reaper_loop)
                tg.start_soon(self._leases.cancel_loop)
                tg.start_soon(self._heartbeat.run)
                if self._scope.schedules:
                    tg.start_soon(self._run_scheduler)
                task_status.started()
                scope.shield = True  # (no await between: the parts have not run yet)

    async def _stop_parts(self) -> None:
        """Shut down: the scheduler first, then the phases of :mod:`.shutdown`, then the
        worker's own tasks (leases are renewed until the very end)."""
        if self._scheduler_scope is not None:
            self._scheduler_scope.cancel()
        await self._shutdown.run(self.grace)
        assert self._serve_scope is not None
        self._serve_scope.cancel()
        log.info("worker %s stopped: %s", self.id, self.stats)

    async def _run_scheduler(self) -> None:
        """Fire this worker's schedules until shutdown (every worker may; each tick is
        enqueued once however many do)."""
        with anyio.CancelScope() as self._scheduler_scope:
            if self._phase.stopping:
                self._scheduler_scope.cancel()
            await Scheduler(
                self.app.broker,
                self._scope.schedules,
                prune=self._scope.prune_schedules,
                worker_id=self.id,
                clock=self.clock,
            ).run()

    async def _report_progress(self, claimed: ClaimedJob, data: bytes) -> None:
        await self.app.broker.set_progress(claimed.message.id, claimed.token, data)

    # -- observers and the worker registry ---------------------------------------------

    def observe(self, observer: WorkerObserver) -> Self:
        """Tell ``observer`` what this worker does (see :mod:`typedq.observe`); call it
        before the worker starts. :meth:`typedq.metrics.Metrics.attach` calls it."""
        if self._started:
            raise RuntimeError("observe() must be called before the worker starts")
        if self._observer is None:
            self._observer = observers = Observers()
            self._settler.observer = observers
            self._runner.observer = observers
            self._claimer.observer = observers
            self._leases.observer = observers
            self._heartbeat.observer = observers
        self._observer.observers.append(observer)
        return self

    def info(self) -> WorkerInfo:
        """This worker as the broker's worker registry lists it."""
        return self._heartbeat.info()
