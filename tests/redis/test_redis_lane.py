"""The broker's lane (typedq.broker.redis.connection.Lane): the worker's per-job script
calls (claim, settle and claim) sent on a connection kept out of the pool, with the
pooled path's semantics: a lost reply re-sent (same claim id: nothing lost, nothing
claimed twice), script errors naming their Lua file and line, a flushed library loaded
again, a call cancelled between send and reply leaving no reply for the next call, and
concurrent calls taking the pool instead of waiting.

Every test talks to a real redis-server spawned by the suite (never :6379), some through
:class:`tests.netproxy.NetProxy`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.netproxy import NetProxy, net_proxy
from tests.redis_harness import RedisProcess, flushall
from tests.redis_support import broker_at, message, raw_redis
from typedq.broker.base import Completion, FinishOutcome, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.connection import Lane, make_client
from typedq.broker.redis.scripts import read_scripts
from typedq.errors import BrokerError

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.fixture
def proxy(redis_server: RedisProcess) -> Iterator[NetProxy]:
    flushall(redis_server.port)
    with net_proxy(redis_server.port, lifetime=60) as proxy:
        yield proxy


class RecordingLane(Lane):
    """A lane that records the commands it sends."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.sent: list[tuple[Any, ...]] = []

    async def execute(self, *args: Any) -> Any:
        self.sent.append(args)
        return await super().execute(*args)


def lane_calls(broker: RedisBroker) -> list[tuple[Any, ...]]:
    """The commands the broker's lane sends from now on (a recording lane in its place,
    before the first call took a connection for it)."""
    assert broker._lane is not None
    lane = RecordingLane(broker._conn().connection_pool)
    broker._lane = lane
    return lane.sent


async def test_claim_and_settle_go_on_the_lane(redis_url: str) -> None:
    """A claim and a settle-and-claim are FCALLs on the lane; other scripts are not."""
    async with broker_at(redis_url, "lane") as broker:
        await broker.enqueue([message("a"), message("b")])
        sent = lane_calls(broker)
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        outcomes, jobs = await broker.complete_and_claim(
            [Completion(job.message.id, job.token, b"\xc0")], ["q"], 1, worker_id="w", lease=30
        )
        await broker.get(["a"])
        assert outcomes == [FinishOutcome.OK]
        assert [j.message.id for j in jobs] == ["b"]
        assert [args[0] for args in sent] == ["FCALL", "FCALL"]
        function = broker._library.functions["claim"]
        assert [args[1] for args in sent] == [function, function]


async def test_a_lost_claim_reply_is_re_sent_on_the_lane(proxy: NetProxy) -> None:
    """The claim ran on Redis, its reply was lost and the connection cut: the lane
    reconnects and sends it again with the same claim id, which answers with the same
    jobs: none lost (left active with nobody holding them), none claimed twice."""
    async with broker_at(proxy.url(), "lanelost") as broker:
        await broker.enqueue([message("a"), message("b"), message("c")])
        sent = lane_calls(broker)
        proxy.drop_next_reply()
        jobs = await broker.claim(["q"], 2, worker_id="w", lease=30, claim_id="c1a1c1a1")
        rest = await broker.claim(["q"], 5, worker_id="w", lease=30)
        counts = await broker.counts("q")
    assert proxy.stats.replies_dropped == 1
    assert len(sent) == 2  # the one lost, then the next claim: the re-send was inside
    assert [j.message.id for j in jobs] == ["a", "b"]
    assert [j.message.id for j in rest] == ["c"]
    assert (counts[JobState.ACTIVE], counts[JobState.WAITING]) == (3, 0)


async def test_a_script_error_on_the_lane_names_the_lua_file_and_line(redis_url: str) -> None:
    async with broker_at(redis_url, "laneerr") as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message("a")])
        # The queue's active set made a string: the claim's write to it fails.
        await raw.delete(broker.keys.active("q"))
        await raw.set(broker.keys.active("q"), "not a sorted set")
        sent = lane_calls(broker)
        with pytest.raises(BrokerError) as failed:
            await broker.claim(["q"], 1, worker_id="w", lease=30)
    assert len(sent) == 1
    text = str(failed.value)
    assert "claim" in text
    assert "WRONGTYPE" in text
    # "(typedq/broker/redis/lua/<file>:<line>)": that line of that file makes the call.
    where = text.rpartition("(typedq/broker/redis/lua/")[2].rstrip(")")
    file, _, line = where.partition(":")
    source = read_scripts()[file].split("\n")[int(line) - 1]
    assert "rcall('ZADD', k_active(q)" in source  # (a shared part's redis.call)


