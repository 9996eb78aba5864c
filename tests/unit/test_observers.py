"""The worker's observer interface and the metrics collectors in a user's own registry:
events in order with their outcomes, an observer that raises is logged once and never
breaks the worker, and queue gauges read from the broker by a scrape from another
thread (fresh) or from inside the event loop (the last answer)."""

from __future__ import annotations

import anyio
import anyio.to_thread
import msgspec
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from typedq import App, Backoff, JobContext, JobFailed
from typedq.broker.base import ClaimedJob, JobMessage, new_claim_id
from typedq.metrics import UNKNOWN_TASK, Metrics
from typedq.observe import JobOutcome, WorkerObserver

pytestmark = pytest.mark.anyio


class N(msgspec.Struct, frozen=True):
    n: int


class Recorder(WorkerObserver):
    def __init__(self) -> None:
        self.events: list[tuple[str, str, int, str]] = []
        self.started = self.stopped = 0

    def worker_started(self, worker: object) -> None:
        self.started += 1

    def worker_stopped(self, worker: object) -> None:
        self.stopped += 1

    def job_started(self, job: ClaimedJob) -> None:
        self.events.append(("start", job.message.id, job.attempt, ""))

    def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
        assert duration >= 0
        self.events.append(("finish", job.message.id, job.attempt, outcome.value))


class Raiser(WorkerObserver):
    def job_started(self, job: ClaimedJob) -> None:
        raise RuntimeError("observer bug")


def make_app(name: str) -> App:
    app = App(name, broker="memory://")

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0))
    async def maybe(item: N) -> N:
        if item.n < 0:
            raise ValueError("negative")
        return item

    return app


async def test_observers_see_every_attempt_and_one_that_raises_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app("observed")
    task = app.tasks["maybe"]
    recorder = Recorder()
    async with app:
        worker = app.worker(concurrency=1).observe(Raiser()).observe(recorder)
        async with worker:
            good = await task.enqueue(N(1))
            bad = await task.enqueue(N(-1))
            await good.result(timeout=10)
            with pytest.raises(JobFailed):
                await bad.result(timeout=10)
        with pytest.raises(RuntimeError, match="before the worker starts"):
            worker.observe(Recorder())
    assert recorder.started == recorder.stopped == 1
    # In order per job (the worker may start one job before another's finish is told).
    assert [e for e in recorder.events if e[1] == good.id] == [
        ("start", good.id, 1, ""),
        ("finish", good.id, 1, "completed"),
    ]
    assert [e for e in recorder.events if e[1] == bad.id] == [
        ("start", bad.id, 1, ""),
        ("finish", bad.id, 1, "retried"),
        ("start", bad.id, 2, ""),
        ("finish", bad.id, 2, "failed"),
    ]
    assert len(recorder.events) == 6
    complaints = [r for r in caplog.records if "(logged once" in r.getMessage()]
    assert len(complaints) == 1
    assert "raised in job_started" in complaints[0].getMessage()


