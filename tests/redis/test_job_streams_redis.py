"""Job streams on Redis: where the stream is, how long it lives, how long it gets."""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from tests.redis_support import raw_redis
from tests.support import TEST_DEADLINE, In, Out, claim_one, connected, msg
from typedq import App, JobContext, Retention
from typedq.broker.redis import RedisBroker
from typedq.broker.streams import STREAM_LIVE_TTL, STREAM_MAX, StreamAppend

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


class Token(msgspec.Struct, frozen=True):
    i: int


async def test_the_stream_lives_in_the_jobs_slot_and_expires_with_its_record(
    redis_url: str,
) -> None:
    app = App("streamttl", broker=redis_url, retention=Retention(completed_ttl=600.0))
    release = anyio.Event()

    @app.task(emits=Token)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token(i))
        await release.wait()
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1), raw_redis(redis_url) as raw:
            job = await generate.enqueue(In(3))
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            key = broker.keys.job_stream("default", job.id)
            assert key == f"tq:{{streamttl:default}}:js:{job.id}"  # the queue's hash tag
            stream = job.stream(poll=0.2)
            assert [(await stream.__anext__()).i for _ in range(3)] == [0, 1, 2]
            # While the job runs: the live TTL (a day), refreshed by each write.
            live = await raw.pttl(key)
            assert STREAM_LIVE_TTL * 1000 - 60_000 < live <= STREAM_LIVE_TTL * 1000
            release.set()
            assert [t async for t in stream] == []  # ends at the end entry
            # Once final: the retention of its state.
            assert 500_000 < await raw.pttl(key) <= 600_000
            entries: Any = await raw.xrange(key)  # untyped in redis-py
            assert [fields.get(b"e") for _, fields in entries] == [None, None, None, b"c"]


async def test_a_stream_keeps_about_the_cap(redis_url: str) -> None:
    app = App("streamcap", broker=redis_url)

    @app.task(emits=Token)
    async def flood(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token(i))
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE * 2):
        async with app, app.worker(concurrency=1), raw_redis(redis_url) as raw:
            job = await flood.enqueue(In(3 * STREAM_MAX))
            await job.result(timeout=30)
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            length = await raw.xlen(broker.keys.job_stream("default", job.id))
            # MAXLEN ~ trims whole nodes (100 entries by default): a little over the cap.
            assert STREAM_MAX <= length <= STREAM_MAX + 200


async def test_a_readers_count_costs_no_command_per_read_or_emit(redis_url: str) -> None:
    """A reader registers at its first read and then every few seconds (not per read),
    and leaves in one call; the emit path never touches the readers' set."""
    async with connected("streamreaders", redis_url) as broker, raw_redis(redis_url) as raw:
        assert isinstance(broker, RedisBroker)
        await broker.enqueue([msg(job_id="r1")])
        run = await claim_one(broker)
        readers_key = broker.keys.job_readers("q", "r1")
        seen: list[str] = []
        async with raw.monitor() as monitor:
            for i in range(20):
                append = StreamAppend(
                    job_id="r1",
                    queue="q",
                    token=run.token,
                    attempt=1,
                    seq=i,
                    items=[b"x"],
                    fresh=i == 0,
                )
                assert await broker.append_streams([append]) == [True]
                got = await broker.read_stream("r1", queue="q", after="", timeout=0, reader="me")
                assert len(got) == i + 1
            await broker.leave_stream("r1", queue="q", reader="me")
            await raw.echo("typedq-monitor-end")
            while True:
                command = await monitor.next_command()
                if command["command"] == "ECHO typedq-monitor-end":
                    break
                if readers_key in command["command"] and command["client_type"] == "lua":
                    seen.append(command["command"].split()[0].upper())
        # The first read's registration, then the leave: nothing per read or append.
        assert seen == ["ZREMRANGEBYSCORE", "ZADD", "PTTL", "PEXPIRE", "ZREM"]
        assert await raw.exists(readers_key) == 0  # its last reader left