async def test_a_flushed_library_is_loaded_again_for_the_lane(redis_url: str) -> None:
    async with broker_at(redis_url, "laneflush") as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message("a")])
        await raw.function_flush()
        sent = lane_calls(broker)
        jobs = await broker.claim(["q"], 1, worker_id="w", lease=30)
    assert [j.message.id for j in jobs] == ["a"]
    assert len(sent) == 1  # "Function not found" there, then the load and re-send


async def test_a_call_cancelled_on_the_lane_leaves_no_reply_behind(proxy: NetProxy) -> None:
    """Cancelled between send and reply, the lane's connection is dropped: the next call
    does not read the cancelled call's reply as its own."""
    async with broker_at(proxy.url(), "lanecancel") as broker:
        await broker.enqueue([message("a"), message("b")])
        sent = lane_calls(broker)
        proxy.set_latency(0.5)
        with anyio.move_on_after(0.2) as scope:
            await broker.claim(["q"], 1, worker_id="w", lease=30, claim_id="cace1ed0")
        assert scope.cancelled_caught
        proxy.set_latency(0)
        await anyio.sleep(0.5)  # the cancelled call's reply, had it been kept, is here now
        # The cancelled claim took "a" on Redis (its record answers a re-send with it);
        # this claim, a new one, gets "b" and only "b".
        jobs = await broker.claim(["q"], 5, worker_id="w", lease=30)
        again = await broker.claim(["q"], 5, worker_id="w", lease=30, claim_id="cace1ed0")
    assert len(sent) == 3
    assert [j.message.id for j in jobs] == ["b"]
    assert [j.message.id for j in again] == ["a"]


async def test_concurrent_calls_take_the_pool_when_the_lane_is_busy(redis_url: str) -> None:
    async with broker_at(redis_url, "lanebusy") as broker:
        await broker.enqueue([message(f"j{i}") for i in range(8)])
        sent = lane_calls(broker)
        got: list[str] = []

        async def claim() -> None:
            got.extend(j.message.id for j in await broker.claim(["q"], 2, worker_id="w", lease=30))

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(claim)
    assert sorted(got) == [f"j{i}" for i in range(8)]
    assert 1 <= len(sent) < 4


async def test_closing_the_broker_closes_the_lane_connection(redis_url: str) -> None:
    """The lane's connection goes back to the pool at close and is closed with it: no
    connection of the app is left open on Redis."""
    async with raw_redis(redis_url) as raw:
        async with broker_at(redis_url, "laneclose") as broker:
            await broker.enqueue([message("a")])
            sent = lane_calls(broker)
            await broker.claim(["q"], 1, worker_id="w", lease=30)
            assert len(sent) == 1
            names = [c["name"] for c in await raw.client_list()]
            assert "typedq:laneclose" in names
        # Redis may take a moment to notice a closed socket.
        for _ in range(100):
            names = [c["name"] for c in await raw.client_list()]
            if "typedq:laneclose" not in names:
                break
            await anyio.sleep(0.05)
        assert "typedq:laneclose" not in names


