"""Settling outcomes with the broker: from an :data:`~typedq.outcomes.Outcome` to a
recorded transition.

:class:`Settler` is the worker's only path to ``complete``, ``fail`` and ``release``.
Completions and failures travel through batchers (many outcomes, one broker call);
completions also refill the slots they free in the same round trip
(``complete_and_claim``), and the jobs that brings are handed to the worker's
``start`` callback.

Outcomes are re-sent until the broker answers (transitions are idempotent per token),
with a capped backoff; the job keeps its slot and its lease meanwhile, so an outage
applies backpressure instead of re-running finished jobs. At shutdown the worker calls
:meth:`Settler.give_up`: re-sends stop and :meth:`Settler.settle` raises
:class:`GaveUp` (the job comes back when its lease expires).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

import anyio
import msgspec
from anyio.abc import TaskStatus

from .batching import Batcher
from .broker.base import (
    Broker,
    ClaimedJob,
    Completion,
    Failure,
    FinishOutcome,
    Release,
    new_claim_id,
)
from .clock import SYSTEM_CLOCK, Clock, move_on_after
from .errors import BrokerError, BrokerUnavailable, FailureReason, FailureRecord
from .logs import job_fields
from .outcomes import (
    Abandon,
    Complete,
    Drop,
    Fail,
    HandBack,
    Outcome,
    describe,
    minimal_failure,
    safe_retry_delay,
)

if TYPE_CHECKING:
    from .observe import WorkerObserver
    from .worker import WorkerStats

__all__ = ["GaveUp", "Settler"]

# The settle path is part of the worker: users configure one logger for both.
log = logging.getLogger("typedq.worker")

T = TypeVar("T")

_encode = msgspec.msgpack.Encoder().encode

#: Compared per job: an enum's class attribute is looked up through its metaclass.
_LEASE_LOST = FinishOutcome.LEASE_LOST

#: Outcome re-sends back off up to this many seconds between tries.
_SETTLE_BACKOFF_CAP = 5.0
#: Seconds an outcome is re-sent while the broker refuses it with an error of its own
#: (not unreachable: READONLY during a failover, say). Such an error may also be lasting,
#: so after this the job falls back to a minimal failure record.
_SETTLE_REFUSED_FOR = 60.0


class GaveUp(Exception):
    """Shutdown stopped re-sending an outcome the broker did not take."""


class QueueRotation:
    """A worker's queues in a new order for each claim: each claim starts one queue
    further on, so a backend that claims queue by queue (Redis Cluster: one script per
    slot, each for what the ones before left) drains no queue (no partition of a
    partitioned queue) before the others."""

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = list(queues)
        self._turn = 0

    def next(self) -> list[str]:
        """The queues starting one further on than the previous call's."""
        if len(self.queues) < 2:
            return self.queues
        start = self._turn % len(self.queues)
        self._turn += 1
        return self.queues[start:] + self.queues[:start]


