"""Test your own tasks the easy way: an in-process worker on the embedded broker.

::

    from typedq.testing import run_worker

    async def test_invoice_is_retried() -> None:
        async with run_worker(app) as harness:
            job = await send_invoice.enqueue(SendInvoice(customer_id=1, invoice_id=7))
            await harness.idle()             # the first attempt failed, a retry is scheduled
            await harness.advance(60)        # move the fake clock: the retry becomes due
            assert (await job.result(timeout=5)).total_cents == 700

Resources (``@app.resource``) are opened by the harness's worker as by any worker; give
test doubles instead with ``run_worker(app, resources=[provide(db, fake_pool)])``, and
for a direct call of a handler pass ``job_context(provide(db, fake_pool))`` as its context.

Delays, ETAs and retry backoffs follow the harness's :class:`FakeClock`, so they happen
when the test moves the clock, without real sleeping. Per-job timeouts and leases
still use real time (they measure the handler and the worker, not the business clock).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio

from .app import App
from .broker.base import JobState
from .broker.memory import MemoryBroker
from .context import JobContext
from .errors import ConfigError
from .resources import Provided, Resources, provide
from .worker import Worker

__all__ = ["FakeClock", "Harness", "job_context", "provide", "run_worker"]


class FakeClock:
    """A wall clock that only moves when told to.

    :param start: the initial time, epoch seconds (default: now)
    """

    def __init__(self, start: float | None = None) -> None:
        self._now = time.time() if start is None else start

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; got {seconds}")
        self._now += seconds


class Harness:
    """What :func:`run_worker` yields: the worker, the broker and the clock."""

    def __init__(self, app: App, worker: Worker[Any, Any], broker: MemoryBroker, clock: FakeClock):
        self.app = app
        self.worker = worker
        self.broker = broker
        self.clock = clock

    async def advance(self, seconds: float) -> None:
        """Move the fake clock forward and let the worker pick up what became due."""
        self.clock.advance(seconds)
        self.broker.wake()
        await anyio.lowlevel.checkpoint()

    async def idle(self, timeout: float = 10.0) -> None:
        """Wait until nothing is waiting, running, or scheduled at or before now, and no
        schedule of the app (``app.schedule``) has a tick due that was not handled.

        Jobs scheduled in the (fake) future do not count: ``advance`` makes them due.

        :raises TimeoutError: still busy after ``timeout`` real seconds
        """
        with anyio.fail_after(timeout):
            # Idleness spans the worker, the broker and the clock; a short poll in a test
            # helper is simpler than an event for each of them.
            while not await self._is_idle():  # noqa: ASYNC110
                await anyio.sleep(0.002)

    async def _is_idle(self) -> bool:
        if self.worker.running:
            return False
        for queue in self.worker.queues:
            counts = await self.broker.counts(queue)
            if counts[JobState.WAITING] or counts[JobState.ACTIVE]:
                return False
        return not self.broker.has_due_jobs() and not await self._tick_due()

    async def _tick_due(self) -> bool:
        """True while a schedule of the app has a due tick its scheduler has not handled."""
        if not self.app.schedules:
            return False
        states = {s.name: s for s in await self.broker.schedule_states()}
        now = await self.broker.broker_time_us()
        for schedule in self.app.schedules.values():
            state = states.get(schedule.name)
            if state is None or state.digest != schedule.digest:
                return True  # not reconciled yet
            if schedule.next_tick(state.last_tick_us) <= now:
                return True
        return False

    async def counts(self) -> dict[JobState, int]:
        """Jobs per state, summed over the worker's queues."""
        total = dict.fromkeys(JobState, 0)
        for queue in self.worker.queues:
            for state, count in (await self.broker.counts(queue)).items():
                total[state] += count
        return total


@contextlib.asynccontextmanager
async def run_worker(
    app: App,
    *,
    concurrency: int = 16,
    clock: FakeClock | None = None,
    grace: float = 5.0,
    resources: Iterable[Provided[Any]] = (),
) -> AsyncIterator[Harness]:
    """Connect ``app`` to a fresh embedded broker on a fake clock and run a worker for it.

    The app must not be connected yet. Inside the block, enqueue as usual; leaving it
    shuts the worker down gracefully and disconnects the app.

    :param app: the app whose tasks to run (its broker URL is ignored: always embedded)
    :param concurrency: the worker's concurrency
    :param clock: a FakeClock to share, or a new one starting now
    :param grace: the worker's shutdown grace period
    :param resources: test doubles, ``provide(db, fake_pool)``: used instead of opening
        those resources (the app's other resources are opened as a worker opens them)
    """
    if app.client.connected:
        raise ConfigError("run_worker needs an app that is not connected yet")
    clock = clock or FakeClock()
    broker = MemoryBroker(app.settings, clock=clock)
    with app.using_broker(broker):
        async with app:
            worker = app.worker(concurrency=concurrency, grace=grace)
            for double in resources:
                worker.provide(double.resource, double.value)
            async with worker:
                yield Harness(app, worker, broker, clock)


def job_context(
    *resources: Provided[Any],
    job_id: str = "test",
    task: str = "test",
    queue: str = "default",
    attempt: int = 1,
    enqueued_at: float = 0.0,
    emitted: list[Any] | None = None,
) -> JobContext[Any]:
    """A job context for calling a handler directly, with test doubles for its resources::

        receipt = await charge(order, job_context(provide(db, fake_pool)))

    :param resources: what ``ctx.get`` returns, ``provide(db, fake_pool)``; asking for
        another resource raises :class:`~typedq.ResourceError`
    :param attempt: what ``ctx.attempt`` says (to test a handler's retry behaviour)
    :param emitted: a list that gets what the handler emits (``ctx.emit``, a task with
        ``emits=``, docs/streams.md), in order
    """
    return JobContext(
        job_id=job_id,
        task=task,
        queue=queue,
        attempt=attempt,
        enqueued_at=enqueued_at,
        resources=Resources.of(resources, where="this test's job_context"),
        emitter=None if emitted is None else _Collect(emitted),
    )


class _Collect:
    """The emitter of a test's job context: appends every item to a list."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    async def emit(self, item: Any, /) -> None:
        self.items.append(item)
