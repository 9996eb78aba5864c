"""enqueue.lua's two argument forms: six arguments per job, or (every job of the call with
the same queue, priority, eta and delay) those four once and each job's id and body.
The broker sends the shared form for such batches; both must store the same jobs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests import redis_support
from tests.redis_support import message, raw_redis
from typedq import BrokerError, JobState, QueueFull
from typedq.broker.base import BrokerSettings, CancelOutcome, JobMessage
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.keys import index_bucket

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

BODY = b"\x92\xa1t\xc4\x00"


@contextlib.asynccontextmanager
async def broker_at(url: str, **settings: Any) -> AsyncIterator[RedisBroker]:
    async with redis_support.broker_at(url, "forms", deadline=30, **settings) as broker:
        yield broker


def test_the_broker_sends_the_shared_form_only_for_a_uniform_batch() -> None:
    broker = RedisBroker("redis://127.0.0.1:1", BrokerSettings(namespace="forms"))
    # (Each form ends with the jobs' index buckets, one per job.)
    _, args, _ = broker._enqueue_call([message("a"), message("b")])
    assert args[3:9] == ["", "q", "0", 0, 0, "a"]
    assert len(args) == 12 + 2
    assert args[12:] == [index_bucket("a"), index_bucket("b")]
    _, args, _ = broker._enqueue_call([message("a"), message("b", priority=2)])
    assert args[3] == "a"
    assert len(args) == 3 + 12 + 2
    _, args, _ = broker._enqueue_call([message("a"), message("b", queue="other")])
    assert args[3] == "a"
    assert len(args) == 3 + 12 + 2
    # One job: the per-job form (the shared one would be longer).
    _, args, _ = broker._enqueue_call([message("a")])
    assert args[3] == "a"
    assert len(args) == 3 + 6 + 1
    # enqueue_fair.lua takes no buckets.
    fair = JobMessage(id="a", task="t", queue="q", payload=BODY, fair_key="k", fair_weight=1)
    _, args, _ = broker._enqueue_call([fair, message("b")])
    assert len(args) == 12


async def test_both_forms_store_the_same_jobs(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
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


async def test_a_shared_form_with_a_delay_schedules_every_job(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
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


async def test_the_buckets_a_call_sends_are_where_the_script_looks(redis_url: str) -> None:
    """The index buckets a producer sends (keys.py) and the ones the script computes
    itself (common/keys.lua, for a call without them) are the same: jobs stored either
    way are found in the index, claimed and cancelled alike. A call with a bucket
    section of another length than its jobs is malformed."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        ids = [f"job-{i}" for i in range(40)]
        plain = [k.prefix, 0, 20, "", "q", "0", 0, 0]
        for i in ids[:20]:
            plain += [i, BODY]
        with_buckets = [k.prefix, 0, 20, "", "q", "0", 0, 0]
        for i in ids[20:]:
            with_buckets += [i, BODY]
        with_buckets += [index_bucket(i) for i in ids[20:]]
        short = [*with_buckets[:-1]]
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval("enqueue", [k.seq("q"), k.request("q", "t0")], short)
        one = [k.prefix, 0, 1, "solo", "q", "0", 0, 0, BODY, index_bucket("solo")]
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t1")], plain) == [1] * 20
        assert (
            await broker._eval("enqueue", [k.seq("q"), k.request("q", "t2")], with_buckets)
            == [1] * 20
        )
        assert await broker._eval("enqueue", [k.seq("q"), k.request("q", "t3")], one) == [1]
        for n, i in enumerate([*ids, "solo"], start=1):
            assert await raw.hget(k.index("q", i), i) == str(n).encode()
        assert await broker.cancel("job-25", queue="q") == CancelOutcome.CANCELLED
        jobs = await broker.claim(["q"], 50, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == [i for i in [*ids, "solo"] if i != "job-25"]


@pytest.mark.parametrize(
    "shared",
    [
        ["", "bad|queue", "0", 0, 0, "x", BODY],
        ["", "", "0", 0, 0, "x", BODY],
        ["", "q", "1.5", 0, 0, "x", BODY],
        ["", "q", "0", "soon", 0, "x", BODY],
        ["", "q", "0", 0, 0, "", BODY],  # an empty id
        ["", "q", "0", 0, 0, "x", BODY, "", BODY],  # an empty id after the first
        ["", "q", "0", 0, 0, "x", BODY, "y"],  # a job without its body
    ],
)
async def test_a_malformed_shared_form_writes_nothing(redis_url: str, shared: list[Any]) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message("first")])
        before = {key async for key in raw.scan_iter("*")}
        n = (len(shared) - 5) // 2 + (len(shared) - 5) % 2
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval(
                "enqueue", [k.seq("q"), k.request("q", "t")], [k.prefix, 0, n, *shared]
            )
        assert {key async for key in raw.scan_iter("*")} == before


