# The metrics extra is optional: a type checker without it installed (an editable
# install, a monorepo) reads its names as Any instead of failing on this module.
# mypy: disable-error-code="import-not-found"
# mypy: allow-subclassing-any
"""Prometheus metrics for workers (``pip install 'typedq[metrics]'``).

:class:`Metrics` is a :class:`~typedq.observe.WorkerObserver` that keeps the series of
SPEC section 6 in a ``prometheus_client`` registry (the default registry unless you
pass one)::

    from prometheus_client import CollectorRegistry, start_http_server
    from typedq.metrics import Metrics

    registry = CollectorRegistry()
    metrics = Metrics(registry)
    start_http_server(9100, registry=registry)
    async with metrics.attach(app.worker(concurrency=16)):
        ...

``typedq worker --metrics-port N`` does the same and serves ``/metrics``.

Series:

The ``task`` label is a task the app declares, or ``_unknown`` (:data:`UNKNOWN_TASK`)
for every job whose task it does not (such a job fails at once): job messages cannot
multiply the series. ``serve`` listens on 127.0.0.1 unless told otherwise.

- ``typedq_jobs_total{task,queue,outcome}``: attempts by how they ended (the values of
  :class:`~typedq.observe.JobOutcome`: completed, failed, retried, cancelled, released,
  lease_lost, abandoned)
- ``typedq_job_duration_seconds{task,queue}``: histogram, an attempt's start to its
  outcome
- ``typedq_queue_wait_seconds{task,queue}``: histogram, from when a job became due to
  the start of an attempt, for every attempt: its enqueue (or eta/delay), a retry's due
  time, a hand-back or stall recovery, a workflow hand-off
  (:meth:`~typedq.broker.base.ClaimedJob.due_at`); the worker's clock against the time
  the broker recorded
- ``typedq_queue_jobs{queue,state}`` and ``typedq_queue_oldest_waiting_seconds{queue}``:
  gauges read from the broker at scrape time (one round trip for all the worker's
  queues, :meth:`~typedq.broker.base.Broker.queue_stats`), so every worker of a
  deployment reports the same numbers
- ``typedq_worker_in_flight``: jobs the attached workers hold right now
- ``typedq_schema_mismatches_total{task,queue}``: jobs whose producer had another input
  schema fingerprint (they validated and ran)
- ``typedq_lease_losses_total{task,queue}``: leases lost while running or outcomes the
  broker refused because another lease owns the job
- ``typedq_broker_errors_total{operation}``: failed broker calls (claim, renew,
  recover, settle, heartbeat, queue_stats), each retried
- ``typedq_stalled_recovered_total``: jobs whose lease expired, put back (or failed as
  stalled) by the attached workers' reapers
"""

from __future__ import annotations

import bisect
import logging
import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel

from .broker.base import Broker, ClaimedJob, QueueStats
from .clock import SYSTEM_CLOCK, Clock
from .errors import ConfigError
from .observe import JobOutcome, WorkerObserver
from .task import TIn, TOut
from .worker import Worker

try:
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised without the extra
    raise ConfigError(
        "typedq.metrics needs prometheus-client: pip install 'typedq[metrics]'"
    ) from exc

__all__ = [
    "DURATION_BUCKETS",
    "UNKNOWN_TASK",
    "WAIT_BUCKETS",
    "Metrics",
    "QueueCollector",
    "serve_registry",
]

log = logging.getLogger("typedq.metrics")


#: The ``task`` label of a job whose task the app does not declare (a producer's typo, a
#: task removed or renamed): one series for them all, so job messages cannot add labels.
#: A task name starts with a letter or digit, so no declared task can be called so.
UNKNOWN_TASK = "_unknown"

#: Histogram buckets (seconds) of ``typedq_job_duration_seconds``.
DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: Histogram buckets (seconds) of ``typedq_queue_wait_seconds``.
WAIT_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    900.0, 3600.0,
)  # fmt: skip


