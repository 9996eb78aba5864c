"""enqueue.lua's two argument forms: six arguments per job, or (every job of the call with
the same queue, priority, eta and delay) those four once and each job's id and body.
The broker sends the shared form for such batches; both must store the same jobs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests import redis_support
from tests.redis_harness import RedisProcess, flushall
from tests.redis_support import message, raw_redis
from typedq import BrokerError, JobState
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.anyio]

BODY = b"\x92\xa1t\xc4\x00"


@pytest.fixture
def anyio_backend() -> str:
    """redis-py is asyncio-only."""
    return "asyncio"


@pytest.fixture
def url(redis_server: RedisProcess) -> str:
    flushall(redis_server.port)
    return redis_server.url


@contextlib.asynccontextmanager
async def broker_at(url: str, **settings: Any) -> AsyncIterator[RedisBroker]:
    async with redis_support.broker_at(url, "forms", deadline=30, **settings) as broker:
        yield broker


def test_the_broker_sends_the_shared_form_only_for_a_uniform_batch() -> None:
    broker = RedisBroker("redis://127.0.0.1:1", BrokerSettings(namespace="forms"))
    _, args, _ = broker._enqueue_call([message("a"), message("b")])
    assert args[3:9] == ["", "q", "0", 0, 0, "a"]
    assert len(args) == 12
    _, args, _ = broker._enqueue_call([message("a"), message("b", priority=2)])
    assert args[3] == "a"
    assert len(args) == 3 + 12
    _, args, _ = broker._enqueue_call([message("a"), message("b", queue="other")])
    assert args[3] == "a"
    assert len(args) == 3 + 12
    # One job: the per-job form (the shared one would be longer).
    _, args, _ = broker._enqueue_call([message("a")])
    assert args[3] == "a"
    assert len(args) == 3 + 6


async def test_both_forms_store_the_same_jobs(url: str) -> None:
    async with broker_at(url) as broker, raw_redis(url) as raw:
        k = broker.keys
        per_job = [k.prefix, 0, 2, "a", "q", "3", 0, 0, BODY, "b", "q", "3", 0, 0, BODY]
        shared = [k.prefix, 0, 2, "", "q", "3", 0, 0, "c", BODY, "d", BODY]
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t1")], per_job) == [1, 1]
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t2")], shared) == [1, 1]
        # A repeated id (in the call or already stored) is stored once.
        again = [k.prefix, 0, 3, "", "q", "3", 0, 0, "c", BODY, "e", BODY, "e", BODY]
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t3")], again) == [
            0,
            1,
            0,
        ]
        # A re-sent call answers as its first copy did.
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t3")], again) == [
            0,
            1,
            0,
        ]
        assert (await broker.counts("q"))[JobState.WAITING] == 5
        assert await raw.llen(k.waiting("q", 3)) == 5  # the priority of both forms
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["a", "b", "c", "d", "e"]
        assert await raw.exists(k.request("q", "t3")) == 1


async def test_a_shared_form_with_a_delay_schedules_every_job(url: str) -> None:
    async with broker_at(url) as broker:
        out = await broker.enqueue(
            [
                JobMessage(id=f"s{i}", task="t", queue="q", payload=b"\x91\x01", delay=60)
                for i in range(3)
            ]
        )
        assert [o.created for o in out] == [True] * 3
        counts = await broker.counts("q")
        assert counts[JobState.SCHEDULED] == 3
        assert counts[JobState.WAITING] == 0
        assert [r.state if r else None for r in await broker.get(["s0", "s1", "s2"])] == [
            JobState.SCHEDULED
        ] * 3


@pytest.mark.parametrize(
    "shared",
    [
        ["", "bad|queue", "0", 0, 0, "x", BODY],
        ["", "", "0", 0, 0, "x", BODY],
        ["", "q", "1.5", 0, 0, "x", BODY],
        ["", "q", "0", "soon", 0, "x", BODY],
        ["", "q", "0", 0, 0, "", BODY],  # an empty id
        ["", "q", "0", 0, 0, "x", BODY, "y"],  # a job without its body
    ],
)
async def test_a_malformed_shared_form_writes_nothing(url: str, shared: list[Any]) -> None:
    async with broker_at(url) as broker, raw_redis(url) as raw:
        k = broker.keys
        await broker.enqueue([message("first")])
        before = {key async for key in raw.scan_iter("*")}
        n = (len(shared) - 5) // 2 + (len(shared) - 5) % 2
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval(
                "enqueue", [k.seq("q"), k.request("q", "t")], [k.prefix, 0, n, *shared]
            )
        assert {key async for key in raw.scan_iter("*")} == before


async def test_one_job_and_a_batch_over_two_queues_store_alike(url: str) -> None:
    """A call of one job (kept per queue as numbers, like the shared form) and a call over
    two queues (kept per queue in tables) number, list, count and schedule their jobs
    the same way: one queue's jobs come out in enqueue order whichever call made them."""
    async with broker_at(url) as broker, raw_redis(url) as raw:
        k = broker.keys
        await broker.enqueue([message("a", priority=3)])
        await broker.enqueue([message("x", priority=3), message("y", queue="other")])
        await broker.enqueue([message("b", priority=3)])
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=BODY, delay=60)])
        assert await raw.llen(k.waiting("q", 3)) == 3
        assert await raw.get(k.seq("q")) == b"4"
        assert await raw.get(k.seq("other")) == b"1"
        counts, other = await broker.counts("q"), await broker.counts("other")
        assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (3, 1)
        assert other[JobState.WAITING] == 1
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["a", "x", "b"]
        assert [
            j.message.id for j in await broker.claim(["other"], 10, worker_id="w", lease=30)
        ] == ["y"]