async def test_one_job_and_a_batch_over_two_queues_store_alike(redis_url: str) -> None:
    """A call of one job (kept per queue as numbers, like the shared form) and a call over
    two queues (kept per queue in tables) number, list, count and schedule their jobs
    the same way: one queue's jobs come out in enqueue order whichever call made them."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
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


# -- the waiting batch path (one EXISTS per call, HSETNX per job) ------------------------


async def test_repeats_within_and_across_batches_are_stored_once(redis_url: str) -> None:
    """A repeated id is stored once, at its first occurrence, within one call and across
    calls; the orders the repeats took are given back (dense: the order counter ends at
    the number of jobs stored), and the index holds each job's own order."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        first = await broker.enqueue([message("a"), message("b"), message("a"), message("c")])
        assert [o.created for o in first] == [True, True, False, True]
        again = await broker.enqueue([message("c"), message("d"), message("b"), message("d")])
        assert [o.created for o in again] == [False, True, False, False]
        assert await raw.get(k.seq("q")) == b"4"
        orders = [await raw.hget(k.index("q", i), i) for i in "abcd"]
        assert orders == [b"1", b"2", b"3", b"4"]
        assert await raw.llen(k.waiting("q", 0)) == 4
        assert (await broker.counts("q"))[JobState.WAITING] == 4
        records = await broker.get(["a", "b", "c", "d"])
        assert [r.state if r else None for r in records] == [JobState.WAITING] * 4
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["a", "b", "c", "d"]


async def test_a_batch_of_repeats_only_takes_no_order(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message("a"), message("b")])
        out = await broker.enqueue([message("b"), message("a"), message("b")])
        assert [o.created for o in out] == [False] * 3
        assert await raw.get(k.seq("q")) == b"2"
        assert (await broker.counts("q"))[JobState.WAITING] == 2
        nxt = await broker.enqueue([message("c")])
        assert nxt[0].created
        assert await raw.hget(k.index("q", "c"), "c") == b"3"


async def test_a_batch_naming_a_job_with_a_key_of_its_own_skips_it(redis_url: str) -> None:
    """A claimed job has a key of its own and no index field: a batch that names it again
    (the one EXISTS of the call counts it) leaves it as it is and stores the others."""
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a")])
        (held,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        out = await broker.enqueue([message("x"), message("a"), message("y"), message("x")])
        assert [o.created for o in out] == [True, False, True, False]
        (record,) = await broker.get(["a"])
        assert record is not None
        assert record.state == JobState.ACTIVE
        counts = await broker.counts("q")
        assert (counts[JobState.WAITING], counts[JobState.ACTIVE]) == (2, 1)
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["x", "y"]
        assert held.message.id == "a"


async def test_a_priority_batch_indexes_its_level(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message("lo"), message("lo2")])
        out = await broker.enqueue([message("h1", priority=5), message("h2", priority=5)])
        assert [o.created for o in out] == [True, True]
        assert await raw.hget(k.index("q", "h2"), "h2") == b"4|5"
        assert await raw.llen(k.waiting("q", 5)) == 2
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["h1", "h2", "lo", "lo2"]


async def test_mixed_priorities_and_delays_in_one_batch(redis_url: str) -> None:
    """A batch whose jobs differ in priority or delay (the per-job form) stores each as
    it asks, with repeats stored once."""
    async with broker_at(redis_url) as broker:
        batch = [
            message("p0"),
            message("p7", priority=7),
            JobMessage(id="later", task="t", queue="q", payload=BODY, delay=60),
            message("p0"),
            message("p7b", priority=7),
        ]
        out = await broker.enqueue(batch)
        assert [o.created for o in out] == [True, True, True, False, True]
        counts = await broker.counts("q")
        assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (3, 1)
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["p7", "p7b", "p0"]


@pytest.mark.parametrize(("stored", "created"), [(["a", "b"], [False, True]), ([], None)])
async def test_a_bounded_queue_counts_only_the_jobs_a_batch_creates(
    redis_url: str, stored: list[str], created: list[bool] | None
) -> None:
    """max_queue_length 3: a batch of 2 onto 2 waiting jobs fits when one of them is a
    repeat (the exact count of the per-job path), and is refused otherwise."""
    async with broker_at(redis_url, max_queue_length=3) as broker:
        await broker.enqueue([message(i) for i in (stored or ["m", "n"])])
        batch = [message("a"), message("c")]
        if created is None:
            with pytest.raises(QueueFull):
                await broker.enqueue(batch)
            assert (await broker.counts("q"))[JobState.WAITING] == 2
        else:
            out = await broker.enqueue(batch)
            assert [o.created for o in out] == created
            assert (await broker.counts("q"))[JobState.WAITING] == 3


async def test_a_batch_of_more_than_500_jobs_is_stored_whole(redis_url: str) -> None:
    """The job keys' EXISTS goes 500 keys at a time (a Lua unpack bound)."""
    async with broker_at(redis_url) as broker:
        ids = [f"j{i}" for i in range(1203)]
        out = await broker.enqueue([message(i) for i in ids])
        assert all(o.created for o in out)
        again = await broker.enqueue([message(i) for i in ids[1000:]] + [message("new")])
        assert [o.created for o in again] == [False] * 203 + [True]
        assert (await broker.counts("q"))[JobState.WAITING] == 1204