class Settler:
    """Records a worker's outcomes with its broker and counts them in its stats.

    :param broker: returns the broker to settle with (read at each call: tests may
        swap an app's broker)
    :param worker_id: names the worker in logs and claims
    :param queues: the queues refill claims take jobs from
    :param lease: seconds of lease for jobs claimed by a refill
    :param stats: the worker's counters, updated per outcome
    :param stopping: whether the worker is shutting down (no more refills)
    :param start: runs jobs a refill claimed
    :param concurrency: how many runners may settle at once (1: the batchers' inline
        sends wait for no batch mates)
    :param clock: what re-sends back off on and how long a refusal lasted is measured by
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        *,
        worker_id: str,
        queues: Sequence[str],
        lease: float,
        stats: WorkerStats,
        stopping: Callable[[], bool],
        start: Callable[[Sequence[ClaimedJob]], None],
        concurrency: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._broker = broker
        self.clock = clock
        self.worker_id = worker_id
        self.queues = list(queues)
        self._rotation = QueueRotation(queues)
        self.lease = lease
        self.stats = stats
        self._stopping = stopping
        self._start = start
        self._gave_up = False
        self._give_up: anyio.Event | None = None
        #: Told about lost leases and broker errors (set by the worker; None: nobody).
        self.observer: WorkerObserver | None = None
        # Inline: a lone outcome is sent by its runner itself (no hop to a sender task
        # and back); runners are never cancelled while they settle (see Worker._serve).
        self._completer: Batcher[Completion, FinishOutcome] = Batcher(
            self._complete_batch,
            name="completion batcher",
            inline=True,
            max_callers=concurrency,
        )
        self._failer: Batcher[Failure, FinishOutcome] = Batcher(
            self._fail_batch, name="failure batcher", inline=True, max_callers=concurrency
        )

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the batchers until cancelled; ``settle`` may be called once started."""
        self._give_up = anyio.Event()
        if self._gave_up:
            self._give_up.set()
        async with anyio.create_task_group() as tg:
            await tg.start(self._completer.run)
            await tg.start(self._failer.run)
            task_status.started()

    def give_up(self) -> None:
        """Stop re-sending: pending and future re-sends raise :class:`GaveUp`."""
        self._gave_up = True
        if self._give_up is not None:
            self._give_up.set()

    @property
    def gave_up(self) -> bool:
        """Whether :meth:`give_up` was called."""
        return self._gave_up

    async def settle(self, claimed: ClaimedJob, outcome: Outcome) -> None:
        """Record ``outcome`` for ``claimed`` (re-sent until the broker answers).

        :raises GaveUp: shutdown stopped the re-sends
        :raises BrokerError: the broker kept refusing the outcome
        """
        if isinstance(outcome, Complete):
            # The common case inline (no coroutines of _complete and _persist per job):
            # the first send is tried here, its re-sends are _persist's.
            completion = Completion(claimed.message.id, claimed.token, outcome.result, outcome.span)
            submit = self._completer.submit
            try:
                result = await submit(completion)
            except BrokerError as exc:
                result = await self._persist(claimed, "completion", submit, completion, exc)
            self.stats.completed += 1
            if result is _LEASE_LOST:
                self._check(claimed, result)
        elif isinstance(outcome, Drop):
            self._lease_lost(claimed)
        elif isinstance(outcome, Abandon):
            self._abandoned(claimed)
        elif isinstance(outcome, HandBack):
            await self._hand_back(claimed)
        else:
            await self._fail(claimed, outcome)

    # -- one method per outcome ------------------------------------------------------

    def _lease_lost(self, claimed: ClaimedJob) -> None:
        self.stats.lease_lost += 1
        if self.observer is not None:
            self.observer.lease_lost(claimed)
        log.warning(
            "worker %s: lost the lease of job %s (%s) attempt %d; its result is discarded",
            self.worker_id,
            claimed.message.id,
            claimed.message.task,
            claimed.attempt,
            extra=job_fields(claimed, self.worker_id),
        )

    def _abandoned(self, claimed: ClaimedJob) -> None:
        self.stats.abandoned += 1
        log.warning(
            "worker %s: abandoned job %s (%s) attempt %d at shutdown: its sync handler's "
            "thread still runs and cannot be stopped; the job comes back when its lease "
            "expires (within %.0fs of this worker stopping)",
            self.worker_id,
            claimed.message.id,
            claimed.message.task,
            claimed.attempt,
            self.lease,
            extra=job_fields(claimed, self.worker_id),
        )

    async def _hand_back(self, claimed: ClaimedJob) -> None:
        release = Release(claimed.message.id, claimed.token)
        result = await self._persist(claimed, "hand-back", self._release_one, release)
        self.stats.released += 1
        self._check(claimed, result)

    async def _fail(self, claimed: ClaimedJob, outcome: Fail) -> None:
        failure = Failure(
            id=claimed.message.id,
            token=claimed.token,
            error=self._encode_record(claimed, outcome.record),
            # Whatever the handler or a backoff produced, the broker gets a finite
            # delay: one odd number must not fail the batch it travels in.
            retry_delay=safe_retry_delay(outcome.retry_delay),
            cancelled=outcome.cancelled,
            refund=outcome.refund,
            span=outcome.span,
            # A deploy's undecodable payload parks the job: its flow waits for a retry.
            park=outcome.record.reason == FailureReason.SCHEMA_MISMATCH,
        )
        result = await self._persist(claimed, "failure", self._failer.submit, failure)
        if outcome.cancelled:
            self.stats.cancelled += 1
        elif outcome.retry_delay is not None:
            self.stats.retried += 1
        else:
            self.stats.failed += 1
        if result is not FinishOutcome.LEASE_LOST:
            _log_failure(claimed, outcome, self.worker_id)
        self._check(claimed, result)

    def _check(self, claimed: ClaimedJob, result: FinishOutcome) -> None:
        if result is FinishOutcome.LEASE_LOST:
            self.stats.finish_rejected += 1
            if self.observer is not None:
                self.observer.lease_lost(claimed)
            log.warning(
                "worker %s: job %s (%s) attempt %d was finished by the lease owner; ours "
                "was rejected",
                self.worker_id,
                claimed.message.id,
                claimed.message.task,
                claimed.attempt,
                extra=job_fields(claimed, self.worker_id),
            )

    def _encode_record(self, claimed: ClaimedJob, record: FailureRecord) -> bytes:
        try:
            return _encode(record)
        except Exception as exc:
            # A message msgpack cannot carry (a lone surrogate, say): keep what can be.
            log.warning(
                "worker %s: job %s (%s) attempt %d: its failure record could not be encoded "
                "(%s); storing a minimal one",
                self.worker_id,
                claimed.message.id,
                claimed.message.task,
                claimed.attempt,
                describe(exc),
                extra=job_fields(claimed, self.worker_id),
            )
            return _encode(
                minimal_failure(
                    claimed,
                    worker_id=self.worker_id,
                    error_type=record.error_type,
                    message=record.message,
                    failed_at=record.failed_at,
                    reason=record.reason,
                    retryable=record.retryable,
                )
            )

    # -- re-sending ------------------------------------------------------------------

    async def _backoff(self, delay: float) -> float:
        """Wait ``delay`` seconds (cut short by ``give_up``); the next delay."""
        assert self._give_up is not None, "Settler.run has not started"
        with move_on_after(self.clock, delay):
            await self._give_up.wait()
        return min(_SETTLE_BACKOFF_CAP, delay * 2)

    async def _persist(
        self,
        claimed: ClaimedJob,
        what: str,
        send: Callable[[T], Awaitable[FinishOutcome]],
        item: T,
        failed: BrokerError | None = None,
    ) -> FinishOutcome:
        """Send an outcome (``send(item)``, no closure per job) until the broker answers it,
        with a capped backoff; ``failed``: the error of a first send the caller made.

        Re-sending is safe: transitions are idempotent per token (ALREADY_FINISHED), and
        a token the broker no longer honours is answered LEASE_LOST. While this retries,
        the job keeps its slot (no new claims: backpressure) and its lease is renewed.
        An unreachable broker is retried for as long as the worker runs; an error the
        broker itself answered is retried for up to a minute, then raised. After
        ``give_up`` the re-sends stop (``GaveUp``): the job comes back when its lease
        expires.
        """
        delay = 0.05
        tries = 0
        refused_since: float | None = None
        while True:
            if failed is None:
                try:
                    return await send(item)
                except BrokerError as error:
                    failed = error
            exc, failed = failed, None
            tries += 1
            if self.observer is not None:
                self.observer.broker_error("settle", exc)
            if isinstance(exc, BrokerUnavailable):
                refused_since = None
            else:
                now = self.clock.monotonic()
                if refused_since is None:
                    refused_since = now
                elif now - refused_since > _SETTLE_REFUSED_FOR:
                    raise exc
            if self._gave_up:
                raise GaveUp from exc
            if tries == 1 or tries % 10 == 0:
                log.warning(
                    "worker %s: could not record the %s of job %s (%s) attempt %d: %s; "
                    "retrying (try %d; the job keeps its slot and lease meanwhile)",
                    self.worker_id,
                    what,
                    claimed.message.id,
                    claimed.message.task,
                    claimed.attempt,
                    exc,
                    tries,
                    extra=job_fields(claimed, self.worker_id),
                )
            delay = await self._backoff(delay)

    async def _release_one(self, item: Release) -> FinishOutcome:
        (result,) = await self._broker().release([item])
        return result

    async def _complete_batch(self, items: list[Completion]) -> list[FinishOutcome]:
        # A batch that fails for one bad item is re-sent item by item by the Batcher, so
        # only that item's settle gets the error (see typedq.batching).
        broker = self._broker()
        if self._stopping():
            return list(await broker.complete(items))
        try:
            # The slots these completions free are refilled in the same round trip. They
            # still count as taken until their job's settle returns, so the claim loop
            # cannot claim for them too, and the broker applies the completions before
            # the claim.
            outcomes, jobs = await self._complete_and_claim(items)
        except BrokerUnavailable:
            raise  # every submitter re-sends its own item
        except Exception:
            # The refill's claim may be what the broker refused: the completions still
            # go, on their own.
            return list(await broker.complete(items))
        if jobs:
            self._start(jobs)
        return list(outcomes)

    async def _complete_and_claim(
        self, items: list[Completion]
    ) -> tuple[Sequence[FinishOutcome], Sequence[ClaimedJob]]:
        """``complete_and_claim``, re-sent with the same claim id while the broker is out
        of reach: the claim may have taken effect, and a re-send returns its jobs instead
        of orphaning them. Gives up (raising) at shutdown; its completions are then
        re-sent one by one by their submitters."""
        claim_id = new_claim_id()
        queues = self._rotation.next()  # kept for the re-sends of this claim
        delay = 0.05
        while True:
            try:
                return await self._broker().complete_and_claim(
                    items,
                    queues,
                    len(items),
                    worker_id=self.worker_id,
                    lease=self.lease,
                    claim_id=claim_id,
                )
            except BrokerUnavailable as exc:
                if self._stopping() or self._gave_up:
                    raise
                log.warning(
                    "worker %s: could not record %d completions (%s); re-sending them with "
                    "the same claim",
                    self.worker_id,
                    len(items),
                    exc,
                )
                delay = await self._backoff(delay)

    async def _fail_batch(self, items: list[Failure]) -> list[FinishOutcome]:
        return list(await self._broker().fail(items))


