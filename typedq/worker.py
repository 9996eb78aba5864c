"""The worker runtime: claim for free slots, run handlers under leases, settle outcomes.

Lifecycle of a job in a worker:

1. The claim loop asks the broker for at most as many jobs as there are free slots
   (capacity first, then claim), so a claimed job starts at once.
2. Each job runs in its own cancel scope; a per-job timeout is a nested scope.
3. The lease loop renews every running job's lease in one call, every third of the
   lease. A lease reported lost cancels the handler and its result is never written;
   a cancel request (``job.cancel()``) cancels it and records ``cancelled``.
4. Outcomes are settled through batchers: many completions become one broker call.

Shutdown (leaving ``async with``, ``stop()``, or cancelling ``run``) stops claiming,
lets in-flight jobs finish within ``grace`` seconds, then cancels them and hands them
back to the queue unspent. The internals run in a shielded scope so that the caller's
cancellation starts this graceful path instead of tearing handlers down mid-write.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Self

import anyio
import anyio.to_thread
import msgspec
from anyio.abc import TaskGroup, TaskStatus

from .batching import Batcher
from .broker.base import ClaimedJob, Completion, Failure, FinishOutcome, LeaseStatus, Release
from .errors import (
    BrokerError,
    ConfigError,
)
from .execution import Complete, Drop, Executor, HandBack, Outcome, Running
from .task import Task, TIn, TOut

if TYPE_CHECKING:
    from .app import App

__all__ = ["Worker", "WorkerStats"]

log = logging.getLogger("typedq.worker")

_encode = msgspec.msgpack.Encoder().encode


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
    #: Jobs whose producer's schema fingerprint differed but whose payload validated.
    fingerprint_mismatches: Counter[tuple[str, str]] = field(default_factory=Counter)


class Worker(Generic[TIn, TOut]):
    """Runs jobs: ``async with Worker(send_invoice, concurrency=8): ...``.

    ``Worker(task)`` runs one task and is typed by it (``Worker[SendInvoice, Receipt]``);
    ``app.worker()`` runs every task of an app. Leaving the block, ``stop()``, or
    cancelling ``run()`` is a graceful shutdown.

    :param task: the task to run
    :param concurrency: how many jobs run at once
    :param grace: seconds in-flight jobs may finish at shutdown before being cancelled
        and handed back
    """

    def __init__(
        self,
        task: Task[TIn, TOut],
        /,
        *,
        concurrency: int = 16,
        grace: float = 10.0,
    ) -> None:
        from .app import App

        owner = task._owner
        if not isinstance(owner, App):
            raise ConfigError(
                f"{task!r} is a producer stub: workers run tasks registered with @app.task"
            )
        # A worker fails jobs whose task it does not know, so it must not consume a queue
        # that also carries tasks it cannot run.
        others = sorted(
            t.name for t in owner.tasks.values() if t.queue == task.queue and t.name != task.name
        )
        if others:
            raise ConfigError(
                f"queue {task.queue!r} also carries tasks {others} that Worker({task.name}) "
                f"cannot run; give {task.name!r} its own queue (@app.task(queue=...)) or run "
                "them all with app.worker()"
            )
        self._setup(owner, {task.name: task}, [task.queue], concurrency=concurrency, grace=grace)

    @classmethod
    def _for_app(
        cls, app: App, *, concurrency: int, queues: list[str] | None, grace: float
    ) -> Worker[Any, Any]:
        if not app.tasks:
            raise ConfigError(f"app {app.name!r} has no tasks: register some with @app.task")
        worker: Worker[Any, Any] = cls.__new__(cls)
        worker._setup(
            app, dict(app.tasks), queues or app.queues, concurrency=concurrency, grace=grace
        )
        return worker

    def _setup(
        self,
        app: App,
        tasks: dict[str, Task[Any, Any]],
        queues: Sequence[str],
        *,
        concurrency: int,
        grace: float,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        if grace < 0:
            raise ConfigError(f"grace must be >= 0, got {grace}")
        self.app = app
        self.tasks = tasks
        self.queues = list(queues)
        self.concurrency = concurrency
        self.grace = grace
        self.lease = app.lease
        self.renew_interval = app.lease / 3
        self.reaper_interval = min(app.lease / 2, 5.0)
        self.id = f"{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(3)}"
        self.stats = WorkerStats()
        #: Running jobs by claim token (one job id may briefly have two claims: a retry
        #: claimed again before the previous attempt finished cleaning up).
        self._running: dict[str, Running] = {}
        self._renewed_at = time.monotonic()
        self._stopping = False
        self._force_stop = False
        self._started = False
        self._stop: anyio.Event | None = None
        self._changed: anyio.Event | None = None
        self._claim_done: anyio.Event | None = None
        self._wait_scope: anyio.CancelScope | None = None
        self._serve_scope: anyio.CancelScope | None = None
        self._tg: TaskGroup | None = None
        self._outer_tg: TaskGroup | None = None
        self._executor = Executor(
            tasks,
            worker_id=self.id,
            threads=anyio.CapacityLimiter(concurrency),
            progress=self._report_progress,
            mismatches=self.stats.fingerprint_mismatches,
        )
        self._completer: Batcher[Completion, FinishOutcome] = Batcher(
            self._complete_batch, name="completion batcher"
        )
        self._failer: Batcher[Failure, FinishOutcome] = Batcher(
            self._fail_batch, name="failure batcher"
        )

    def __repr__(self) -> str:
        return f"Worker(id={self.id!r}, tasks={sorted(self.tasks)}, concurrency={self.concurrency})"

    @property
    def running(self) -> int:
        """How many jobs run right now."""
        return len(self._running)

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._outer_tg = tg
        try:
            await tg.start(self.run)
        except BaseException as exc:
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

    def stop(self, *, force: bool = False) -> None:
        """Ask for a graceful shutdown; ``run`` returns when it is done.

        :param force: do not wait for the grace period: cancel running jobs now and
            hand them back to the queue
        """
        if self._stop is not None:
            self._stop.set()
        if force:
            self.grace = 0.0
            self._force_stop = True
            if self._stopping:
                for running in list(self._running.values()):
                    running.cancel("shutdown")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until ``stop()`` or cancellation, then shut down gracefully."""
        if self._started:
            raise RuntimeError("a Worker runs once; make a new one")
        self._started = True
        self._stop = anyio.Event()
        self._changed = anyio.Event()
        self._claim_done = anyio.Event()
        async with self.app.client, anyio.create_task_group() as outer:
            await outer.start(self._serve)
            log.info(
                "worker %s started: tasks=%s queues=%s concurrency=%d",
                self.id,
                sorted(self.tasks),
                self.queues,
                self.concurrency,
            )
            task_status.started()
            try:
                await self._stop.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    await self._shutdown()

    async def _serve(self, *, task_status: TaskStatus[None]) -> None:
        with anyio.CancelScope(shield=True) as scope:
            self._serve_scope = scope
            async with anyio.create_task_group() as tg:
                self._tg = tg
                await tg.start(self._completer.run)
                await tg.start(self._failer.run)
                tg.start_soon(self._claim_loop)
                tg.start_soon(self._lease_loop)
                tg.start_soon(self._reaper_loop)
                tg.start_soon(self._cancel_loop)
                task_status.started()

    async def _shutdown(self) -> None:
        assert self._claim_done is not None
        self._stopping = True
        if self._wait_scope is not None:
            self._wait_scope.cancel()
        with anyio.move_on_after(0 if self._force_stop else self.grace):
            await self._claim_done.wait()
            await self._until_idle()
        if self._running:
            log.info("worker %s: grace over, cancelling %d jobs", self.id, len(self._running))
            for running in list(self._running.values()):
                running.cancel("shutdown")
            # Sync handlers cannot be interrupted: wait for them, bounded by the lease
            # (after that the job is recovered elsewhere anyway).
            with anyio.move_on_after(self.lease):
                await self._until_idle()
        assert self._serve_scope is not None
        self._serve_scope.cancel()
        log.info("worker %s stopped: %s", self.id, self.stats)

    async def _until_idle(self) -> None:
        while self._running:
            assert self._changed is not None
            await self._changed.wait()

    def _notify(self) -> None:
        assert self._changed is not None
        self._changed.set()
        self._changed = anyio.Event()

    # -- claiming --------------------------------------------------------------------

    async def _wait(self, seconds: float | None, *, for_jobs: bool = False) -> None:
        """Sleep, for a change in running jobs, or for new jobs; cut short by shutdown."""
        with anyio.CancelScope() as scope:
            self._wait_scope = scope
            if self._stopping:
                scope.cancel()
            if for_jobs:
                await self.app.broker.wait_for_jobs(self.queues, seconds or 5.0)
            elif seconds is not None:
                await anyio.sleep(seconds)
            else:
                assert self._changed is not None
                await self._changed.wait()
        self._wait_scope = None

    async def _claim_loop(self) -> None:
        assert self._claim_done is not None
        assert self._tg is not None
        broker = self.app.broker
        backoff = 0.0
        try:
            while not self._stopping:
                free = self.concurrency - len(self._running)
                if free <= 0:
                    await self._wait(None)
                    continue
                try:
                    jobs = await broker.claim(
                        self.queues, free, worker_id=self.id, lease=self.lease
                    )
                except Exception as exc:
                    backoff = min(5.0, backoff * 2 or 0.05)
                    log.warning(
                        "worker %s: claim failed (%s); retrying in %.2fs", self.id, exc, backoff
                    )
                    await self._wait(backoff)
                    continue
                backoff = 0.0
                if not jobs:
                    await self._wait(5.0, for_jobs=True)
                    continue
                self._start(jobs)
        finally:
            self._claim_done.set()

    # -- leases, reaper, cancellation --------------------------------------------------

    def _start(self, jobs: Sequence[ClaimedJob]) -> None:
        """Run newly claimed jobs, each in its own task."""
        assert self._tg is not None
        self.stats.claimed += len(jobs)
        for claimed in jobs:
            # The broker handed us a job this worker still runs under an older claim:
            # that claim's lease was lost (the loop was blocked, say).
            for stale in self._holders(claimed.message.id):
                stale.cancel("lease_lost")
            running = self._running[claimed.token] = Running(claimed)
            self._tg.start_soon(self._run_job, claimed, running)

    def _holders(self, job_id: str) -> list[Running]:
        return [r for r in self._running.values() if r.claimed.message.id == job_id]

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

    async def _renew(self) -> None:
        """Renew every running job's lease in one call; act on lost leases and cancels."""
        running = [r for r in self._running.values() if r.cancel_reason is None]
        if not running:
            self._renewed_at = time.monotonic()
            return
        sent = time.monotonic()
        try:
            statuses = await self.app.broker.renew(
                [(r.claimed.message.id, r.claimed.token) for r in running], self.lease
            )
        except Exception as exc:
            log.warning("worker %s: lease renewal failed: %s", self.id, exc)
            if time.monotonic() - self._renewed_at > self.lease:
                # Our leases have expired by now; another worker may hold these jobs.
                for holder in list(self._running.values()):
                    holder.cancel("lease_lost")
            return
        self._renewed_at = max(self._renewed_at, sent)
        for holder, status in zip(running, statuses, strict=True):
            if status is LeaseStatus.LOST:
                holder.cancel("lease_lost")
            elif status is LeaseStatus.CANCEL_REQUESTED:
                holder.cancel("cancel")

    async def _reaper_loop(self) -> None:
        while True:
            # Renew our own leases first: after the loop was blocked, this worker must
            # not recover (and run a second time) jobs that it is itself still running.
            await self._renew()
            try:
                recovered = await self.app.broker.recover_stalled()
            except Exception as exc:
                log.warning("worker %s: stalled-job recovery failed: %s", self.id, exc)
            else:
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

    async def _run_job(self, claimed: ClaimedJob, running: Running) -> None:
        try:
            outcome = await self._executor.attempt(claimed, running)
            await self._settle(claimed, outcome)
        except Exception:
            log.exception("worker %s: could not settle job %s", self.id, claimed.message.id)
        finally:
            del self._running[claimed.token]
            self._notify()

    async def _report_progress(self, claimed: ClaimedJob, data: bytes) -> None:
        await self.app.broker.set_progress(claimed.message.id, claimed.token, data)

    # -- settling --------------------------------------------------------------------

    async def _settle(self, claimed: ClaimedJob, outcome: Outcome) -> None:
        job_id, token = claimed.message.id, claimed.token
        if isinstance(outcome, Drop):
            self.stats.lease_lost += 1
            log.warning(
                "worker %s: lost the lease of job %s; its result is discarded", self.id, job_id
            )
            return
        if isinstance(outcome, HandBack):
            result = await self._persist(lambda: self._release_one(Release(job_id, token)))
            self.stats.released += 1
        elif isinstance(outcome, Complete):
            completion = Completion(job_id, token, outcome.result)
            result = await self._persist(lambda: self._completer.submit(completion))
            self.stats.completed += 1
        else:
            failure = Failure(
                id=job_id,
                token=token,
                error=_encode(outcome.record),
                retry_delay=outcome.retry_delay,
                cancelled=outcome.cancelled,
            )
            result = await self._persist(lambda: self._failer.submit(failure))
            if outcome.cancelled:
                self.stats.cancelled += 1
            elif outcome.retry_delay is not None:
                self.stats.retried += 1
            else:
                self.stats.failed += 1
            if outcome.retry_delay is None and not outcome.cancelled:
                log.info(
                    "job %s (%s) failed: %s: %s",
                    job_id,
                    claimed.message.task,
                    outcome.record.reason.value,
                    outcome.record.message,
                )
        if result is FinishOutcome.LEASE_LOST:
            self.stats.finish_rejected += 1
            log.warning(
                "worker %s: job %s was finished by the lease owner; ours was rejected",
                self.id,
                job_id,
            )

    async def _persist(self, send: Callable[[], Awaitable[FinishOutcome]]) -> FinishOutcome:
        """Send an outcome, retrying broker outages for up to one lease.

        Re-sending is safe: transitions are idempotent per token (ALREADY_FINISHED).
        After a lease the job is someone else's anyway, so the error is raised.
        """
        delay = 0.05
        deadline = time.monotonic() + self.lease
        while True:
            try:
                return await send()
            except BrokerError as exc:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("worker %s: could not record an outcome (%s); retrying", self.id, exc)
                await anyio.sleep(delay)
                delay = min(1.0, delay * 2)

    async def _release_one(self, item: Release) -> FinishOutcome:
        (result,) = await self.app.broker.release([item])
        return result

    async def _complete_batch(self, items: list[Completion]) -> Sequence[FinishOutcome]:
        if self._stopping:
            return await self.app.broker.complete(items)
        # The slots these completions free are refilled in the same round trip. They still
        # count as taken until their _run_job ends, so the claim loop cannot claim for
        # them too, and the broker applies the completions before the claim.
        outcomes, jobs = await self.app.broker.complete_and_claim(
            items, self.queues, len(items), worker_id=self.id, lease=self.lease
        )
        if jobs:
            self._start(jobs)
        return outcomes

    async def _fail_batch(self, items: list[Failure]) -> Sequence[FinishOutcome]:
        return await self.app.broker.fail(items)
