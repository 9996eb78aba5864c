"""Direct hand-off on Redis Cluster (broker/redis/direct.py): a worker of one queue
registers in that queue's slot and blocks on the node owning it; an enqueue hands it
the job already claimed; a worker of several queues (several slots) waits by sharded
pub/sub as before. Real 3-primary cluster started by the suite."""

from __future__ import annotations

from collections import Counter

import anyio
import pytest

from tests.redis_harness import RedisCluster
from tests.redis_support import broker_at, message
from tests.support import In, Out
from typedq import App
from typedq.broker.base import ClaimedJob, JobState
from typedq.broker.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.asyncio_only]

LONG = 3600.0
PROMPT = 20.0


@pytest.fixture
def url(redis_cluster: RedisCluster) -> str:
    redis_cluster.flushall()
    return redis_cluster.url


def handed(job: ClaimedJob) -> bool:
    return job.token.endswith("." + job.message.id)


async def test_an_enqueue_hands_its_job_to_the_worker_on_the_queues_node(url: str) -> None:
    async with broker_at(url, "cho") as worker, broker_at(url, "cho") as producer:
        assert await worker.claim(["q"], 4, worker_id="w", lease=30) == []
        got: list[list[ClaimedJob]] = []

        async def wait() -> None:
            got.append(await worker.wait_for_handoff(["q"], 4, LONG, worker_id="w", lease=30))

        with anyio.fail_after(PROMPT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                while "w" not in worker._registrations:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
                await producer.enqueue([message("j")])
        ((job,),) = got
        assert job.message.id == "j"
        assert handed(job)
        counts = await producer.counts("q")
        assert counts[JobState.ACTIVE] == 1
        assert counts[JobState.WAITING] == 0
        await worker.end_handoff("w")


async def test_a_worker_of_queues_on_several_slots_waits_by_pub_sub(url: str) -> None:
    async with broker_at(url, "cho") as worker, broker_at(url, "cho") as producer:
        assert await worker.claim(["a", "b"], 4, worker_id="w", lease=30) == []

        async def enqueue_later() -> None:
            await anyio.sleep(0.3)
            await producer.enqueue([message("j", queue="b")])

        with anyio.fail_after(PROMPT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(enqueue_later)
                got = await worker.wait_for_handoff(["a", "b"], 4, LONG, worker_id="w", lease=30)
        assert got == []
        assert worker._registrations == {}
        (job,) = await worker.claim(["a", "b"], 4, worker_id="w", lease=30)
        assert job.message.id == "j"
        assert not handed(job)


async def test_trickled_jobs_run_once_each_mostly_handed(url: str) -> None:
    app = App("chotrickle", broker=url)
    runs: Counter[int] = Counter()

    @app.task
    async def tally(x: In) -> Out:
        runs[x.n] += 1
        return Out(x.n)

    with anyio.fail_after(60):
        async with app:
            async with app.worker(concurrency=2) as w1, app.worker(concurrency=2) as w2:
                jobs = []
                for i in range(60):
                    jobs.append(await tally.enqueue(In(i)))
                    await anyio.sleep(0.002)
                results = [await job.result(timeout=10) for job in jobs]
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            records = await broker.get([j.id for j in jobs], queue="default")
    assert results == [Out(i) for i in range(60)]
    assert runs == dict.fromkeys(range(60), 1)
    assert w1.stats.completed + w2.stats.completed == 60
    assert all(r is not None and r.state is JobState.COMPLETED for r in records)
