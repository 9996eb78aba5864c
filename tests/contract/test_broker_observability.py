"""Broker contract, observability: ``queue_stats`` (what a metrics scrape reads) and the
worker and queue registries (``typedq inspect --workers``, queue discovery).

Runs once per broker against the :class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

import time

import anyio
import pytest

from tests.support import In, Out, claim_one, connected, msg, sleep_until
from typedq import App, InvalidName, JobState
from typedq.broker.base import WorkerInfo

pytestmark = pytest.mark.anyio


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
        await broker.enqueue([msg(queue="q", delay=2.0)])
        await broker.enqueue([msg(queue="q", priority=1, eta=enqueued + 2.0)])
        await sleep_until(enqueued + 2.2)
        # The claim moves the due jobs to waiting, and takes the higher-priority one.
        claimed = await claim_one(broker, "q")
        assert claimed.message.priority == 5
        (stats,) = await broker.queue_stats(["q"])
        assert stats.counts[JobState.WAITING] == 2
        # Each has waited since it became due (~0.2 s), not since its enqueue (~2.2 s).
        assert 0.1 <= stats.oldest_waiting < 1.5


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