def _queue_gauge(text: str, queue: str, state: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "typedq_queue_jobs" and sample.labels == {
                "queue": queue,
                "state": state,
            }:
                return sample.value
    return None


async def test_metrics_in_a_users_registry_scraped_from_a_thread_and_from_the_loop() -> None:
    app = make_app("registry")
    task = app.tasks["maybe"]
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    async with app:
        for i in range(3):
            await task.enqueue(N(i), delay=3600)
        worker = metrics.attach(app.worker(concurrency=2))
        async with worker:
            # From another thread: the scrape asks the loop, which answers at once.
            text = (await anyio.to_thread.run_sync(generate_latest, registry)).decode()
            assert _queue_gauge(text, "default", "scheduled") == 3
            job = await task.enqueue(N(9))
            await job.result(timeout=10)
            # From inside the loop: the last answer until refreshed.
            stale = generate_latest(registry).decode()
            assert _queue_gauge(stale, "default", "completed") == 0
            await metrics.queues.refresh()
            fresh = generate_latest(registry).decode()
            assert _queue_gauge(fresh, "default", "completed") == 1
        # A stopped worker's queues are no longer read.
        after = (await anyio.to_thread.run_sync(generate_latest, registry)).decode()
        assert _queue_gauge(after, "default", "scheduled") is None
        # Counted once the worker has settled the job (it has, once it stopped).
        assert 'typedq_jobs_total{outcome="completed",queue="default",task="maybe"} 1.0' in after


def test_histograms_count_a_value_on_a_bound_in_that_bucket_and_add_up() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    job = ClaimedJob(
        message=JobMessage(id="j1", task="t", queue="q", payload=b""),
        token=new_claim_id(),
        attempt=2,  # not a first attempt: no queue wait observed
        enqueued_at=0.0,
    )
    for seconds in (0.001, 0.5, 1000.0):
        metrics.job_finished(job, JobOutcome.COMPLETED, seconds)
    metrics.broker_error("claim", RuntimeError("x"))
    metrics.stalled_recovered(2)
    found = {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        # No worker attached: "t" is not a declared task, so it is counted as unknown.
        if s.labels.get("task", UNKNOWN_TASK) == UNKNOWN_TASK
    }
    bucket = "typedq_job_duration_seconds_bucket"
    assert found[(bucket, "0.001")] == 1  # a value on a bound counts in that bucket
    assert found[(bucket, "0.25")] == 1
    assert found[(bucket, "0.5")] == 2
    assert found[(bucket, "300.0")] == 2
    assert found[(bucket, "+Inf")] == 3
    assert found[("typedq_job_duration_seconds_count", "")] == 3
    assert found[("typedq_job_duration_seconds_sum", "")] == pytest.approx(1000.501)
    assert found[("typedq_queue_wait_seconds_count", "")] == 0
    text = generate_latest(registry).decode()
    assert 'typedq_jobs_total{outcome="completed",queue="q",task="_unknown"} 3.0' in text
    assert 'typedq_jobs_total{outcome="failed",queue="q",task="_unknown"} 0.0' in text
    assert found[("typedq_broker_errors_total", "")] == 1
    assert found[("typedq_stalled_recovered_total", "")] == 2


async def test_queue_wait_of_a_retry_counts_from_its_due_time_not_its_enqueue() -> None:
    """A job waits 1.2 s for a worker, fails, and is retried after a 0.3 s backoff: its
    retry's queue wait is the short one from its due time, not 1.5 s and more from its
    first enqueue."""
    app = App("retry-wait", broker="memory://")
    registry = CollectorRegistry()
    metrics = Metrics(registry)

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0.3))
    async def once(item: N, ctx: JobContext) -> N:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        return item

    async with app:
        job = await once.enqueue(N(1))
        await anyio.sleep(1.2)
        async with metrics.attach(app.worker(concurrency=1)):
            assert await job.result(timeout=10) == N(1)
        text = generate_latest(registry).decode()
    found = {
        (s.name, s.labels.get("le", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("typedq_queue_wait_seconds") and s.labels.get("task") == "once"
    }
    assert found[("typedq_queue_wait_seconds_count", "")] == 2
    # The first attempt waited 1.2 s or more; the retry well under a second.
    assert found[("typedq_queue_wait_seconds_bucket", "1.0")] == 1
    assert found[("typedq_queue_wait_seconds_bucket", "+Inf")] == 2
    assert 1.2 <= found[("typedq_queue_wait_seconds_sum", "")] < 2.2


async def test_jobs_of_undeclared_tasks_share_one_task_label() -> None:
    # Issue 24 defect 9: each bogus task name of a claimed job made series of its own.
    app = make_app("bogus")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    bogus = [
        JobMessage(id=f"bogus-{i}", task=f"nosuch{i}", queue="default", payload=b"\x80")
        for i in range(50)
    ]
    async with app:
        await app.broker.enqueue(bogus)
        job = await app.tasks["maybe"].enqueue(N(1))
        async with metrics.attach(app.worker(concurrency=4)):
            await job.result(timeout=10)
            for message in bogus:
                assert await app.broker.wait_finished(message.id, 10) is not None
        text = generate_latest(registry).decode()
    tasks = {
        sample.labels["task"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "task" in sample.labels
    }
    assert tasks == {"maybe", UNKNOWN_TASK}
    assert (
        f'typedq_jobs_total{{outcome="failed",queue="default",task="{UNKNOWN_TASK}"}} 50.0' in text
    )


def test_metrics_serve_on_loopback_by_default() -> None:
    metrics = Metrics(CollectorRegistry())
    port, server = metrics.serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert port == server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
