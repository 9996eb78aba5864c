"""Many producers waiting at once (issue 24, defect 7): 500 concurrent ``enqueue`` +
``job.result()`` on one queue, with a worker in the same process, get every result on
every broker, without a single broker error on the way. On Redis Cluster they failed:
redis-py's cluster pool raises (with no message) instead of waiting when all its
connections of a node are in use, and the queue is one slot, so one node: 436 of 500
raised ``BrokerUnavailable: ... is unreachable (get): ``. (Since ``job.result()`` rides
out outages it retried them, logging each as an outage of 5 s, and the worker's cancel
listener failed.) The cluster client now bounds its calls in flight, and callers beyond
wait for one (``typedq/broker/redis/connection.py``, ``_Cluster``)."""

from __future__ import annotations

import logging

import anyio
import msgspec
import pytest

from tests.redis_harness import RedisCluster
from typedq import App, BrokerUnavailable, JobState
from typedq.broker.redis.connection import PoolExhausted, make_cluster_client
from typedq.broker.redis.errors import broker_error

pytestmark = pytest.mark.anyio

WAITERS = 500


class Number(msgspec.Struct, frozen=True):
    n: int


async def test_500_concurrent_enqueue_and_result_all_succeed(
    broker_url: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="typedq")
    app = App(app_name, broker=broker_url)

    @app.task
    async def double(x: Number) -> Number:
        return Number(2 * x.n)

    results: dict[int, int] = {}
    states: dict[int, JobState] = {}
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            job = await double.enqueue(Number(i))
            results[i] = (await job.result(timeout=60)).n
            states[i] = await job.status()  # a read of its own, not retried
        except Exception as exc:  # collected: the assertion shows them all
            errors.append(f"{type(exc).__name__}: {exc}")

    with anyio.fail_after(120):
        async with app, app.worker(concurrency=32), anyio.create_task_group() as tg:
            for i in range(WAITERS):
                tg.start_soon(one, i)
    assert errors == []
    assert results == {i: 2 * i for i in range(WAITERS)}
    assert set(states.values()) == {JobState.COMPLETED}
    # Nothing was an outage: no result wait retried, no worker call failed. (The one
    # warning left is the test servers' lack of persistence.)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [w for w in warned if "runs without persistence" not in w] == []


@pytest.mark.redis
@pytest.mark.cluster
@pytest.mark.asyncio_only
async def test_a_cluster_call_finding_no_free_connection_in_time_says_so(
    redis_cluster: RedisCluster,
) -> None:
    """A call that truly cannot be served within the bounded wait (its one permit held by
    a blocking command) fails with PoolExhausted, translated as "no free connection"
    naming why; the next call, once the permit is back, is served."""
    redis_cluster.flushall()
    client = make_cluster_client(redis_cluster.url, client_name="t", max_connections=1, wait=0.2)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.blpop, ["{w}held"], 1)
            await anyio.sleep(0.05)  # the BLPOP holds the one permit for 1 s
            with pytest.raises(PoolExhausted) as caught:
                await client.get("{w}other")
        assert str(caught.value) == "none came free within 0.2 s; 1 calls in flight"
        error = broker_error(
            caught.value, "get", where="Redis Cluster at x", prefix="p", password=None
        )
        assert isinstance(error, BrokerUnavailable)
        assert str(error).startswith(
            "Redis Cluster at x had no free connection for get (none came free within "
            "0.2 s; 1 calls in flight): every connection stayed busy"
        )
        assert await client.get("{w}other") is None
    finally:
        await client.aclose()
