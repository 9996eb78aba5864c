"""Data written in the previous key layout (every key under ``typedq:{<ns>}:``) is moved to
the per-queue layout at connect: nothing is lost or ignored, FIFO and counts hold, and an
interrupted migration finishes on the next connect."""

from __future__ import annotations

import pytest

from tests.redis_support import broker_at, message, raw_redis
from typedq.broker.base import Completion, FinishOutcome, JobState
from typedq.broker.redis import migrate
from typedq.broker.redis.codec import encode_body
from typedq.broker.redis.keys import Keys
from typedq.broker.redis.migrate import migrate_layout

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

APP = "legacy"
P = "typedq:{legacy}:"  # the previous layout's prefix: every key of the app under it


async def write_old_layout(url: str) -> None:
    """An app in the previous layout: waiting jobs in two queues (one a priority level),
    a scheduled job, an active job with its lease, a completed job, a concurrency slot,
    and a running flow whose step waits on another queue."""
    async with raw_redis(url) as raw:
        body = {i: encode_body(message(i)) for i in ("w1", "w2", "w3", "s1", "a1", "c1")}
        # Waiting in 'q': w1, w2 (oldest first), and w3 at priority 2 in 'other'.
        await raw.set(P + "j:w1", b"wq|1|1000|||" + body["w1"])
        await raw.set(P + "j:w2", b"wq|2|1000|||" + body["w2"])
        await raw.set(
            P + "j:w3", b"wother|3|1000|2||" + encode_body(message("w3", queue="other", priority=2))
        )
        await raw.lpush(P + "q:q:w:0", "w1", "w2")
        await raw.zadd(P + "q:q:p", {"0": 0})
        await raw.lpush(P + "q:other:w:2", "w3")
        await raw.zadd(P + "q:other:p", {"2": -2})
        # Scheduled far ahead.
        await raw.set(P + "j:s1", b"sq|4|1000||9000000000000000|" + body["s1"])
        await raw.zadd(P + "q:q:s", {"s1": 9000000000000000})
        # Active, holding a concurrency slot, lease far ahead.
        await raw.hset(
            P + "j:a1",
            mapping={"m": body["a1"], "q": "q", "s": "a", "o": 5, "e": 1000, "a": 1, "t": "tok.1",
                     "st": 1000, "w": "w", "ck": "t|k"},
        )  # fmt: skip
        await raw.zadd(P + "active", {"a1": 9000000000000})
        await raw.sadd(P + "cc:t|k", "a1")
        # Completed.
        await raw.hset(
            P + "j:c1",
            mapping={"m": body["c1"], "q": "q", "s": "c", "o": 6, "e": 1000, "fa": 2000, "res": b"\xc0"},
        )  # fmt: skip
        await raw.zadd(P + "done:c", {"c1": 2000})
        await raw.hset(P + "q:q:n", mapping={"w": 2, "s": 1, "a": 1, "c": 1})
        await raw.hset(P + "q:other:n", mapping={"w": 1})
        # A flow F: member F.m0 waiting in 'q', its own job F held in 'other'.
        await raw.hset(
            P + "j:F.m0",
            mapping={"m": encode_body(message("F.m0")), "q": "q", "s": "w", "o": 7, "e": 1000,
                     "fl": "F", "fm": 0},
        )  # fmt: skip
        await raw.lpush(P + "q:q:w:0", "F.m0")
        await raw.hset(
            P + "j:F",
            mapping={"m": b"", "q": "other", "s": "s", "o": 8, "e": 1000, "r": 9000000000000000,
                     "fl": "F", "fs": 0, "fS": 1, "fn": 1, "mh": b"\x92\xa1t", "mt": b""},
        )  # fmt: skip
        await raw.zadd(P + "q:other:s", {"F": 9000000000000000})
        await raw.hset(P + "f:F", mapping={"S": 1, "n": 1, "c": 1, "col": "1", "pol": "a"})
        await raw.hincrby(P + "q:q:n", "w", 1)
        await raw.hincrby(P + "q:other:n", "s", 1)
        await raw.set(P + "seq", 8)
        await raw.set(P + "r:sometoken", "1", px=60_000)
        await raw.set(P + "epoch", "1-abc")