def _log_failure(claimed: ClaimedJob, outcome: Fail, worker_id: str) -> None:
    """Log a recorded failed attempt: one WARNING line when a retry is scheduled (its
    traceback at DEBUG), ERROR with the record's traceback when the failure is final,
    INFO for a cancel."""
    record = outcome.record
    retry = outcome.retry_delay is not None and not outcome.cancelled
    if outcome.cancelled:
        level, what = logging.INFO, "was cancelled"
    elif outcome.retry_delay is not None:
        delay = outcome.retry_delay
        shown = f"{delay:.3g}" if delay < 100 else f"{delay:.0f}"
        level, what = logging.WARNING, f"failed; retry in {shown}s"
    else:
        level, what = logging.ERROR, "failed for good"
    if not log.isEnabledFor(level):
        return
    message = record.message
    if retry:
        # One line per retry, however many lines the error's message has.
        message = " ".join(message.split("\n"))
    text = f"{record.reason.value}: {record.error_type}: {message}"
    if record.traceback and not retry:
        text = f"{text}\n{record.traceback.rstrip()}"
    fields = job_fields(claimed, worker_id)
    fields["reason"] = record.reason.value
    fields["error_type"] = record.error_type
    args = (claimed.message.id, claimed.message.task, claimed.attempt)
    log.log(level, "job %s (%s) attempt %d " + what + ": %s", *args, text, extra=fields)
    if retry and record.traceback and log.isEnabledFor(logging.DEBUG):
        log.debug(
            "job %s (%s) attempt %d: the traceback of the failure to retry:\n%s",
            *args,
            record.traceback.rstrip(),
            extra=fields,
        )
