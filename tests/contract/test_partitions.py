"""Partitioned queues on every broker: ``@app.task(queue=..., partitions=N)`` stores each
job in the partition its id hashes to, job handles find it there, dedup by id holds,
and a worker of the queue runs the jobs of every partition."""

from __future__ import annotations

import anyio
import pytest

from tests.support import TEST_DEADLINE, In, Out, connected, msg
from typedq import App, JobState, QueueFull
from typedq.names import partition_queue

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def test_jobs_of_a_partitioned_task_complete_and_handles_find_them(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="emails", partitions=4)
    async def send(x: In) -> Out:
        return Out(x.n * 2)

    partitions = [f"emails.p{i}" for i in range(4)]
    assert app.queues == partitions
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await send.enqueue_many(In(i) for i in range(40))
            for job in jobs:
                assert job.queue == partition_queue("emails", 4, job.id)
                assert await job.status() is JobState.WAITING
            waiting = [(await app.broker.counts(q)).get(JobState.WAITING, 0) for q in partitions]
            assert sum(waiting) == 40
            assert all(n > 0 for n in waiting)  # 40 ids spread over all 4 partitions
            # A worker asked for the parent queue serves every partition.
            async with app.worker(queues=["emails"], concurrency=4) as worker:
                assert worker.queues == partitions
                results = [await job.result(timeout=10) for job in jobs]
            assert results == [Out(i * 2) for i in range(40)]
            # A handle made from the id alone finds the job in its partition.
            again = send.job(jobs[7].id)
            assert again.queue == jobs[7].queue
            assert await again.status() is JobState.COMPLETED
            assert await again.result(timeout=1) == Out(14)


async def test_dedup_by_id_and_cancel_on_a_partitioned_queue(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="hot", partitions=8, key=lambda x: str(x.n))
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            first = await work.enqueue(In(5), job_id="order-5")
            second = await work.enqueue(In(6), job_id="order-5")
            assert first.created
            assert not second.created
            assert second.id == first.id
            assert second.queue == first.queue
            keyed = [await work.enqueue(In(9)) for _ in range(3)]
            assert [j.created for j in keyed] == [True, False, False]
            assert {j.queue for j in keyed} == {partition_queue("hot", 8, "work:9")}
            total = 0
            for q in app.queues:
                total += (await app.broker.counts(q)).get(JobState.WAITING, 0)
            assert total == 2
            assert await first.cancel()
            assert await first.status() is JobState.CANCELLED
            async with app.worker(concurrency=2):
                assert await keyed[0].result(timeout=10) == Out(9)


async def test_a_flow_of_a_partitioned_task_stays_in_one_partition(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="hot", partitions=8)
    async def step(x: In) -> In:
        return In(x.n + 1)

    @app.task(queue="hot", partitions=8)
    async def total(xs: list[In]) -> Out:
        return Out(sum(x.n for x in xs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            chain = step.then(step).then(step)
            spec = chain.spec(In(0), job_id="flow-1")
            # Every job of a flow goes to the partition of the flow id (one slot on a cluster).
            assert {m.queue for m in spec.steps} == {step.queue_for("flow-1")}
            jobs = [await chain.enqueue(In(i), job_id=f"flow-{i}") for i in range(6)]
            assert [j.queue for j in jobs] == [step.queue_for(f"flow-{i}") for i in range(6)]
            assert [await j.result(timeout=10) for j in jobs] == [In(i + 3) for i in range(6)]
            fan = step.map([In(i) for i in range(5)]).then(total)
            done = await fan.enqueue()
            assert await done.result(timeout=10) == Out(sum(range(1, 6)))


async def test_max_queue_length_is_shared_by_the_partitions(app_name: str, broker_url: str) -> None:
    """Issue 24: ``max_queue_length`` once applied to each partition (P partitions held P
    times the cap). Each partition of a queue split in P now holds ceil(cap / P) pending
    jobs, so the queue never holds more than cap + P - 1 (here 10 -> 3 per partition, at
    most 12); an unsplit queue keeps the whole cap. The same on every broker."""
    app = App(app_name, broker=broker_url, max_queue_length=10)

    @app.task(queue="hot", partitions=4)
    async def split(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="plain")
    async def whole(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            # Ids chosen so that every partition is offered exactly 10 jobs (random ids
            # left a partition with fewer than 3 now and then).
            offered = dict.fromkeys(split.queues, 0)
            ids: list[str] = []
            i = 0
            while len(ids) < 40:
                job_id = f"job-{i}"
                i += 1
                if offered[split.queue_for(job_id)] < 10:
                    offered[split.queue_for(job_id)] += 1
                    ids.append(job_id)
            refusals: list[str] = []
            for n, job_id in enumerate(ids):
                try:
                    await split.enqueue(In(n), job_id=job_id)
                except QueueFull as exc:
                    refusals.append(str(exc))
            assert all("max_queue_length=3" in r for r in refusals)
            per_partition = [(await app.broker.counts(q))[JobState.WAITING] for q in split.queues]
            assert per_partition == [3, 3, 3, 3]
            assert len(refusals) == 28
            # A batch is held to the same share (nothing of a refused batch is stored).
            with pytest.raises(QueueFull):
                await split.enqueue_many([In(i) for i in range(8)])
            for i in range(10):
                await whole.enqueue(In(i))
            with pytest.raises(QueueFull):
                await whole.enqueue(In(99))
            assert (await app.broker.counts("plain"))[JobState.WAITING] == 10


async def test_one_call_is_held_to_the_smallest_cap_of_its_queues(
    app_name: str, broker_url: str
) -> None:
    """A call naming a partition shares that partition's cap (ceil(6 / 3) = 2) with its
    other queues, also when the partition's jobs exist already: every broker learns which
    jobs are new only while it stores them (the embedded broker once looked at new jobs
    only, and stored what Redis refused)."""
    async with connected(app_name, broker_url, max_queue_length=6) as broker:
        broker.set_partitions({"pq": 3})
        await broker.enqueue([msg(queue="pq.p0", job_id="old")])
        await broker.enqueue([msg(queue="q"), msg(queue="q")])
        with pytest.raises(QueueFull, match="max_queue_length=2"):
            await broker.enqueue([msg(queue="pq.p0", job_id="old"), msg(queue="q")])
        assert (await broker.counts("q"))[JobState.WAITING] == 2
        # Alone, q is held to the whole cap.
        assert [o.created for o in await broker.enqueue([msg(queue="q")])] == [True]
