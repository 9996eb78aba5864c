"""Redis specifics of schedules: the scripts check their arguments before writing, state
bytes typedq did not write are replaced at reconciliation, each firing is one script, and
the job body carries the tick."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest

from tests import redis_support
from tests.redis_harness import RedisCluster
from tests.redis_support import raw_redis
from typedq import BrokerError, JobState
from typedq.broker.base import FireOutcome, JobMessage, TickFiring
from typedq.broker.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@contextlib.asynccontextmanager
async def broker_at(url: str, **settings: Any) -> AsyncIterator[RedisBroker]:
    async with redis_support.broker_at(url, "rs", deadline=30, **settings) as broker:
        yield broker


def tick(name: str, tick_us: int, queue: str = "q") -> JobMessage:
    return JobMessage(
        id=f"schedule:{name}:{tick_us}",
        task="t",
        queue=queue,
        payload=b"\x90",
        scheduled_for=tick_us / 1e6,
    )


async def test_fire_checks_its_arguments_before_writing(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        (state,) = await broker.sync_schedules([("s", "d")], prune=False)
        before = {key async for key in raw.scan_iter("*")}
        stored = await raw.hget(k.schedules, "s")
        last = state.last_tick_us
        good = [f"schedule:s:{last}", "q", "0", b"\x92\xa1t\xc4\x00"]
        bad = [f"schedule:s:{last - 1}", "bad|queue", "0", b"\x92\xa1t\xc4\x00"]
        head = [k.prefix, 0, "s", "d", last, last + 1, 0, "allow", 2]
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval("schedule_fire", [k.schedules, k.seq("q")], [*head, *good, *bad])
        bad_overlap = [k.prefix, 0, "s", "d", last, last + 1, 0, "sometimes", 1, *good]
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval("schedule_fire", [k.schedules, k.seq("q")], bad_overlap)
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval("schedule_sync", [k.schedules], [k.prefix, "1", 1, "s", "a|b"])
        assert {key async for key in raw.scan_iter("*")} == before
        assert await raw.hget(k.schedules, "s") == stored


async def test_state_bytes_typedq_did_not_write_are_replaced(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await raw.hset(broker.keys.schedules, "s", "garbage")
        stale = TickFiring(
            name="s", digest="d", expected_last_us=0, new_last_us=1, messages=[tick("s", 1)]
        )
        assert await broker.fire_schedules([stale]) == [(FireOutcome.STALE, None)]
        assert await broker.schedule_states() == []  # unreadable: not listed
        (state,) = await broker.sync_schedules([("s", "d")], prune=False)
        assert (state.digest, state.fired, state.last_job) == ("d", 0, "")
        assert [s.name for s in await broker.schedule_states()] == ["s"]


async def test_each_firing_is_one_script_and_the_body_carries_the_tick(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        states = await broker.sync_schedules([("a", "d"), ("b", "d")], prune=True)
        firings = [
            TickFiring(
                name=s.name,
                digest="d",
                expected_last_us=s.last_tick_us,
                new_last_us=s.last_tick_us,
                messages=[tick(s.name, s.last_tick_us)],
            )
            for s in states
        ]
        # new_last must move forward: both answer stale, nothing written.
        results = await broker.fire_schedules(firings)
        assert [r[0] for r in results] == [FireOutcome.STALE, FireOutcome.STALE]
        stats = await raw.info("commandstats")
        before = int(stats.get("cmdstat_fcall", {}).get("calls", 0))
        firings = [
            TickFiring(
                name=f.name,
                digest="d",
                expected_last_us=f.expected_last_us,
                new_last_us=f.expected_last_us + 1,
                messages=f.messages,
            )
            for f in firings
        ]
        results = await broker.fire_schedules(firings)
        assert [r[0] for r in results] == [FireOutcome.FIRED, FireOutcome.FIRED]
        stats = await raw.info("commandstats")
        assert int(stats.get("cmdstat_fcall", {}).get("calls", 0)) == before + 2
        # The stored job body carries the tick (a trailing field of the body).
        (record,) = await broker.get([firings[0].messages[0].id])
        assert record is not None
        assert record.message == firings[0].messages[0]


@pytest.mark.cluster
@pytest.mark.parametrize("turns", [0, 1, 2, 3, 4, 5, 6, 8, 12, 20])
async def test_a_cancel_during_a_cluster_firing_leaves_the_tick_whole(
    redis_cluster: RedisCluster, turns: int
) -> None:
    """On Redis Cluster a firing stores the tick's job and then moves the schedule's state
    (two calls). A cancel (a worker's shutdown) landing ``turns`` event-loop turns after
    the store was sent, wherever that is in the two calls, still leaves both done: the job
    waiting and the state saying the tick fired (it once left the job with the state one
    tick behind)."""
    redis_cluster.flushall()
    async with broker_at(redis_cluster.url) as broker:
        (state,) = await broker.sync_schedules([("s", "d")], prune=False)
        new = state.last_tick_us + 1_000
        await anyio.sleep(0.01)  # the tick is due
        firing = TickFiring(
            name="s",
            digest="d",
            expected_last_us=state.last_tick_us,
            new_last_us=new,
            messages=[tick("s", new)],
        )
        loop = asyncio.get_running_loop()
        store = broker.enqueue
        with anyio.CancelScope() as scope:

            async def enqueue_then_cancel(messages: Sequence[JobMessage]) -> Any:
                def countdown(left: int) -> None:
                    if left:
                        loop.call_soon(countdown, left - 1)
                    else:
                        scope.cancel()

                countdown(turns)
                return await store(messages)

            broker.enqueue = enqueue_then_cancel  # type: ignore[method-assign]
            await broker.fire_schedules([firing])
        broker.enqueue = store  # type: ignore[method-assign]
        assert scope.cancel_called
        (after,) = await broker.schedule_states()
        counts = await broker.counts("q")
        assert (after.last_tick_us, after.fired, counts[JobState.WAITING]) == (new, 1, 1)
