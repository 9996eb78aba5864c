"""Work notices go only to waiting workers (issue 13): a claim that comes up short sets
its queues' waiter marks (keys.py ``Q W``) in the same script; the next script giving such
a queue work consumes the mark and publishes once; while no worker waits, enqueues
publish nothing on the work channel. Standalone Redis and Redis Cluster (SPUBLISH), real
servers spawned by the suite.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from tests.redis_harness import RedisCluster, slot_owner
from tests.redis_support import broker_at, message, raw_redis
from typedq.broker.base import Completion
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.keys import Keys
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: A wait's timeout far past the worker's 5 s fallback: only a notice (or a due job)
#: can end it within the test's deadline.
LONG = 3600.0
#: The bound for a wake-up that a notice brings (generous: the box is shared).
PROMPT = 20.0


@contextlib.asynccontextmanager
async def notices(url: str, channel: str) -> AsyncIterator[list[str]]:
    """The messages published on ``channel`` while the block runs (a raw subscriber),
    read up to a marker published when the block ends: the count is exact."""
    seen: list[str] = []
    async with raw_redis(url) as raw:
        pubsub: Any = raw.pubsub()
        await pubsub.subscribe(channel)
        while (await pubsub.get_message(timeout=1.0)) is None:  # the confirmation
            pass
        try:
            yield seen
            await raw.publish(channel, "--end--")
            with anyio.fail_after(PROMPT):
                while True:
                    m = await pubsub.get_message(timeout=1.0)
                    if m is None or m["type"] != "message":
                        continue
                    data = m["data"].decode()
                    if data == "--end--":
                        break
                    seen.append(data)
        finally:
            await pubsub.aclose()


async def subscribed(broker: RedisBroker, queues: list[str]) -> None:
    """A first wait of ``queues`` (it asks for their work subscription), then until Redis
    has confirmed that subscription. A confirmation counts as a notice (listener.py: what
    was published before it may be lost, so waiters look again): one that lands after
    the test's claim ends the next wait at once. A short wait alone does not cover it: on
    a loaded box the new pub/sub connection's round trips outlast it."""
    await broker.wait_for_jobs(queues, 0.01)
    notes = broker._notes
    with anyio.fail_after(PROMPT):
        while not all(notes.confirmed.get(c) for c in notes.work_channels(queues)):  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def waits_until_woken(broker: RedisBroker, queues: list[str]) -> float:
    """A wait of ``queues`` with an hour's timeout; the seconds it lasted."""
    start = time.monotonic()
    await broker.wait_for_jobs(queues, LONG)
    return time.monotonic() - start


async def test_enqueues_publish_nothing_until_a_claim_comes_up_short(redis_url: str) -> None:
    async with broker_at(redis_url, "wm") as broker, raw_redis(redis_url) as raw:
        mark = broker.keys.waiter("q")
        async with notices(redis_url, broker.keys.work_channel) as seen:
            # No worker waits (none claimed): a batch and single enqueues, no notice.
            await broker.enqueue([message(f"a{i}") for i in range(5)])
            for i in range(5):
                await broker.enqueue([message(f"b{i}")])
            # A claim that fills up (the worker is busy, it will not wait): no mark.
            assert len(await broker.claim(["q"], 10, worker_id="w", lease=30)) == 10
            assert await raw.exists(mark) == 0
        assert seen == []
        async with notices(redis_url, broker.keys.work_channel) as seen:
            # Short (nothing left): the worker waits, so the mark is set ...
            assert await broker.claim(["q"], 1, worker_id="w", lease=30) == []
            assert await raw.get(mark) == b"1"
            # ... the next enqueue consumes it and publishes once, the rest nothing.
            for i in range(3):
                await broker.enqueue([message(f"c{i}")])
            assert await raw.exists(mark) == 0
        assert seen == ["q"]


async def test_a_waiting_worker_is_woken_by_the_notice(redis_url: str) -> None:
    async with broker_at(redis_url, "wm") as worker, broker_at(redis_url, "wm") as producer:
        await subscribed(worker, ["q"])
        assert await worker.claim(["q"], 4, worker_id="w", lease=30) == []
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.3)
                await producer.enqueue([message("j")])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                waited = await waits_until_woken(worker, ["q"])
        assert waited >= 0.2  # it did wait for the enqueue
        assert [j.message.id for j in await worker.claim(["q"], 4, worker_id="w", lease=30)] == [
            "j"
        ]


async def test_one_notice_wakes_every_waiting_worker(redis_url: str) -> None:
    async with (
        broker_at(redis_url, "wm") as one,
        broker_at(redis_url, "wm") as two,
        broker_at(redis_url, "wm") as producer,
        notices(redis_url, producer.keys.work_channel) as seen,
    ):
        for worker in (one, two):
            await subscribed(worker, ["q"])
            assert await worker.claim(["q"], 2, worker_id="w", lease=30) == []
        woken: list[float] = []

        async def wait(worker: RedisBroker) -> None:
            woken.append(await waits_until_woken(worker, ["q"]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, one)
            tg.start_soon(wait, two)
            await anyio.sleep(0.3)
            assert woken == []
            await producer.enqueue([message("j")])
            with anyio.fail_after(PROMPT):
                while len(woken) < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.01)
    assert seen == ["q"]  # one notice for both


@pytest.mark.parametrize("busy", ["a", "b"])
async def test_a_worker_of_two_queues_is_woken_by_either(redis_url: str, busy: str) -> None:
    async with broker_at(redis_url, "wm") as worker, broker_at(redis_url, "wm") as producer:
        await subscribed(worker, ["a", "b"])
        assert await worker.claim(["a", "b"], 4, worker_id="w", lease=30) == []
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.3)
                await producer.enqueue([message("j", queue=busy)])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                await waits_until_woken(worker, ["a", "b"])
        (job,) = await worker.claim(["a", "b"], 4, worker_id="w", lease=30)
        assert job.message.queue == busy