class _Source:
    """One running worker whose broker the queue gauges read."""

    __slots__ = ("broker", "queues", "thread", "token", "worker")

    def __init__(self, worker: Worker[Any, Any]) -> None:
        self.worker = worker
        self.broker: Broker = worker.app.broker
        self.queues = list(worker.queues)
        self.token = anyio.lowlevel.current_token()
        self.thread = threading.get_ident()


class QueueCollector(Collector):
    """``typedq_queue_jobs`` and ``typedq_queue_oldest_waiting_seconds``, read from the
    broker of the attached workers when scraped.

    A scrape runs in the HTTP server's thread: it asks the worker's event loop for
    :meth:`~typedq.broker.base.Broker.queue_stats` (one round trip, at most ``timeout``
    seconds) and waits for the answer. A scrape from inside the event loop itself (an
    ASGI app in the same loop) cannot wait for it: it gets the last answer (call
    :meth:`refresh` from the loop to renew it).
    """

    def __init__(self, metrics: Metrics, timeout: float = 5.0) -> None:
        self._metrics = metrics
        self.timeout = timeout
        self._sources: list[_Source] = []
        self._last: dict[str, QueueStats] = {}
        self._lock = threading.Lock()

    def add(self, worker: Worker[Any, Any]) -> None:
        """Read ``worker``'s queues from its broker (called in its event loop)."""
        with self._lock:
            self._sources.append(_Source(worker))

    def remove(self, worker: Worker[Any, Any]) -> None:
        with self._lock:
            self._sources = [s for s in self._sources if s.worker is not worker]

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                "typedq_queue_jobs",
                "Jobs per queue and state, read from the broker at scrape time",
                labels=["queue", "state"],
            ),
            GaugeMetricFamily(
                "typedq_queue_oldest_waiting_seconds",
                "How long the longest-waiting claimable job of the queue has waited",
                labels=["queue"],
            ),
        )

    async def refresh(self) -> list[QueueStats]:
        """Ask the brokers now (from the workers' event loop); the answer is what a
        scrape from inside the loop reports."""
        found: list[QueueStats] = []
        for broker, queues in self._groups(self._snapshot()):
            found += await self._query(broker, queues)
        return found

    def _snapshot(self) -> list[_Source]:
        with self._lock:
            return list(self._sources)

    @staticmethod
    def _groups(sources: Sequence[_Source]) -> list[tuple[Broker, list[str]]]:
        groups: dict[int, tuple[Broker, list[str]]] = {}
        for source in sources:
            _, queues = groups.setdefault(id(source.broker), (source.broker, []))
            queues += [q for q in source.queues if q not in queues]
        return list(groups.values())

    async def _query(self, broker: Broker, queues: list[str]) -> list[QueueStats]:
        try:
            with anyio.fail_after(self.timeout):
                stats = await broker.queue_stats(queues)
        except Exception as exc:
            self._metrics.broker_error("queue_stats", exc)
            log.warning("metrics: could not read queue stats from the broker: %s", exc)
            return []
        with self._lock:
            self._last.update((s.queue, s) for s in stats)
        return stats

    def _fetch(self) -> list[QueueStats]:
        sources = self._snapshot()
        here = threading.get_ident()
        found: list[QueueStats] = []
        for broker, queues in self._groups(sources):
            source = next(s for s in sources if s.broker is broker)
            if source.thread == here:
                with self._lock:
                    found += [self._last[q] for q in queues if q in self._last]
                continue
            try:
                found += anyio.from_thread.run(self._query, broker, queues, token=source.token)
            except Exception as exc:  # the loop has ended (the worker stopped meanwhile)
                log.debug("metrics: queue stats unavailable: %s", exc)
        return found

    def collect(self) -> Iterable[Metric]:
        jobs, oldest = self._families()
        for stats in self._fetch():
            for state, n in stats.counts.items():
                jobs.add_metric([stats.queue, state.value], n)
            oldest.add_metric([stats.queue], stats.oldest_waiting)
        return (jobs, oldest)


