"""The worker runtime: claim for free slots, run handlers under leases, settle outcomes.

Lifecycle of a job in a worker:

1. The claim loop asks the broker for at most as many jobs as there are free slots
   (capacity first, then claim), so a claimed job starts at once.
2. ``concurrency`` long-lived runner tasks take claimed jobs off an in-memory queue
   (no task spawned per job). Each job runs in a fresh copy of the runner's contextvars
   context (:func:`typedq.execution.run_in_context`), as if it had a task of its own, and
   its handler in its own cancel scope (whose deadline is the job's timeout), so
   cancelling one job stops only that job's handler.
3. The lease loop renews every running job's lease in one call, every third of the
   lease. A lease reported lost cancels the handler and its result is never written;
   a cancel request (``job.cancel()``) cancels it and records ``cancelled``.
4. Outcomes are settled through batchers (:mod:`typedq.settling`): many completions
   become one broker call.

Sync handlers run in threads, which cannot be killed. Their lease is renewed for as
long as any code of the attempt can still run (only a lease the broker reports lost
stops renewal). A timeout ends the attempt (recorded as ``timeout``) while the thread
runs on; its slot stays taken until the thread really returns, and its late result is
discarded. Free slots are ``concurrency`` minus running attempts minus such threads.

Outcomes are re-sent until the broker answers (transitions are idempotent per token),
with a capped backoff; the job keeps its slot and its lease meanwhile, so an outage
applies backpressure instead of re-running finished jobs.

Shutdown (leaving ``async with``, ``stop()``, or cancelling ``run``) stops claiming,
lets in-flight jobs finish within ``grace`` seconds, then cancels them: async handlers
are handed back to the queue unspent; sync handlers' threads are waited for (their
leases still renewed) for at most one more lease, settled with their real outcome if
they return, and otherwise abandoned: logged, and back in the queue once their lease
expires. ``stop(force=True)`` skips both waits. The internals run in a shielded scope
so that the caller's cancellation starts this bounded path instead of tearing handlers
down mid-write.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import os
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, overload

import anyio
import anyio.lowlevel
import anyio.to_thread
from anyio.abc import TaskGroup, TaskStatus

from .broker.base import ClaimedJob, LeaseStatus, Release, WorkerInfo, new_claim_id
from .errors import BrokerUnavailable, ConfigError, FailureRecord, Unsupported
from .execution import Executor, Running, run_in_context
from .limits import LimitSpec
from .logs import job_fields
from .observe import Observers, WorkerObserver, outcome_of
from .outcomes import Complete, Fail, Outcome, describe, minimal_failure
from .resources import Resource, open_resources
from .schedule import Schedule, Scheduler
from .settling import GaveUp, QueueRotation, Settler
from .task import Registry, Task, TaskBase, TIn, TOut, check_queues, expand_queues

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("typedq.worker")

T = TypeVar("T")

#: After giving up on threads and outcomes at shutdown, how long the last broker calls
#: in flight (hand-backs, a final re-send) may take before the worker stops regardless.
_FINAL_WAIT = 5.0


@dataclass
class WorkerStats:
    """Counters of what a worker did (also the source of its metrics)."""

    claimed: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    released: int = 0
    lease_lost: int = 0
    #: Finishes the broker refused because the lease was no longer ours.
    finish_rejected: int = 0
    #: Attempts that ended (timeout, lost lease, shutdown) while their sync handler's
    #: thread still ran; each kept a slot taken until the thread returned.
    orphaned_threads: int = 0
    #: Jobs left at shutdown with their handler thread still running (back by lease expiry).
    abandoned: int = 0
    #: Outcomes shutdown stopped re-sending because the broker did not take them.
    settles_given_up: int = 0
    #: Jobs whose producer's schema fingerprint differed but whose payload validated.
    fingerprint_mismatches: Counter[tuple[str, str]] = field(default_factory=Counter)


class Worker(Generic[TIn, TOut]):
    """Runs jobs: ``async with Worker(send_invoice, concurrency=8): ...``.

    ``Worker(task)`` runs one task and is typed by it (``Worker[SendInvoice, Receipt]``);
    ``Worker(app)`` (what ``app.worker()`` returns) runs every task of an app. Leaving the
    block, ``stop()``, or cancelling ``run()`` is a graceful shutdown.

    :param target: the task to run, or the app whose tasks to run (a producer stub is
        refused: a worker needs the handler)
    :param concurrency: how many jobs run at once
    :param queues: with an app, the queues to take jobs from (default: every queue of it);
        one no task of the app uses is a ConfigError (a typo would run nothing, quietly)
    :param allow_unknown_queues: take jobs from such queues anyway
    :param grace: seconds in-flight jobs may finish at shutdown before being cancelled
        and handed back (sync handlers, which cannot be cancelled, get at most one lease
        more before they are abandoned)
    """

    _schedules: list[Schedule[Any]]
    _prune_schedules: bool

    @overload
    def __init__(
        self, target: Task[TIn, TOut], /, *, concurrency: int = 16, grace: float = 10.0
    ) -> None: ...
    @overload
    def __init__(
        self: Worker[Any, Any],
        target: Registry,
        /,
        *,
        concurrency: int = 16,
        queues: Sequence[str] | None = None,
        grace: float = 10.0,
        allow_unknown_queues: bool = False,
    ) -> None: ...

    def __init__(
        self,
        target: Task[TIn, TOut] | Registry,
        /,
        *,
        concurrency: int = 16,
        queues: Sequence[str] | None = None,
        grace: float = 10.0,
        allow_unknown_queues: bool = False,
    ) -> None:
        if isinstance(target, TaskBase) and not isinstance(target, Task):
            raise ConfigError(
                f"{target!r} is a producer stub: workers run tasks registered with @app.task"
            )
        if isinstance(queues, str):
            raise ConfigError(
                f"queues must be a list of queue names, got the string {queues!r}; "
                f"pass queues=[{queues!r}]"
            )
        if isinstance(target, Task):
            if queues is not None:
                raise ConfigError(
                    f"Worker({target.name}) runs the queue of its task ({target.queue!r}); "
                    "queues= is for a worker of a whole app: app.worker(queues=[...])"
                )
            task: Task[Any, Any] = target
            app = task.app
            # A worker fails jobs whose task it does not know, so it must not consume a
            # queue that also carries tasks it cannot run.
            others = sorted(
                t.name for t in app.tasks.values() if t.queue == task.queue and t.name != task.name
            )
            if others:
                raise ConfigError(
                    f"queue {task.queue!r} also carries tasks {others} that "
                    f"Worker({task.name}) cannot run; give {task.name!r} its own queue "
                    "(@app.task(queue=...)) or run them all with app.worker()"
                )
            tasks: dict[str, Task[Any, Any]] = {task.name: task}
            queues = task.queues
            # Only this task's schedules: the app's others are not this worker's to
            # reconcile (nor to prune).
            self._schedules = [s for s in app.schedules.values() if s.task is task]
            self._prune_schedules = False
        else:
            app = target
            if not app.tasks:
                raise ConfigError(f"app {app.name!r} has no tasks: register some with @app.task")
            tasks = dict(app.tasks)
            if queues and not allow_unknown_queues:
                check_queues(
                    app.tasks.values(), queues, app=app.name, insist="allow_unknown_queues=True"
                )
            queues = expand_queues(app.tasks.values(), queues) if queues else app.queues
            self._schedules = list(app.schedules.values())
            self._prune_schedules = True
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if grace < 0:
            raise ConfigError(f"grace must be >= 0, got {grace}")
        self.app: Registry = app
        self.tasks = tasks
        self.queues = list(queues)
        self.concurrency = concurrency
        self.grace = grace
        self.lease = app.lease
        self.renew_interval = app.lease / 3
        self.reaper_interval = min(app.lease / 2, 5.0)
        self.id = f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}"
        self.stats = WorkerStats()
        #: Told what this worker does (``observe``); None: nobody listens.
        self._observer: Observers | None = None
        #: The app's OpenTelemetry tracing (typedq.tracing); None: off.
        self._tracing = app.client.tracing
        #: Seconds between heartbeats into the broker's worker registry; the entry
        #: expires after three missed ones.
        self.heartbeat = 10.0
        self.started_at = 0.0
        #: Test doubles standing in for resources (``provide``): not opened.
        self._provided: dict[Resource[Any], Any] = {}
        #: Cancelled by stop(): a resource hanging while it opens must not hang the worker.
        #: Made by run(): a cancel scope needs a running event loop, a constructor does not.
        self._opening: anyio.CancelScope | None = None
        #: Running jobs by claim token (one job id may briefly have two claims: a retry
        #: claimed again before the previous attempt finished cleaning up).
        self._running: dict[str, Running] = {}
        #: The attempts in _running by job id (normally one; more when a lease was lost
        #: and the broker handed the job back to this worker).
        self._by_job: dict[str, list[Running]] = {}
        #: Attempts already settled whose handler thread still runs (timed out, lease
        #: lost): each holds a slot until its thread returns.
        self._orphans: dict[str, Running] = {}
        self._renewed_at = time.monotonic()
        # A renewal failed and none has succeeded since (its failures are told once).
        self._renew_failing = False
        self._stopping = False
        self._cancelling = False
        self._force_stop = False
        self._started = False
        self._stop: anyio.Event | None = None
        #: Set when a job leaves _running or a thread returns, made only while someone
        #: waits for that (the claim loop for a free slot, shutdown for no jobs left):
        #: a finishing job then costs nothing when nobody waits.
        self._changed: anyio.Event | None = None
        #: Claimed jobs on their way to the runners. Never longer than a few: at most
        #: `concurrency` jobs run, and a refill claims only for slots its completions
        #: free (their runners take the new jobs next).
        self._queued: deque[tuple[ClaimedJob, Running]] = deque()
        #: What wakes each runner waiting for a job (a plain deque and events: an anyio
        #: memory stream costs several times more per blocked receive).
        self._idle: list[anyio.Event | asyncio.Future[None]] = []
        self._claim_done: anyio.Event | None = None
        self._phase_scope: anyio.CancelScope | None = None
        self._wait_scope: anyio.CancelScope | None = None
        self._serve_scope: anyio.CancelScope | None = None
        self._tg: TaskGroup | None = None
        self._outer_tg: TaskGroup | None = None
        #: The scheduler's scope (typedq.schedule): shutdown cancels it first. Made where
        #: the scheduler runs (a cancel scope needs a running event loop).
        self._scheduler_scope: anyio.CancelScope | None = None
        self._executor = Executor(
            tasks,
            worker_id=self.id,
            threads=anyio.CapacityLimiter(concurrency),
            progress=self._report_progress,
            thread_exited=self._thread_exited,
        )
        self._settler = Settler(
            lambda: self.app.broker,
            worker_id=self.id,
            queues=self.queues,
            lease=self.lease,
            stats=self.stats,
            stopping=lambda: self._stopping,
            start=self._start,
            # Outcomes are settled by the runners only: at most `concurrency` at once.
            concurrency=concurrency,
        )

    def __repr__(self) -> str:
        return f"Worker(id={self.id!r}, tasks={sorted(self.tasks)}, concurrency={self.concurrency})"

    @property
    def running(self) -> int:
        """How many jobs run right now (including those whose outcome is being recorded)."""
        return len(self._running)

    @property
    def busy_threads(self) -> int:
        """Handler threads still running for attempts that already ended (timed out,
        lease lost): each keeps a slot taken until it returns."""
        return len(self._orphans)

    @property
    def free_slots(self) -> int:
        """``concurrency`` minus running jobs minus threads of ended attempts."""
        return self.concurrency - len(self._running) - len(self._orphans)

    def in_flight(self) -> list[tuple[str, str]]:
        """``(job id, task name)`` of each job this worker still holds: running, or its
        outcome not yet recorded (what a shutdown waits for)."""
        return [(r.claimed.message.id, r.claimed.message.task) for r in self._running.values()]

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
            self._force_stop = True
            if self._phase_scope is not None:
                self._phase_scope.cancel()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()`` or cancellation, then shut down gracefully."""
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True
        self.started_at = time.time()
        # The broker enforces the tasks' limits inside every claim (typedq.limits).
        limits = {
            name: spec
            for name, task in self.tasks.items()
            if (spec := LimitSpec.of(task.rate_limit, task.concurrency)) is not None
        }
        if limits:
            self.app.broker.set_limits(limits)
        self._stop = anyio.Event()
        self._claim_done = anyio.Event()
        self._opening = anyio.CancelScope()
        # Resources open after the broker connects and before any claim; they close
        # after _shutdown (in-flight jobs settled) and before the broker disconnects.
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
                    await self._shutdown()
                if self._observer is not None:
                    self._observer.worker_stopped(self)

    async def _serve(self, *, task_status: TaskStatus[None]) -> None:
        with anyio.CancelScope(shield=True) as scope:
            self._serve_scope = scope
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self._settler.run)
                for _ in range(self.concurrency):
                    tg.start_soon(self._runner)
                tg.start_soon(self._claim_loop)
                tg.start_soon(self._lease_loop)
                tg.start_soon(self._reaper_loop)
                tg.start_soon(self._cancel_loop)
                tg.start_soon(self._heartbeat_loop)
                if self._schedules:
                    tg.start_soon(self._run_scheduler)
                task_status.started()

    async def _shutdown(self) -> None:
        assert self._claim_done is not None
        self._stopping = True
        if self._scheduler_scope is not None:
            self._scheduler_scope.cancel()
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        # 1. Grace: in-flight jobs may finish.
        with anyio.CancelScope() as self._phase_scope:
            if self._force_stop:
                self._phase_scope.cancel()
            with anyio.move_on_after(self.grace):
                await self._claim_done.wait()
                await self._until(lambda: not self._running)
        # 2. Cancel: async handlers stop and are handed back; sync handlers' threads
        # cannot be stopped, so their attempts wait for them, leases still renewed.
        self._cancelling = True
        if self._running:
            log.info("worker %s: grace over, cancelling %d jobs", self.id, len(self._running))
            for running in list(self._running.values()):
                running.cancel("shutdown")
        # 3. A bounded extra wait for those threads and for outcomes the broker has not
        # taken yet (an outage). Threads of attempts that already ended hold no job: they
        # are not waited for (their results are discarded anyway).
        with anyio.CancelScope() as self._phase_scope:
            if self._force_stop:
                self._phase_scope.cancel()
            with anyio.move_on_after(self.lease):
                await self._until(lambda: not self._running)
        # 4. Give up on the rest: no more waiting for threads, no more re-sends.
        self._settler.give_up()
        for running in list(self._running.values()):
            running.abandon()
        with anyio.move_on_after(_FINAL_WAIT):
            await self._until(lambda: not self._running)
        for running in self._running.values():
            log.warning(
                "worker %s: stopped without settling job %s (%s) attempt %d; it comes back "
                "when its lease expires (within %.0fs)",
                self.id,
                running.claimed.message.id,
                running.claimed.message.task,
                running.claimed.attempt,
                self.lease,
                extra=job_fields(running.claimed, self.id),
            )
        if self._orphans:
            log.warning(
                "worker %s: %d handler threads of ended attempts are still running (%s); "
                "they cannot be stopped and their results will be discarded",
                self.id,
                len(self._orphans),
                ", ".join(
                    f"{r.claimed.message.id} ({r.claimed.message.task})"
                    for r in self._orphans.values()
                ),
            )
        assert self._serve_scope is not None
        self._serve_scope.cancel()
        log.info("worker %s stopped: %s", self.id, self.stats)

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._changed_event().wait()

    def _changed_event(self) -> anyio.Event:
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    def _notify(self) -> None:
        """Wake whoever waits for a change in running jobs, if it may be the one it
        waits for: a free slot (the claim loop) or any change while stopping."""
        changed = self._changed
        if changed is not None and (self._stopping or self.free_slots > 0):
            self._changed = None
            changed.set()

    # -- claiming --------------------------------------------------------------------

    async def _wait(self, seconds: float | None, *, for_jobs: bool = False) -> None:
        """Sleep, for a change in running jobs, or for new jobs; cut short by shutdown."""
        with anyio.CancelScope() as scope:
            self._wait_scope = scope
            if self._stopping:
                scope.cancel()
            if for_jobs:
                try:
                    await self.app.broker.wait_for_jobs(self.queues, seconds or 5.0)
                except Exception as exc:
                    # An outage must not end the worker: the next claim reports it.
                    log.debug("worker %s: waiting for jobs failed: %s", self.id, exc)
                    await anyio.sleep(min(seconds or 5.0, 1.0))
            elif seconds is not None:
                await anyio.sleep(seconds)
            elif self.free_slots <= 0:
                await self._changed_event().wait()
        self._wait_scope = None

    async def _claim_loop(self) -> None:
        assert self._claim_done is not None
        assert self._tg is not None
        broker = self.app.broker
        backoff = 0.0
        # A claim whose answer was lost (id, limit): it may have taken effect, so it is
        # re-sent with the same id, which returns the jobs its first copy claimed and
        # claims nothing more. A fresh claim instead would leave those jobs claimed and
        # unrun until their lease expired (a stall without a dead worker).
        pending: tuple[str, int, list[str]] | None = None
        # Each claim starts at the next queue (fair across queues and partitions).
        rotation = QueueRotation(self.queues)
        # When claims started failing because the broker was unreachable (None: they
        # do not), so the first claim answered afterwards can say the outage is over.
        outage_since: float | None = None
        try:
            while not self._stopping:
                if pending is None:
                    free = self.free_slots
                    if free <= 0:
                        await self._wait(None)
                        continue
                    pending = (new_claim_id(), free, rotation.next())
                claim_id, limit, queues = pending
                try:
                    jobs = await broker.claim(
                        queues, limit, worker_id=self.id, lease=self.lease, claim_id=claim_id
                    )
                except Exception as exc:
                    if self._observer is not None:
                        self._observer.broker_error("claim", exc)
                    # An outage is told once when it begins (its retries at DEBUG), and
                    # once when it ends; other errors each time.
                    report = log.warning
                    if not isinstance(exc, BrokerUnavailable):
                        pending = None  # the broker answered: nothing was claimed
                    elif outage_since is None:
                        outage_since = time.monotonic()
                    else:
                        report = log.debug
                    backoff = min(5.0, backoff * 2 or 0.05)
                    report("worker %s: claim failed (%s); retrying in %.2fs", self.id, exc, backoff)
                    await self._wait(backoff)
                    continue
                pending = None
                backoff = 0.0
                if outage_since is not None:
                    log.warning(
                        "worker %s: reconnected: the broker answers again after %.1fs; "
                        "claiming jobs",
                        self.id,
                        time.monotonic() - outage_since,
                    )
                    outage_since = None
                if not jobs:
                    await self._wait(5.0, for_jobs=True)
                    continue
                self._start(jobs)
                if len(jobs) < limit:
                    # The broker had no more due jobs when it answered: claiming again for
                    # the slots left would come back empty. Wait for work published since
                    # this claim was sent (or a scheduled job falling due) instead. The
                    # jobs just claimed start first (the checkpoint lets their runners,
                    # woken by _start, go before this loop sets up its wait).
                    await anyio.lowlevel.checkpoint()
                    await self._wait(5.0, for_jobs=True)
            if pending is not None:
                await self._hand_back_lost_claim(*pending)
        finally:
            self._claim_done.set()

    async def _hand_back_lost_claim(self, claim_id: str, limit: int, queues: list[str]) -> None:
        """At shutdown, a claim whose answer was lost may hold jobs: fetch them by
        re-sending it and hand them straight back (bounded; else they come back when
        their lease expires)."""
        broker = self.app.broker
        with anyio.move_on_after(min(self.lease, 5.0)):
            try:
                jobs = await broker.claim(
                    queues, limit, worker_id=self.id, lease=self.lease, claim_id=claim_id
                )
                if jobs:
                    await broker.release([Release(j.message.id, j.token) for j in jobs])
                    log.info(
                        "worker %s: handed back %d jobs of a claim whose answer was lost",
                        self.id,
                        len(jobs),
                    )
            except Exception as exc:
                log.warning(
                    "worker %s: could not hand back the jobs of a claim whose answer was lost "
                    "(%s); they come back when their lease expires",
                    self.id,
                    exc,
                )

    async def _run_scheduler(self) -> None:
        """Fire this worker's schedules until shutdown (every worker may; each tick is
        enqueued once however many do)."""
        with anyio.CancelScope() as self._scheduler_scope:
            if self._stopping:
                self._scheduler_scope.cancel()
            await Scheduler(
                self.app.broker, self._schedules, prune=self._prune_schedules, worker_id=self.id
            ).run()

    # -- leases, reaper, cancellation --------------------------------------------------

    def _start(self, jobs: Sequence[ClaimedJob]) -> None:
        """Hand newly claimed jobs to the runners."""
        self.stats.claimed += len(jobs)
        for claimed in jobs:
            # The broker handed us a job this worker still runs under an older claim:
            # that claim's lease was lost (the loop was blocked, say).
            job_id = claimed.message.id
            holders = self._by_job.get(job_id)
            if holders is None:
                holders = self._by_job[job_id] = []
            for stale in holders:
                stale.mark_lost()
            running = self._running[claimed.token] = Running(claimed)
            holders.append(running)
            if self._cancelling:
                # A claim that was in flight when shutdown cancelled the rest: hand back.
                running.cancel("shutdown")
            self._queued.append((claimed, running))
            while self._idle:
                wake = self._idle.pop()
                if not isinstance(wake, asyncio.Future):
                    wake.set()
                    break
                if not wake.done():  # done: its runner was cancelled (shutdown)
                    wake.set_result(None)
                    break

    def _holders(self, job_id: str) -> list[Running]:
        return list(self._by_job.get(job_id, ()))

    async def _lease_loop(self) -> None:
        while True:
            before = time.monotonic()
            await anyio.sleep(self.renew_interval)
            lag = time.monotonic() - before - self.renew_interval
            if lag > self.renew_interval:
                log.warning(
                    "worker %s: event loop blocked for %.1fs; lease renewals missed "
                    "(a handler blocks the loop: make it a sync `def` or await in it)",
                    self.id,
                    lag,
                )
            await self._renew()

    async def _renew(self) -> bool:
        """Renew the leases of every attempt whose code may still run or whose outcome is
        not recorded yet, in one call; act on lost leases and cancels.

        Only the broker saying a lease is lost stops its renewal: a cancelled or shut
        down attempt whose sync thread still runs keeps its lease, so nobody else starts
        the job meanwhile. Returns False when the broker could not be asked.
        """
        running = [r for r in self._running.values() if not r.lost]
        if not running:
            self._renewed_at = time.monotonic()
            return True
        sent = time.monotonic()
        try:
            statuses = await self.app.broker.renew(
                [(r.claimed.message.id, r.claimed.token) for r in running], self.lease
            )
        except Exception as exc:
            if self._observer is not None:
                self._observer.broker_error("renew", exc)
            # Once per outage (the claim loop tells when it ends); each time at DEBUG.
            (log.debug if self._renew_failing else log.warning)(
                "worker %s: lease renewal failed: %s", self.id, exc
            )
            self._renew_failing = True
            if time.monotonic() - self._renewed_at > self.lease:
                # Our leases may have expired by now and another worker may hold these
                # jobs: stop the async handlers (they can be stopped). Threads cannot be,
                # and outcomes waiting to be recorded are fenced by their token: those
                # keep trying, and keep asking for their leases.
                for holder in running:
                    if holder.in_handler:
                        holder.cancel("lease_lost")
            return False
        self._renewed_at = max(self._renewed_at, sent)
        self._renew_failing = False
        for holder, status in zip(running, statuses, strict=True):
            if status is LeaseStatus.LOST:
                holder.mark_lost()
            elif status is LeaseStatus.CANCEL_REQUESTED:
                holder.cancel("cancel")
        return True

    async def _reaper_loop(self) -> None:
        while True:
            # Renew our own leases first: after the loop was blocked, this worker must
            # not recover (and run a second time) jobs that it is itself still running.
            if not await self._renew():
                # Our own leases are not renewed: recovering now could take (and run a
                # second time) jobs this worker holds but could not renew in an outage.
                await anyio.sleep(self.reaper_interval)
                continue
            try:
                # Never our own running jobs, even if our renewal was late (the loop
                # was blocked, or this process not scheduled in time): recovering them
                # would run them a second time here. A live view, read when the call
                # is sent: a job claimed while this call waited (its handler may then
                # block the loop past its lease) is left alone too.
                recovered = await self.app.broker.recover_stalled(holding=self._by_job.keys())
            except Exception as exc:
                if self._observer is not None:
                    self._observer.broker_error("recover", exc)
                log.warning("worker %s: stalled-job recovery failed: %s", self.id, exc)
            else:
                if recovered and self._observer is not None:
                    self._observer.stalled_recovered(recovered)
                if recovered:
                    log.warning(
                        "worker %s: recovered %d jobs whose lease expired", self.id, recovered
                    )
            await anyio.sleep(self.reaper_interval)

    async def _cancel_loop(self) -> None:
        broker = self.app.broker
        while True:
            try:
                await broker.wait_cancel_requests(self.renew_interval)
                ids = {
                    r.claimed.message.id for r in self._running.values() if r.cancel_reason is None
                }
                if ids:
                    for job_id in await broker.cancel_requests(sorted(ids)):
                        for holder in self._holders(job_id):
                            holder.cancel("cancel")
            except Exception as exc:
                log.warning("worker %s: cancel listener failed: %s", self.id, exc)
                await anyio.sleep(self.renew_interval)

    # -- running one job ---------------------------------------------------------------

    async def _runner(self) -> None:
        """One of the worker's ``concurrency`` runners: runs claimed jobs one at a time,
        each in a fresh copy of this task's context, so what a job sets in contextvars
        (its span, a handler's own variables) is its own, as in a task of its own."""
        queued = self._queued
        idle = self._idle
        try:
            # On asyncio a bare future is the cheapest wake-up (an anyio event wraps an
            # asyncio.Event, which makes a future per wait anyway); anyio's cancel scopes
            # still cancel the wait, as they cancel any await of the task.
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # another backend (trio)
            loop = None
        # The event loop's own event class (anyio.Event() finds the backend each call).
        event = type(anyio.Event())
        while True:
            if not queued:
                if loop is not None:
                    future: asyncio.Future[None] = loop.create_future()
                    idle.append(future)
                    await future
                else:
                    wake = event()
                    idle.append(wake)
                    await wake.wait()
                continue
            claimed, running = queued.popleft()
            await run_in_context(contextvars.copy_context(), self._run_job(claimed, running))

    async def _run_job(self, claimed: ClaimedJob, running: Running) -> None:
        job_id, task = claimed.message.id, claimed.message.task
        observer = self._observer
        debug = log.isEnabledFor(logging.DEBUG)
        if observer is not None:
            observer.job_started(claimed)
        if debug:
            log.debug(
                "job %s (%s) attempt %d started",
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, self.id),
            )
        began = time.monotonic() if debug or observer is not None else 0.0
        # The job runs in a context of its own (_runner): its span stays current in it.
        traced = (
            self._tracing.process(claimed, own_context=True) if self._tracing is not None else None
        )
        try:
            try:
                attempt = await self._executor.attempt(claimed, running)
                if attempt.fingerprint_mismatch is not None:
                    self._count_mismatch(task, *attempt.fingerprint_mismatch)
                    if observer is not None:
                        observer.schema_mismatch(claimed)
                outcome: Outcome = attempt.outcome
            except BaseException as exc:
                if traced is not None:
                    traced.end(None)
                if not isinstance(exc, Exception):
                    raise
                log.exception(
                    "worker %s: job %s (%s) attempt %d: attempt failed",
                    self.id,
                    job_id,
                    task,
                    claimed.attempt,
                    extra=job_fields(claimed, self.id),
                )
                outcome = Fail(self._minimal(claimed, exc, "could not run this job"))
            else:
                if traced is not None:
                    span = traced.end(outcome)
                    if span and isinstance(outcome, Complete | Fail):
                        # A fan-out member's span: its callback's span links to it.
                        outcome = dataclasses.replace(outcome, span=span)
            ended = time.monotonic() if debug or observer is not None else 0.0
            try:
                await self._settler.settle(claimed, outcome)
            except GaveUp:
                raise
            except Exception as exc:
                if not isinstance(outcome, Complete | Fail) or self._settler.gave_up:
                    raise
                # Last resort: the job still gets a (minimal) failure record rather than
                # sitting claimed until its lease expires and counting as a stall.
                log.exception(
                    "worker %s: could not record the outcome of job %s (%s) attempt %d; "
                    "recording a minimal failure instead",
                    self.id,
                    job_id,
                    task,
                    claimed.attempt,
                    extra=job_fields(claimed, self.id),
                )
                outcome = Fail(self._minimal(claimed, exc, "could not record the outcome"))
                await self._settler.settle(claimed, outcome)
            if observer is not None or debug:
                how = outcome_of(outcome)
                if observer is not None:
                    observer.job_finished(claimed, how, ended - began)
                if debug:
                    log.debug(
                        "job %s (%s) attempt %d finished: %s in %.3fs",
                        job_id,
                        task,
                        claimed.attempt,
                        how.value,
                        ended - began,
                        extra=job_fields(claimed, self.id),
                    )
        except GaveUp:
            self.stats.settles_given_up += 1
            log.warning(
                "worker %s: shutdown gave up recording the outcome of job %s (%s) attempt %d; "
                "it comes back when its lease expires",
                self.id,
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, self.id),
            )
        except Exception:
            log.exception(
                "worker %s: job %s (%s) attempt %d could not be settled; it comes back when "
                "its lease expires",
                self.id,
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, self.id),
            )
        finally:
            del self._running[claimed.token]
            holders = self._by_job[job_id]
            holders.remove(running)
            if not holders:
                del self._by_job[job_id]
            if running.thread_alive:
                # The attempt is over but its thread is not: keep its slot taken.
                self._orphans[claimed.token] = running
                self.stats.orphaned_threads += 1
                log.warning(
                    "worker %s: job %s (%s) attempt %d: its attempt ended but its sync "
                    "handler's thread still runs (threads cannot be stopped); it holds a slot "
                    "until it returns, and its result will be discarded",
                    self.id,
                    job_id,
                    task,
                    claimed.attempt,
                    extra=job_fields(claimed, self.id),
                )
            self._notify()

    def _minimal(self, claimed: ClaimedJob, exc: BaseException, what: str) -> FailureRecord:
        return minimal_failure(
            claimed,
            worker_id=self.id,
            error_type="WorkerError",
            message=f"the worker {what}: {type(exc).__name__}: {describe(exc)}",
        )

    def _count_mismatch(self, task: str, producer: str, ours: str) -> None:
        key = (task, producer)
        if key not in self.stats.fingerprint_mismatches:
            log.warning(
                "task %r: a producer's schema fingerprint %s differs from the worker's %s; "
                "the payload validated, so it ran (regenerate the producer's stubs)",
                task,
                producer,
                ours,
            )
        self.stats.fingerprint_mismatches[key] += 1

    def _thread_exited(self, running: Running) -> None:
        """A handler thread returned (in the event loop): free its slot if it held one."""
        if self._orphans.pop(running.claimed.token, None) is not None:
            log.info(
                "worker %s: the thread of job %s (%s) attempt %d returned after its attempt "
                "ended; its result was discarded",
                self.id,
                running.claimed.message.id,
                running.claimed.message.task,
                running.claimed.attempt,
                extra=job_fields(running.claimed, self.id),
            )
        self._notify()

    async def _report_progress(self, claimed: ClaimedJob, data: bytes) -> None:
        await self.app.broker.set_progress(claimed.message.id, claimed.token, data)

    # -- observers and the worker registry ---------------------------------------------

    def observe(self, observer: WorkerObserver) -> Self:
        """Tell ``observer`` what this worker does (see :mod:`typedq.observe`); call it
        before the worker starts. :meth:`typedq.metrics.Metrics.attach` calls it."""
        if self._started:
            raise RuntimeError("observe() must be called before the worker starts")
        if self._observer is None:
            self._observer = Observers()
            self._settler.observer = self._observer
        self._observer.observers.append(observer)
        return self

    def info(self) -> WorkerInfo:
        """This worker as the broker's worker registry lists it."""
        return WorkerInfo(
            id=self.id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=list(self.queues),
            concurrency=self.concurrency,
            in_flight=len(self._running),
            started_at=self.started_at,
            heartbeat_at=time.time(),
            version=_version(),
        )

    async def _heartbeat_loop(self) -> None:
        """Keep this worker in the broker's registry (``typedq inspect --workers``): an
        entry every ``heartbeat`` seconds that expires after three missed ones, removed
        at shutdown."""
        broker = self.app.broker
        failing = False
        try:
            while True:
                try:
                    await broker.register_worker(self.info(), ttl=3 * self.heartbeat)
                except Unsupported:
                    return  # a broker without a registry
                except Exception as exc:
                    if self._observer is not None:
                        self._observer.broker_error("heartbeat", exc)
                    # Once per outage: the claim loop already reports an unreachable broker.
                    (log.debug if failing else log.warning)(
                        "worker %s: heartbeat failed (the worker registry may not list it): %s",
                        self.id,
                        exc,
                    )
                    failing = True
                else:
                    failing = False
                await anyio.sleep(self.heartbeat)
        finally:
            with anyio.move_on_after(2.0, shield=True):
                try:
                    await broker.unregister_worker(self.id)
                except Exception as exc:
                    log.debug("worker %s: could not leave the registry: %s", self.id, exc)


def _version() -> str:
    from . import __version__

    return __version__