@contextlib.asynccontextmanager
async def short_timeout_lane(url: str, timeout: float) -> AsyncIterator[tuple[Lane, Any]]:
    """A lane on a pool of ``timeout`` seconds of socket timeout and no retries."""
    pool = aioredis.ConnectionPool.from_url(
        url, socket_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    lane = Lane(pool)
    try:
        yield lane, pool
    finally:
        await lane.close()
        await pool.aclose()


async def test_a_read_past_the_socket_timeout_fails_as_redis_pys_and_leaves_no_reply(
    proxy: NetProxy,
) -> None:
    """The lane's shared read timer: a reply later than the socket timeout fails the call
    with redis-py's TimeoutError (the retry's cue), in about the timeout, and drops the
    connection: the next call does not read the late reply as its own."""
    async with short_timeout_lane(proxy.url(), 0.2) as (lane, _):
        assert await lane.execute("ECHO", "warm") == b"warm"
        proxy.set_latency(0.6)
        started = anyio.current_time()
        with pytest.raises(RedisTimeoutError):
            await lane.execute("ECHO", "late")
        assert anyio.current_time() - started < 0.55
        proxy.set_latency(0)
        await anyio.sleep(0.7)  # the late reply, had the connection been kept, is here now
        assert await lane.execute("ECHO", "next") == b"next"
        # Calls after it keep their own deadline (the timer re-armed for them).
        for i in range(3):
            assert await lane.execute("ECHO", f"n{i}") == f"n{i}".encode()
        proxy.set_latency(0.6)
        with pytest.raises(RedisTimeoutError):
            await lane.execute("ECHO", "late again")


async def test_an_outer_cancel_of_a_lane_read_stays_a_cancel(proxy: NetProxy) -> None:
    """Only the lane's own deadline turns into a timeout: a cancel scope's cancel that
    comes first is a cancel, and the lane works afterwards."""
    async with short_timeout_lane(proxy.url(), 0.3) as (lane, _):
        assert await lane.execute("ECHO", "warm") == b"warm"
        proxy.set_latency(0.6)
        with anyio.move_on_after(0.1) as scope:
            await lane.execute("ECHO", "cancelled")
        assert scope.cancelled_caught
        proxy.set_latency(0)
        await anyio.sleep(0.7)
        assert await lane.execute("ECHO", "after") == b"after"
        await anyio.sleep(0.3)  # past the cancelled read's deadline: nothing fires
        assert await lane.execute("ECHO", "later") == b"later"


async def test_a_relaxed_timeout_moves_the_lane_reads_deadline(proxy: NetProxy) -> None:
    """redis-py relaxes an active read's timeout while the server announces maintenance
    (``update_current_socket_timeout``): the lane's read then waits that long."""
    async with short_timeout_lane(proxy.url(), 0.2) as (lane, _):
        assert await lane.execute("ECHO", "warm") == b"warm"
        conn = lane._conn
        proxy.set_latency(0.5)

        async def relax() -> None:
            await anyio.sleep(0.1)
            conn.update_current_socket_timeout(2.0)

        async with anyio.create_task_group() as tg:
            tg.start_soon(relax)
            assert await lane.execute("ECHO", "slow") == b"slow"


async def test_the_lanes_calls_share_one_read_timer(redis_url: str) -> None:
    """No timer armed and cancelled per call (redis-py's read timeout, the write's): the
    deadline of each read is kept by one timer, armed again only when it runs out."""
    client = make_client(
        redis_url, client_name="lanetimer", max_connections=4, health_check_interval=10
    )
    lane = Lane(client.connection_pool)
    try:
        assert await lane.execute("ECHO", "warm") == b"warm"
        loop: Any = asyncio.get_running_loop()
        timers = [0]
        call_at = loop.call_at

        def counting_call_at(*args: Any, **kwargs: Any) -> Any:
            timers[0] += 1
            return call_at(*args, **kwargs)

        loop.call_at = counting_call_at
        try:
            for i in range(50):
                assert await lane.execute("ECHO", f"n{i}") == f"n{i}".encode()
        finally:
            del loop.call_at
    finally:
        await lane.close()
        await client.connection_pool.disconnect()
        await client.aclose()
    assert timers[0] <= 1


async def test_a_shorter_timeout_after_a_longer_one_is_kept(proxy: NetProxy) -> None:
    """A read of a shorter timeout after one of a longer (relaxed) timeout: the shared
    timer, armed for the longer one, is moved up to the shorter one's deadline."""
    async with short_timeout_lane(proxy.url(), 0.2) as (lane, _):
        assert await lane.execute("ECHO", "warm") == b"warm"
        conn = lane._conn
        conn.socket_timeout = 3.0  # as redis-py's relaxed timeout sets it
        proxy.set_latency(0.4)
        assert await lane.execute("ECHO", "relaxed") == b"relaxed"
        conn.socket_timeout = 0.2  # back to the lane's own
        proxy.set_latency(1.0)
        started = anyio.current_time()
        with pytest.raises(RedisTimeoutError):
            await lane.execute("ECHO", "late")
        assert anyio.current_time() - started < 0.9