class _Histogram:
    """A histogram kept as plain numbers: the event loop writes, a scrape reads.

    No lock: one writer (the worker's event loop); a scrape from another thread may see
    an observation in ``count`` a moment before it shows in ``sum`` (harmless for
    monitoring, and what keeps an observation to a bisect and three additions)."""

    __slots__ = ("bounds", "buckets", "count", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.buckets[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, count)`` pairs as Prometheus wants them, ``+Inf`` last."""
        out: list[tuple[str, float]] = []
        total = 0
        for bound, n in zip((*self.bounds, math.inf), list(self.buckets), strict=True):
            total += n
            out.append(("+Inf" if bound == math.inf else repr(float(bound)), total))
        return out


class _Series:
    """The numbers of one (task, queue)."""

    __slots__ = ("duration", "lease_losses", "mismatches", "outcomes", "wait")

    def __init__(self) -> None:
        self.outcomes = dict.fromkeys(JobOutcome, 0)
        self.duration = _Histogram(DURATION_BUCKETS)
        self.wait = _Histogram(WAIT_BUCKETS)
        self.mismatches = 0
        self.lease_losses = 0


class _JobCollector(Collector):
    """Exports the job series of a :class:`Metrics` (read at scrape time)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> list[Metric]:
        return [
            CounterMetricFamily(
                "typedq_jobs", "Job attempts by how they ended", labels=["task", "queue", "outcome"]
            ),
            HistogramMetricFamily(
                "typedq_job_duration_seconds",
                "Seconds from an attempt's start to its outcome",
                labels=["task", "queue"],
            ),
            HistogramMetricFamily(
                "typedq_queue_wait_seconds",
                "Seconds from when a job became due (enqueue, eta, retry) to an attempt's start",
                labels=["task", "queue"],
            ),
            GaugeMetricFamily("typedq_worker_in_flight", "Jobs the workers of this process hold"),
            CounterMetricFamily(
                "typedq_schema_mismatches",
                "Jobs whose producer's input schema fingerprint differs from the worker's",
                labels=["task", "queue"],
            ),
            CounterMetricFamily(
                "typedq_lease_losses",
                "Leases lost while running, or outcomes refused because another lease owns the job",
                labels=["task", "queue"],
            ),
            CounterMetricFamily(
                "typedq_broker_errors",
                "Failed broker calls (each is retried)",
                labels=["operation"],
            ),
            CounterMetricFamily(
                "typedq_stalled_recovered",
                "Jobs whose lease expired, recovered by this process's workers",
            ),
        ]

    def collect(self) -> Iterable[Metric]:
        metrics = self._metrics
        families = self._families()
        jobs, duration, wait, in_flight, mismatches, losses, errors, stalled = families
        assert isinstance(jobs, CounterMetricFamily)
        assert isinstance(duration, HistogramMetricFamily)
        assert isinstance(wait, HistogramMetricFamily)
        assert isinstance(in_flight, GaugeMetricFamily)
        assert isinstance(mismatches, CounterMetricFamily)
        assert isinstance(losses, CounterMetricFamily)
        assert isinstance(errors, CounterMetricFamily)
        assert isinstance(stalled, CounterMetricFamily)
        for (task, queue), series in list(metrics._series.items()):
            for outcome, n in list(series.outcomes.items()):
                jobs.add_metric([task, queue, outcome.value], n)
            for family, histogram in ((duration, series.duration), (wait, series.wait)):
                family.add_metric(
                    [task, queue], buckets=histogram.cumulative(), sum_value=histogram.sum
                )
            mismatches.add_metric([task, queue], series.mismatches)
            losses.add_metric([task, queue], series.lease_losses)
        in_flight.add_metric([], metrics._in_flight())
        for operation, n in list(metrics._broker_errors.items()):
            errors.add_metric([operation], n)
        stalled.add_metric([], metrics._stalled)
        return families


class Metrics(WorkerObserver):
    """The Prometheus series of typedq workers, in one registry.

    :param registry: where the collectors go (default: prometheus_client's global
        registry); one :class:`Metrics` per registry
    :param queue_stats_timeout: seconds a scrape waits for the broker's queue stats

    Attach it to every worker whose jobs it counts (:meth:`attach`); the counters add
    up the workers of this process. Events only add to plain numbers (no lock, no
    prometheus_client call on the job path): the series are built when scraped.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        queue_stats_timeout: float = 5.0,
    ) -> None:
        self.registry = registry
        self._series: dict[tuple[str, str], _Series] = {}
        self._broker_errors: dict[str, int] = {}
        self._stalled = 0
        self._workers: list[Worker[Any, Any]] = []
        #: What queue waits are measured on: the clock of the workers this watches (the
        #: system clock until one starts; a VirtualClock in tests).
        self._clock: Clock = SYSTEM_CLOCK
        # The task names the attached workers' apps declare: the only task labels.
        self._declared: set[str] = set()
        self.jobs = _JobCollector(self)
        self.queues = QueueCollector(self, queue_stats_timeout)
        if registry is not None:
            registry.register(self.jobs)
            registry.register(self.queues)

    def attach(self, worker: Worker[TIn, TOut]) -> Worker[TIn, TOut]:
        """Count ``worker``'s jobs (call before it starts); returns the worker."""
        self._declare(worker)
        worker.observe(self)
        return worker

    def _declare(self, worker: Worker[Any, Any]) -> None:
        self._declared.update(worker.tasks)
        self._declared.update(getattr(worker.app, "tasks", ()))

    def _in_flight(self) -> float:
        return float(sum(w.running for w in list(self._workers)))

    def _of(self, job: ClaimedJob) -> _Series:
        message = job.message
        task = message.task if message.task in self._declared else UNKNOWN_TASK
        key = (task, message.queue)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = _Series()
        return series

    # -- the observer ----------------------------------------------------------------

    def worker_started(self, worker: Worker[Any, Any]) -> None:
        self._clock = worker.clock
        self._declare(worker)
        self._workers.append(worker)
        self.queues.add(worker)

    def worker_stopped(self, worker: Worker[Any, Any]) -> None:
        self._workers = [w for w in self._workers if w is not worker]
        self.queues.remove(worker)

    def job_started(self, job: ClaimedJob) -> None:
        # Every attempt, from when it became due this time: a retry from its due time
        # (not its first enqueue), a job handed back or recovered from the hand-back.
        wait = self._clock.time() - job.due_at()
        self._of(job).wait.observe(wait if wait > 0 else 0.0)

    def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
        series = self._of(job)
        series.outcomes[outcome] += 1
        series.duration.observe(duration)

    def schema_mismatch(self, job: ClaimedJob) -> None:
        self._of(job).mismatches += 1

    def lease_lost(self, job: ClaimedJob) -> None:
        self._of(job).lease_losses += 1

    def broker_error(self, operation: str, error: BaseException) -> None:
        self._broker_errors[operation] = self._broker_errors.get(operation, 0) + 1

    def stalled_recovered(self, count: int) -> None:
        self._stalled += count

    # -- serving -----------------------------------------------------------------------

    # This machine only by default, like the dashboard: the series name the app's tasks
    # and queues, and a scraper elsewhere is a choice to make (addr="0.0.0.0").
    def serve(self, port: int, addr: str = "127.0.0.1") -> tuple[int, Any]:
        """Serve ``/metrics`` of this registry over HTTP in a daemon thread.

        :param port: 0 picks a free port
        :return: the port it listens on, and the server (``server.shutdown()`` stops it)
        """
        if self.registry is None:
            raise ConfigError("Metrics(registry=None) has no registry to serve")
        return serve_registry(self.registry, port, addr)


def serve_registry(
    registry: CollectorRegistry,
    port: int,
    addr: str = "127.0.0.1",
) -> tuple[int, Any]:
    """Serve ``/metrics`` of ``registry`` over HTTP in a daemon thread (``typedq worker
    --metrics-port``, and the ``--processes`` supervisor's group endpoint).

    :param port: 0 picks a free port
    :return: the port it listens on, and the server (``server.shutdown()`` stops it)
    :raises ConfigError: the address cannot be served (one line: the port is taken, ...)
    """
    from prometheus_client import start_http_server

    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {addr}:{port}: {exc.strerror}; choose another "
            "--metrics-port (or --metrics-host)"
        ) from None
    return int(server.server_port), server
