"""Event streams on Redis, as stored (typedq.events): nothing is written for a queue
whose stream is off; when on, one capped stream per queue, entry ids ``<n>-1``.

The behaviour is the contract suite's (tests/contract/test_events.py, both brokers).
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from tests import obs_app
from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, flushall
from tests.redis_support import broker_at, message, raw_redis
from tests.support import TEST_DEADLINE
from typedq import CompletedEvent, Producer
from typedq.broker.base import Completion, Failure, JobState
from typedq.broker.redis.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


async def _finish(url: str, name: str, ids: list[str], *, events_max: int = 10_000) -> None:
    async with broker_at(url, name, events_max=events_max) as broker:
        await broker.enqueue([message(i) for i in ids])
        claimed = await broker.claim(["q"], len(ids), worker_id="w", lease=30)
        ok = [c for c in claimed if not c.message.id.startswith("bad")]
        bad = [c for c in claimed if c.message.id.startswith("bad")]
        await broker.complete([Completion(c.message.id, c.token, b"\xc0") for c in ok])
        await broker.fail([Failure(id=c.message.id, token=c.token, error=b"\x90") for c in bad])


async def test_a_queue_whose_stream_is_off_gets_no_stream(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    await _finish(redis_server.url, "evoff", ["a", "bad1"])
    keys = Keys("evoff")
    async with raw_redis(redis_server.url) as raw:
        assert await raw.exists(keys.events("q"), keys.events_config("q")) == 0


async def test_the_stream_of_a_queue_as_stored(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    async with broker_at(redis_server.url, "evon") as broker:
        assert await broker.enable_events("q") == 0
    await _finish(redis_server.url, "evon", ["a", "bad1"])
    keys = Keys("evon")
    async with raw_redis(redis_server.url) as raw:
        entries: Any = await raw.xrange(keys.events("q"))
        assert [e[0] for e in entries] == [b"1-1", b"2-1"]
        assert [e[1] for e in entries] == [
            {b"i": b"a", b"k": b"t", b"s": b"c", b"d": b"\xc0", b"a": b"1"},
            {b"i": b"bad1", b"k": b"t", b"s": b"f", b"d": b"\x90", b"a": b"1"},
        ]
        assert await raw.hgetall(keys.events_config("q")) == {b"cap": b"10000", b"n": b"2"}
    async with broker_at(redis_server.url, "evon") as broker:
        assert await broker.enable_events("q") == 2
        read = await broker.read_events("q", 1, timeout=0.1)
    assert [(e.seq, e.id, e.state) for e in read.events] == [(2, "bad1", JobState.FAILED)]
    assert read.missed == 0


async def test_the_stream_is_capped(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    async with broker_at(redis_server.url, "evcap", events_max=10) as broker:
        await broker.enable_events("q")
    ids = [f"j{i}" for i in range(1000)]
    for start in range(0, len(ids), 250):
        await _finish(redis_server.url, "evcap", ids[start : start + 250], events_max=10)
    keys = Keys("evcap")
    async with raw_redis(redis_server.url) as raw:
        length = await raw.xlen(keys.events("q"))
        # MAXLEN ~ trims whole stream nodes (stream-node-max-entries, 100 by default).
        assert 10 <= length <= 10 + 100
        newest: Any = await raw.xrevrange(keys.events("q"), count=1)
        [(last_id, last)] = newest
    assert last_id == b"1000-1"
    assert msgspec.msgpack.decode(last[b"d"]) is None


def test_a_producer_follows_the_events_of_a_worker_process(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    process = TypedqProcess("worker", "tests.obs_app:app", "--broker", redis_server.url)

    async def follow() -> tuple[list[str], list[Any]]:
        producer = Producer(obs_app.app.name, broker=redis_server.url)
        ok = producer.task("ok", obs_app.Item, obs_app.Item, queue="fast")
        async with producer, producer.events(ok) as events:
            jobs = [await ok.enqueue(obs_app.Item(n=n)) for n in range(20)]
            got: list[Any] = []
            with anyio.fail_after(TEST_DEADLINE):
                async for event in events:
                    got.append(event)
                    if len(got) == len(jobs):
                        break
        return [j.id for j in jobs], got

    try:
        process.wait_for("started")
        ids, got = anyio.run(follow)
    finally:
        process.close()
    assert all(isinstance(e, CompletedEvent) for e in got)
    assert sorted(e.job_id for e in got) == sorted(ids)
    assert {e.job_id: e.result for e in got} == {i: obs_app.Item(n=n) for n, i in enumerate(ids)}
