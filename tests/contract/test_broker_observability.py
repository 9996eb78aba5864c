"""Broker contract, observability: ``queue_stats`` (what a metrics scrape reads) and the
worker and queue registries (``typedq inspect --workers``, queue discovery).

Runs once per broker against the :class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

import time

import anyio
import pytest

from tests.support import In, Out, claim_one, connected, msg, one, sleep_until
from typedq import App, InvalidName, JobState
from typedq.broker.base import Broker, ClaimedJob, Failure, Release, WorkerInfo
from typedq.observe import JobOutcome, WorkerObserver

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


def info(worker_id: str, queues: list[str], in_flight: int = 0) -> WorkerInfo:
    now = time.time()
    return WorkerInfo(
        id=worker_id,
        host="host-a",
        pid=1234,
        queues=queues,
        concurrency=8,
        in_flight=in_flight,
        started_at=now,
        heartbeat_at=now,
        version="0.1.0",
    )


async def test_queue_stats_counts_every_state_per_queue_in_order(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(queue="q"), msg(queue="q"), msg(queue="q", delay=600)])
        await broker.enqueue([msg(queue="r")])
        await claim_one(broker, "r")
        stats = await broker.queue_stats(["r", "q", "empty"])
        assert [s.queue for s in stats] == ["r", "q", "empty"]
        r, q, empty = stats
        assert r.counts[JobState.ACTIVE] == 1
        assert r.counts[JobState.WAITING] == 0
        assert q.counts[JobState.WAITING] == 2
        assert q.counts[JobState.SCHEDULED] == 1
        for s in stats:
            assert s.counts == await broker.counts(s.queue)
        assert all(n == 0 for n in empty.counts.values())
        assert empty.oldest_waiting == 0.0
        assert r.oldest_waiting == 0.0  # its one job is active, nothing waits


async def test_queue_stats_ages_the_oldest_waiting_job(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        before = time.time()
        await broker.enqueue([msg(queue="q", priority=0)])
        await sleep_until(before + 0.3)
        # A younger job of a higher priority does not hide the older one.
        await broker.enqueue([msg(queue="q", priority=5)])
        (stats,) = await broker.queue_stats(["q"])
        assert stats.oldest_waiting >= 0.25
        assert stats.oldest_waiting <= time.time() - before + 1.0
        await claim_one(broker, "q")
        await claim_one(broker, "q")
        (stats,) = await broker.queue_stats(["q"])
        assert stats.oldest_waiting == 0.0


async def test_queue_stats_counts_a_due_scheduled_job_from_its_due_time(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        due = time.time() + 0.2
        await broker.enqueue([msg(queue="q", eta=due)])
        (stats,) = await broker.queue_stats(["q"])
        assert stats.oldest_waiting == 0.0  # not due yet: it does not wait
        await sleep_until(due + 0.3)
        (stats,) = await broker.queue_stats(["q"])
        assert stats.oldest_waiting >= 0.25
        assert stats.oldest_waiting <= time.time() - due + 1.0


async def test_a_scheduled_job_moved_to_waiting_ages_from_its_due_time(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(queue="q", priority=5)])
        enqueued = time.time()
        await broker.enqueue([msg(queue="q", delay=1.0)])
        await broker.enqueue([msg(queue="q", priority=1, eta=enqueued + 1.0)])
        await sleep_until(enqueued + 1.2)
        # The claim moves the due jobs to waiting, and takes the higher-priority one.
        claimed = await claim_one(broker, "q")
        assert claimed.message.priority == 5
        (stats,) = await broker.queue_stats(["q"])
        assert stats.counts[JobState.WAITING] == 2
        # Each has waited since it became due (~0.2 s), not since its enqueue (~1.2 s).
        assert 0.1 <= stats.oldest_waiting < 0.8


# -- waiting since it became due again ---------------------------------------------
#
# A job that waits again (a retry, a hand-back, a stall recovery, a manual retry)
# counts its wait from then, in the oldest-waiting age and in the ClaimedJob's due time
# (what typedq_queue_wait_seconds measures), never from its first enqueue: one retried
# job must not make a healthy queue look behind. Each job below was enqueued half a
# second (OLD) before it waits again, so a wait counted from the enqueue cannot pass: the
# checks tell the two apart by OLD / 2, beyond their 0.1 s tolerances for a busy machine.

OLD = 0.5


async def aged_claim(broker: Broker, *, lease: float = 30.0) -> tuple[ClaimedJob, float]:
    """Enqueue one job, let it age OLD seconds, claim it: the claim and the enqueue time."""
    enqueued = time.time()
    await broker.enqueue([msg(queue="q")])
    # The broker's clock stamps the job during the call (a bracket, not a margin: a
    # loaded box can take half a second for one call).
    answered = time.time()
    await anyio.sleep(OLD)
    first = await claim_one(broker, lease=lease)
    assert first.attempt == 1
    assert first.run_at == 0.0  # due since its enqueue
    assert first.due_at() == first.enqueued_at
    assert enqueued - 0.05 <= first.enqueued_at <= answered + 0.05
    return first, enqueued


async def waits_since(broker: Broker, since: float, enqueued: float) -> ClaimedJob:
    """The queue's one waiting job has waited since ``since`` (not since ``enqueued``) in
    queue_stats, and its claim says it became due then; returns the claim."""
    (stats,) = await broker.queue_stats(["q"])
    assert stats.counts[JobState.WAITING] == 1
    now = time.time()
    assert stats.oldest_waiting <= now - since + 0.1
    assert stats.oldest_waiting < now - enqueued - OLD / 2
    again = await claim_one(broker)
    assert since - 0.1 <= again.due_at() <= time.time() + 0.05
    assert again.due_at() == again.run_at
    assert again.due_at() - again.enqueued_at >= OLD * 0.9
    # The job record says the same (inspect's "due").
    assert (await one(broker, again.message.id)).run_at == again.run_at
    return again


async def test_a_retry_after_a_backoff_waits_from_its_due_time(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        first, enqueued = await aged_claim(broker)
        failed = time.time()
        await broker.fail(
            [Failure(id=first.message.id, token=first.token, error=b"\x90", retry_delay=0.3)]
        )
        (stats,) = await broker.queue_stats(["q"])
        assert stats.oldest_waiting == 0.0  # backing off: not due, so not waiting
        due = (await one(broker, first.message.id)).run_at
        assert failed + 0.25 <= due <= time.time() + 0.35
        await sleep_until(due + 0.2)
        # Due but not moved to waiting yet: counted from its due time.
        (stats,) = await broker.queue_stats(["q"])
        assert 0.15 <= stats.oldest_waiting <= time.time() - due + 0.1
        again = await claim_one(broker)
        assert again.attempt == 2
        assert again.due_at() == pytest.approx(due, abs=1e-3)
        assert time.time() - again.due_at() < time.time() - enqueued - OLD / 2


async def test_a_scheduled_retry_moved_to_waiting_keeps_its_due_time(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        first, enqueued = await aged_claim(broker)
        await broker.fail(
            [Failure(id=first.message.id, token=first.token, error=b"\x90", retry_delay=0.2)]
        )
        due = (await one(broker, first.message.id)).run_at
        await sleep_until(due + 0.1)
        # A claim moves it to waiting, taking the higher-priority job in front of it.
        await broker.enqueue([msg(queue="q", priority=5)])
        blocker = await claim_one(broker)
        assert blocker.message.priority == 5
        assert (await one(broker, first.message.id)).state is JobState.WAITING
        again = await waits_since(broker, due, enqueued)
        assert again.due_at() == pytest.approx(due, abs=1e-3)


async def test_an_immediate_retry_waits_from_the_failure(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        first, enqueued = await aged_claim(broker)
        failed = time.time()
        await broker.fail(
            [Failure(id=first.message.id, token=first.token, error=b"\x90", retry_delay=0.0)]
        )
        again = await waits_since(broker, failed, enqueued)
        assert again.attempt == 2


async def test_a_handed_back_job_waits_from_the_hand_back(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        first, enqueued = await aged_claim(broker)
        released = time.time()
        await broker.release([Release(first.message.id, first.token)])
        again = await waits_since(broker, released, enqueued)
        assert again.attempt == 1  # handed back unrun


async def test_a_recovered_job_waits_from_its_recovery(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, lease=0.2) as broker:
        _, enqueued = await aged_claim(broker, lease=0.2)
        await anyio.sleep(0.35)
        recovered = time.time()
        assert await broker.recover_stalled() == 1
        again = await waits_since(broker, recovered, enqueued)
        assert again.stalls == 1


async def test_a_manually_retried_job_waits_from_the_retry(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        first, enqueued = await aged_claim(broker)
        await broker.fail([Failure(id=first.message.id, token=first.token, error=b"\x90")])
        assert (await one(broker, first.message.id)).state is JobState.FAILED
        retried = time.time()
        await broker.retry([first.message.id])
        again = await waits_since(broker, retried, enqueued)
        assert again.attempt == 1


async def test_a_workflow_step_waits_from_its_hand_off(app_name: str, broker_url: str) -> None:
    """A chain's second step and a fan-in callback become due when the step before them
    completes or the last member settles, not when the flow was enqueued."""
    app = App(app_name, broker=broker_url)
    started: dict[str, ClaimedJob] = {}
    finished: dict[str, float] = {}

    class Seen(WorkerObserver):
        def job_started(self, job: ClaimedJob) -> None:
            started[job.message.task] = job

        def job_finished(self, job: ClaimedJob, outcome: JobOutcome, duration: float) -> None:
            finished[job.message.task] = time.time()

    @app.task
    async def slow(x: In) -> In:
        await anyio.sleep(OLD)
        return x

    @app.task
    async def after(x: In) -> Out:
        return Out(x.n)

    @app.task
    async def total(xs: list[In]) -> Out:
        return Out(sum(x.n for x in xs))

    async with app, app.worker(concurrency=4).observe(Seen()):
        chain = await slow.then(after).enqueue(In(n=1))
        assert await chain.result(timeout=30) == Out(1)
        fan = await slow.map([In(n=1), In(n=2)]).then(total).enqueue()
        assert await fan.result(timeout=30) == Out(3)
    for task in ("after", "total"):
        job = started[task]
        # Due at the hand-off: after the slow step ran (OLD seconds after the enqueue).
        assert job.due_at() - job.enqueued_at >= OLD * 0.9, task
        assert job.due_at() == job.run_at
    assert started["total"].due_at() <= finished["slow"] + 0.1


async def test_registry_lists_live_workers_and_ages_out_expired_ones(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        assert await broker.list_workers() == []
        await broker.register_worker(info("w-long", ["a", "b"]), ttl=60)
        await broker.register_worker(info("w-short", ["c"]), ttl=0.3)
        assert [w.id for w in await broker.list_workers()] == ["w-long", "w-short"]
        # A heartbeat replaces the entry.
        await broker.register_worker(info("w-long", ["a", "b"], in_flight=3), ttl=60)
        (long, _) = await broker.list_workers()
        assert long.in_flight == 3
        assert long.queues == ["a", "b"]
        assert long.host == "host-a"
        await anyio.sleep(0.6)
        assert [w.id for w in await broker.list_workers()] == ["w-long"]
        await broker.unregister_worker("w-long")
        await broker.unregister_worker("never-registered")
        assert await broker.list_workers() == []
        # Queues stay registered after their workers are gone.
        assert {"a", "b", "c"} <= set(await broker.list_queues())


async def test_registry_refuses_a_worker_id_that_cannot_be_a_key(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        with pytest.raises(InvalidName, match="invalid worker id 'a b'"):
            await broker.register_worker(info("a b", ["q"]), ttl=10)
        assert await broker.list_workers() == []


async def test_queues_a_producer_enqueued_to_are_registered(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="mail")
    async def send(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="bulk")
    async def bulk(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="steps")
    async def step(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="steps2")
    async def after(x: Out) -> Out:
        return x

    async with app:  # no worker anywhere: only producers know these queues
        await send.enqueue(In(n=1))
        await bulk.enqueue_many([In(n=1), In(n=2)])
        expected = {"mail", "bulk", "steps", "steps2"}
        await step.then(after).enqueue(In(n=3))
        # Retention may drop every job of a queue: the registry keeps the queue.
        assert expected <= set(await app.broker.list_queues())