def _keyed(job_id: str, key: str) -> Any:
    return msgspec.structs.replace(message(job_id), concurrency_key=key)


async def test_a_concurrency_gate_wakes_its_waiting_worker(redis_url: str) -> None:
    """A claim short because a gate parked the job waits; the slot freeing (another
    worker's completion) publishes, and so does a job of another key."""
    limits = {"t": LimitSpec(concurrency=1)}
    async with (
        broker_at(redis_url, "wm") as holder,
        broker_at(redis_url, "wm") as waiter,
        broker_at(redis_url, "wm") as producer,
    ):
        holder.set_limits(limits)
        waiter.set_limits(limits)
        await producer.enqueue([_keyed("a1", "a"), _keyed("a2", "a")])
        (held,) = await holder.claim(["q"], 4, worker_id="h", lease=30)
        await subscribed(waiter, ["q"])
        assert await waiter.claim(["q"], 4, worker_id="w", lease=30) == []  # a2 parked
        async with anyio.create_task_group() as tg:

            async def complete_later() -> None:
                await anyio.sleep(0.3)
                await holder.complete([Completion(held.message.id, held.token, b"\xc0")])

            tg.start_soon(complete_later)
            with anyio.fail_after(PROMPT):
                await waits_until_woken(waiter, ["q"])
        (second,) = await waiter.claim(["q"], 4, worker_id="w", lease=30)
        assert second.message.id == "a2"
        # Key "a" is held again: short, parked; a job of key "b" wakes the worker.
        await producer.enqueue([_keyed("a3", "a")])
        assert await waiter.claim(["q"], 4, worker_id="w", lease=30) == []
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.3)
                await producer.enqueue([_keyed("b1", "b")])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                await waits_until_woken(waiter, ["q"])
        assert [j.message.id for j in await waiter.claim(["q"], 4, worker_id="w", lease=30)] == [
            "b1"
        ]


async def test_a_rate_gate_wakes_its_waiting_worker_when_it_opens(redis_url: str) -> None:
    """A rate gate's opening time comes back with the short claim: the wait ends then,
    with no notice (nothing publishes when a window slides)."""
    async with broker_at(redis_url, "wm") as worker, broker_at(redis_url, "wm") as producer:
        worker.set_limits({"t": LimitSpec(rate=1, per_us=500_000)})
        await producer.enqueue([message("r1"), message("r2")])
        (first,) = await worker.claim(["q"], 4, worker_id="w", lease=30)
        assert first.message.id == "r1"
        with anyio.fail_after(PROMPT):
            await waits_until_woken(worker, ["q"])
            claimed = await worker.claim(["q"], 4, worker_id="w", lease=30)
            while not claimed:
                await waits_until_woken(worker, ["q"])
                claimed = await worker.claim(["q"], 4, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["r2"]


async def test_a_wait_with_no_claim_before_it_sets_the_mark(redis_url: str) -> None:
    """A caller that waits without claiming first (no mark of its own claim) still gets
    the notice of the next enqueue, and returns at once when jobs already wait."""
    async with broker_at(redis_url, "wm") as worker, broker_at(redis_url, "wm") as producer:
        await subscribed(worker, ["q"])
        await worker.wait_for_jobs(["q"], 0.01)
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.3)
                await producer.enqueue([message("j")])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                assert await waits_until_woken(worker, ["q"]) >= 0.2
        with anyio.fail_after(PROMPT):
            await worker.wait_for_jobs(["q"], LONG)  # "j" waits: at once


async def test_a_refill_sets_no_mark(redis_url: str) -> None:
    """A short refill (a settle's claim) leaves the marks alone: the worker claims for
    the slots it leaves free before it waits, and that claim marks."""
    async with broker_at(redis_url, "wm") as worker, raw_redis(redis_url) as raw:
        await worker.enqueue([message("x")])
        (held,) = await worker.claim(["q"], 1, worker_id="w", lease=30)
        _, refilled = await worker.complete_and_claim(
            [Completion("x", held.token, b"")], ["q"], 1, worker_id="w", lease=30
        )
        assert refilled == []
        assert await raw.exists(worker.keys.waiter("q")) == 0


# -- Redis Cluster ---------------------------------------------------------------------


async def _spublish_calls(port: int) -> int:
    client = aioredis.Redis(port=port)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    return int(stats.get("cmdstat_spublish", {}).get("calls", 0))


@pytest.mark.cluster
async def test_cluster_publishes_only_for_a_waiting_worker(redis_cluster: RedisCluster) -> None:
    redis_cluster.flushall()
    url = redis_cluster.url
    keys = Keys("wmc")
    owner = slot_owner(redis_cluster, key_slot(keys.counts("q").encode()))
    async with broker_at(url, "wmc") as worker, broker_at(url, "wmc") as producer:
        before = await _spublish_calls(owner)
        for i in range(4):
            await producer.enqueue([message(f"a{i}")])
        assert await _spublish_calls(owner) == before  # nobody waits: nothing published
        await worker.wait_for_jobs(["q"], PROMPT)  # subscribes; jobs wait: at once
        assert len(await worker.claim(["q"], 4, worker_id="w", lease=30)) == 4
        assert await worker.claim(["q"], 4, worker_id="w", lease=30) == []
        before = await _spublish_calls(owner)
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.3)
                await producer.enqueue([message("b0")])
                await producer.enqueue([message("b1")])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                await waits_until_woken(worker, ["q"])
        assert await _spublish_calls(owner) == before + 1  # one notice, then none
        assert len(await worker.claim(["q"], 4, worker_id="w", lease=30)) == 2
