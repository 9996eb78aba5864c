"""The worker's runners: each runs claimed jobs one at a time and settles their outcome.

A worker starts ``concurrency`` long-lived runners (no task spawned per job). Each job
runs in a fresh copy of the runner's contextvars context
(:func:`typedq.execution.run_in_context`), as if it had a task of its own, and its
handler in a cancel scope armed for that job alone (its deadline is the job's timeout),
so cancelling one job stops only that job's handler. The scope is the runner's, entered
once and re-armed per job (:class:`typedq.execution.HandlerScope`): a scope per job
would cost as much as the rest of a no-op job.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
import msgspec
from anyio.abc import TaskGroup

from ..broker.base import ClaimedJob
from ..clock import Clock
from ..errors import FailureRecord
from ..execution import Executor, HandlerScope, Running, run_in_context
from ..logs import job_fields
from ..observe import Observers, outcome_of
from ..outcomes import Complete, Fail, Outcome, describe, minimal_failure
from ..settling import GaveUp, Settler
from .jobs import RunningJobs
from .stats import WorkerStats

if TYPE_CHECKING:
    from ..tracing import Tracing

__all__ = ["JobRunner"]

log = logging.getLogger("typedq.worker")


class JobRunner:
    """Runs the jobs of a worker's table through its executor and settler.

    :param worker_id: names the worker in log lines and failure records
    :param jobs: the worker's table of running jobs (where claimed jobs wait)
    :param executor: runs one attempt of a job
    :param settler: records outcomes with the broker
    :param stats: the worker's counters
    :param tracing: the app's OpenTelemetry tracing (None: off)
    :param clock: times each job for observers and DEBUG lines
    """

    def __init__(
        self,
        *,
        worker_id: str,
        jobs: RunningJobs,
        executor: Executor,
        settler: Settler,
        stats: WorkerStats,
        tracing: Tracing | None,
        clock: Clock,
    ) -> None:
        self.worker_id = worker_id
        self.jobs = jobs
        self.executor = executor
        self.settler = settler
        self.stats = stats
        self.tracing = tracing
        self.clock = clock
        #: Told what the jobs do (set before the worker starts; None: nobody listens).
        self.observer: Observers | None = None
        #: Told of each durable run's step job that returned (job, result), before its
        #: completion is recorded: the app's ``after_step``, which may run the run's next
        #: turn here (typedq.durable.host); None: no durable runs.
        self.after_step: Callable[[ClaimedJob, bytes], Awaitable[None]] | None = None
        #: With prefetch, where outcomes are recorded while the runner goes on (the
        #: worker's own task group, set as it starts); None: the runner records each
        #: outcome itself before it takes the next job.
        self.behind: TaskGroup | None = None

    async def run(self) -> None:
        """One of the worker's ``concurrency`` runners: runs claimed jobs one at a time,
        each in a fresh copy of this task's context, so what a job sets in contextvars
        (its span, a handler's own variables) is its own, as in a task of its own."""
        queued = self.jobs.queued
        idle = self.jobs.idle
        try:
            # On asyncio a bare future is the cheapest wake-up (an anyio event wraps an
            # asyncio.Event, which makes a future per wait anyway); anyio's cancel scopes
            # still cancel the wait, as they cancel any await of the task.
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # another backend (trio)
            loop = None
        # The event loop's own event class (anyio.Event() finds the backend each call).
        event = type(anyio.Event())
        # The cancel scope the handlers run in: entered once, re-armed per job.
        with HandlerScope() as scopes:
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
                await run_in_context(
                    contextvars.copy_context(), self._run_job(claimed, running, scopes)
                )

    async def _run_job(self, claimed: ClaimedJob, running: Running, scopes: HandlerScope) -> None:
        job_id, task = claimed.message.id, claimed.message.task
        worker_id = self.worker_id
        observer = self.observer
        debug = log.isEnabledFor(logging.DEBUG)
        if observer is not None:
            observer.job_started(claimed)
        if debug:
            log.debug(
                "job %s (%s) attempt %d started",
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, worker_id),
            )
        timed = debug or observer is not None
        began = self.clock.monotonic() if timed else 0.0
        # The job runs in a context of its own (run): its span stays current in it.
        traced = (
            self.tracing.process(claimed, own_context=True) if self.tracing is not None else None
        )
        try:
            try:
                attempt = await self.executor.attempt(claimed, running, scopes)
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
                    worker_id,
                    job_id,
                    task,
                    claimed.attempt,
                    extra=job_fields(claimed, worker_id),
                )
                outcome = Fail(self._minimal(claimed, exc, "could not run this job"))
            else:
                if traced is not None:
                    span = traced.end(outcome)
                    if span and isinstance(outcome, Complete | Fail):
                        # A fan-out member's span: its callback's span links to it.
                        outcome = msgspec.structs.replace(outcome, span=span)
            after_step = self.after_step
            if after_step is not None and claimed.message.run_queue and type(outcome) is Complete:
                try:
                    await after_step(claimed, outcome.result)
                except Exception:
                    # The step's completion still goes: it wakes the run's next turn.
                    log.exception(
                        "worker %s: job %s (%s): the run's next turn after this step failed "
                        "here; the step's completion wakes one",
                        worker_id,
                        job_id,
                        task,
                        extra=job_fields(claimed, worker_id),
                    )
        except BaseException:
            self.jobs.finished(claimed, running)
            raise
        ended = self.clock.monotonic() if timed else 0.0
        behind = self.behind
        if behind is not None:
            # Prefetch: the runner goes on with the next job while this outcome is
            # recorded; the job keeps its slot (and lease) until then. The task is
            # spawned here, in the job's own context, which it copies.
            behind.start_soon(self._settle, claimed, running, outcome, ended - began, debug)
        else:
            await self._settle(claimed, running, outcome, ended - began, debug)

    async def _settle(
        self, claimed: ClaimedJob, running: Running, outcome: Outcome, took: float, debug: bool
    ) -> None:
        """Record an attempt's outcome, tell observers, and free its slot; ``debug``:
        whether to log it at DEBUG (asked once per job, by the attempt)."""
        job_id, task = claimed.message.id, claimed.message.task
        worker_id = self.worker_id
        try:
            try:
                await self.settler.settle(claimed, outcome)
            except GaveUp:
                raise
            except Exception as exc:
                if not isinstance(outcome, Complete | Fail) or self.settler.gave_up:
                    raise
                # Last resort: the job still gets a (minimal) failure record rather than
                # sitting claimed until its lease expires and counting as a stall.
                log.exception(
                    "worker %s: could not record the outcome of job %s (%s) attempt %d; "
                    "recording a minimal failure instead",
                    worker_id,
                    job_id,
                    task,
                    claimed.attempt,
                    extra=job_fields(claimed, worker_id),
                )
                outcome = Fail(self._minimal(claimed, exc, "could not record the outcome"))
                await self.settler.settle(claimed, outcome)
            if running.emitter is not None:
                await self.executor.end_stream(running, outcome)
            observer = self.observer
            if observer is not None or debug:
                how = outcome_of(outcome)
                if observer is not None:
                    observer.job_finished(claimed, how, took)
                if debug:
                    log.debug(
                        "job %s (%s) attempt %d finished: %s in %.3fs",
                        job_id,
                        task,
                        claimed.attempt,
                        how.value,
                        took,
                        extra=job_fields(claimed, worker_id),
                    )
        except GaveUp:
            self.stats.settles_given_up += 1
            log.warning(
                "worker %s: shutdown gave up recording the outcome of job %s (%s) attempt %d; "
                "it comes back when its lease expires",
                worker_id,
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, worker_id),
            )
        except Exception:
            log.exception(
                "worker %s: job %s (%s) attempt %d could not be settled; it comes back when "
                "its lease expires",
                worker_id,
                job_id,
                task,
                claimed.attempt,
                extra=job_fields(claimed, worker_id),
            )
        finally:
            self.jobs.finished(claimed, running)

    def _minimal(self, claimed: ClaimedJob, exc: BaseException, what: str) -> FailureRecord:
        return minimal_failure(
            claimed,
            worker_id=self.worker_id,
            error_type="WorkerError",
            message=f"the worker {what}: {type(exc).__name__}: {describe(exc)}",
            failed_at=self.clock.time(),
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
