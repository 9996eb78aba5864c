"""Redis specifics of schedules: the scripts check their arguments before writing, state
bytes typedq did not write are replaced at reconciliation, each firing is one script, and
the job body carries the tick."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests import redis_support
from tests.redis_harness import RedisCluster
from tests.redis_support import raw_redis
from typedq import BrokerError, JobState
from typedq.broker.base import (
    Completion,
    FireOutcome,
    JobMessage,
    Retention,
    ScheduleState,
    TickFiring,
)
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
    """On Redis Cluster a firing stores the tick's job (in its queue's slot) and then moves
    the app-wide state up (two calls). A cancel (a worker's shutdown) landing ``turns``
    event-loop turns after the store was sent, wherever that is in the two calls, still
    leaves both done: the job waiting and the state saying the tick fired (it once left
    the job with the state one tick behind)."""
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
            queue="q",
        )
        loop = asyncio.get_running_loop()
        call = broker._eval
        with anyio.CancelScope() as scope:

            async def store_then_cancel(name: str, keys: Any, args: Any) -> Any:
                if name == "schedule_fire":

                    def countdown(left: int) -> None:
                        if left:
                            loop.call_soon(countdown, left - 1)
                        else:
                            scope.cancel()

                    countdown(turns)
                return await call(name, keys, args)

            broker._eval = store_then_cancel  # type: ignore[method-assign]
            await broker.fire_schedules([firing])
        broker._eval = call  # type: ignore[method-assign]
        # (many turns may land after both calls: the firing then simply ended first)
        assert scope.cancel_called or turns > 4
        (after,) = await broker.schedule_states()
        counts = await broker.counts("q")
        assert (after.last_tick_us, after.fired, counts[JobState.WAITING]) == (new, 1, 1)


@pytest.mark.cluster
async def test_a_scheduler_stalled_after_its_check_never_fires_a_tick_twice(
    redis_cluster: RedisCluster,
) -> None:
    """Issue 24 defect 4. On Redis Cluster, scheduler A checks the schedule's state and
    then stalls; scheduler B fires the same tick, its job runs and retention drops it
    (completed_max=1); A wakes. The tick's job must not be stored (and run) again: it
    once was, re-created by A's enqueue, and only A's commit answered stale."""
    redis_cluster.flushall()
    keep_one = Retention(completed_max=1)
    async with (
        broker_at(redis_cluster.url, retention=keep_one) as a,
        broker_at(redis_cluster.url, retention=keep_one) as b,
    ):
        (state,) = await a.sync_schedules([("s", "d")], prune=False)
        new = state.last_tick_us + 1_000
        await anyio.sleep(0.01)  # the tick is due
        firing = TickFiring(
            name="s",
            digest="d",
            expected_last_us=state.last_tick_us,
            new_last_us=new,
            messages=[tick("s", new)],
            queue="q",
        )
        checked, resume = anyio.Event(), anyio.Event()
        call = a._eval

        async def stall_after_the_check(name: str, keys: Any, args: Any) -> Any:
            reply = await call(name, keys, args)
            if name == "schedule_commit" and args[6] == "check" and not checked.is_set():
                checked.set()
                await resume.wait()
            return reply

        a._eval = stall_after_the_check  # type: ignore[method-assign]
        results: list[Any] = []

        async def fire_a() -> None:
            results.extend(await a.fire_schedules([firing]))

        async with anyio.create_task_group() as tg:
            tg.start_soon(fire_a)
            await checked.wait()
            # B fires the tick; its job runs; a later job's completion drops it.
            ((outcome, _),) = await b.fire_schedules([firing])
            assert outcome is FireOutcome.FIRED
            await b.enqueue([JobMessage(id="later", task="t", queue="q", payload=b"\x90")])
            for _ in range(2):
                (job,) = await b.claim(["q"], 1, worker_id="w", lease=30)
                await b.complete([Completion(job.message.id, job.token, b"")])
            assert await b.get([firing.messages[0].id]) == [None]  # dropped by retention
            resume.set()
        a._eval = call  # type: ignore[method-assign]
        assert [r[0] for r in results] == [FireOutcome.STALE]
        counts = await b.counts("q")
        assert counts[JobState.WAITING] == 0, "the tick was stored again: it would run twice"
        (after,) = await b.schedule_states()
        assert (after.last_tick_us, after.fired) == (new, 1)


@pytest.mark.cluster
async def test_the_cluster_firing_state_follows_resets_and_repairs_a_lagging_app_state(
    redis_cluster: RedisCluster,
) -> None:
    """The firing state in the ticks' slot adopts the app-wide state when that one was
    restarted (a schedule pruned and declared again), and an app-wide state left behind
    it (a firing cut off before its second call) is moved up by the next firing, which
    answers stale; the schedule then goes on."""
    redis_cluster.flushall()
    async with broker_at(redis_cluster.url) as broker:

        def firing(state: ScheduleState) -> TickFiring:
            new = state.last_tick_us + 1_000
            return TickFiring(
                name="s",
                digest="d",
                expected_last_us=state.last_tick_us,
                new_last_us=new,
                messages=[tick("s", new)],
                queue="q",
            )

        async def fire(state: ScheduleState) -> tuple[FireOutcome, ScheduleState]:
            await anyio.sleep(0.01)  # the tick is due
            ((outcome, after),) = await broker.fire_schedules([firing(state)])
            assert after is not None
            return outcome, after

        (state,) = await broker.sync_schedules([("s", "d")], prune=False)
        outcome, first = await fire(state)
        assert (outcome, first.fired) == (FireOutcome.FIRED, 1)
        # Pruned and declared again: the app-wide state restarts at now, ahead of the
        # firing state, which adopts it.
        await broker.sync_schedules([], prune=True)
        (state,) = await broker.sync_schedules([("s", "d")], prune=False)
        assert state.last_tick_us > first.last_tick_us
        outcome, second = await fire(state)
        assert (outcome, second.fired) == (FireOutcome.FIRED, 1)
        # The app-wide state put back behind the firing state: the next firing is stale
        # (the tick was fired) and moves it up; the one after that fires.
        behind = f"d|{state.last_tick_us}|0|0|0|"
        assert broker._redis is not None
        await broker._redis.hset(broker.keys.schedules, "s", behind)
        lagging = ScheduleState(name="s", digest="d", last_tick_us=state.last_tick_us)
        outcome, repaired = await fire(lagging)
        assert outcome is FireOutcome.STALE
        assert repaired == second
        outcome, third = await fire(repaired)
        assert (outcome, third.fired) == (FireOutcome.FIRED, 2)
        assert (await broker.counts("q"))[JobState.WAITING] == 3


@pytest.mark.cluster
async def test_pruning_a_schedule_on_cluster_deletes_its_firing_state(
    redis_cluster: RedisCluster,
) -> None:
    """Issue 24: a schedule pruned on Redis Cluster left its firing state (``Q S``, in the
    slot of its ticks' queue) behind, one field per schedule ever declared. Pruning now
    deletes it there too; a schedule still declared keeps its own."""
    redis_cluster.flushall()
    async with broker_at(redis_cluster.url) as broker:
        states = await broker.sync_schedules([("gone", "d"), ("kept", "d")], prune=False)
        for state in states:
            new = state.last_tick_us + 1_000
            await anyio.sleep(0.01)  # the tick is due
            firing = TickFiring(
                name=state.name,
                digest="d",
                expected_last_us=state.last_tick_us,
                new_last_us=new,
                messages=[tick(state.name, new)],
                queue="q",
            )
            ((outcome, _),) = await broker.fire_schedules([firing])
            assert outcome is FireOutcome.FIRED
        assert broker._redis is not None
        firing_key = broker.keys.schedule_firing("q")
        assert sorted(await broker._redis.hkeys(firing_key)) == [b"gone", b"kept"]
        (kept,) = await broker.sync_schedules([("kept", "d")], prune=True)
        assert kept.name == "kept"
        assert await broker._redis.hkeys(firing_key) == [b"kept"]
        assert [s.name for s in await broker.schedule_states()] == ["kept"]