async def old_keys(url: str) -> list[str]:
    async with raw_redis(url) as raw:
        keys = [k.decode() async for k in raw.scan_iter(P + "*")]
    return sorted(k for k in keys if k not in (P + "epoch", P + "queues"))


async def test_the_previous_layout_is_moved_at_connect(redis_url: str) -> None:
    await write_old_layout(redis_url)
    async with broker_at(redis_url, APP) as broker:
        assert await old_keys(redis_url) == []
        k = broker.keys
        # Found through their queues, with their states.
        records = await broker.get(["w1", "w2", "s1", "a1", "c1"], queue="q")
        assert [r.state if r else None for r in records] == [
            JobState.WAITING,
            JobState.WAITING,
            JobState.SCHEDULED,
            JobState.ACTIVE,
            JobState.COMPLETED,
        ]
        assert records[0] is not None
        assert records[0].message == message("w1")
        (w3,) = await broker.get(["w3"], queue="other")
        assert w3 is not None
        assert w3.message == message("w3", queue="other", priority=2)
        assert (await broker.counts("q"))[JobState.WAITING] == 3
        assert (await broker.counts("other"))[JobState.SCHEDULED] == 1
        async with raw_redis(redis_url) as raw:
            assert await raw.zscore(k.active("q"), "a1") == 9000000000000
            assert await raw.zscore(k.done("q", "c"), "c1") == 2000
            assert await raw.smembers(k.slots("q", "t", "k")) == {b"a1"}
            # Each queue's order counter continues from the old one.
            assert int(await raw.get(k.seq("q")) or 0) >= 8
            # The flow record is on its own job's queue, its member knows where.
            assert await raw.hget(k.flow("other", "F"), "S") == b"1"
            assert await raw.hget(k.job("q", "F.m0"), "fq") == b"other"
        # FIFO holds across the move: the old jobs first, then one enqueued now.
        await broker.enqueue([message("new")])
        jobs = await broker.claim(["q"], 10, worker_id="w2", lease=30)
        assert [j.message.id for j in jobs] == ["w1", "w2", "F.m0", "new"]
        # The flow still hands off: its member completes, the collector completes.
        (member,) = [j for j in jobs if j.message.id == "F.m0"]
        await broker.complete([Completion(member.message.id, member.token, b"\x01")])
        (flow,) = await broker.get(["F"], queue="other")
        assert flow is not None
        assert flow.state is JobState.COMPLETED
        # The old active job's worker still settles it by its token.
        done = await broker.complete([Completion("a1", "tok.1", b"\xc0")])
        assert done == [FinishOutcome.OK]
    # Connecting again finds nothing to move.
    async with broker_at(redis_url, APP) as broker:
        assert await migrate_layout(broker) == 0


async def test_an_interrupted_migration_finishes_on_the_next_connect(redis_url: str) -> None:
    await write_old_layout(redis_url)
    async with raw_redis(redis_url) as raw:
        seq = await raw.get(P + "seq")
    # A first process moved the flows and the indexes, then died before the jobs.
    async with broker_at(redis_url, "probe") as probe:
        probe.keys = Keys(APP)
        for step, patterns in migrate._STEPS[:2]:
            for pattern in patterns:
                await migrate._move_matching(probe, step, seq, P + pattern)
    left = await old_keys(redis_url)
    assert P + "j:w1" in left
    assert P + "active" not in left
    async with broker_at(redis_url, APP) as broker:
        assert await old_keys(redis_url) == []
        jobs = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["w1", "w2", "F.m0"]
        (active,) = await broker.get(["a1"], queue="q")
        assert active is not None
        assert active.state is JobState.ACTIVE
