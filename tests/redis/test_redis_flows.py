"""Workflows on Redis, as stored: the flow record lives only while its flow runs, and a
re-sent flow enqueue answers what its first copy did.

The behaviour is the contract suite's (tests/contract/test_workflows.py, both brokers);
this looks at the keys, to show the flow state stays bounded.
"""

from __future__ import annotations

import random

import anyio
import msgspec
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.redis_support import broker_at, raw_redis
from tests.support import TEST_DEADLINE
from typedq import App, ConfigError, JobState
from typedq.broker.base import ClaimedJob, Completion, EnqueueOutcome, JobMessage
from typedq.broker.flow import HELD_AT, FlowSpec
from typedq.broker.redis.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


class N(msgspec.Struct, frozen=True):
    n: int


async def test_the_flow_record_lives_while_the_flow_runs(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    app = App("flowkeys", broker=redis_server.url)
    keys = Keys("flowkeys")

    @app.task
    async def double(x: N) -> N:
        return N(x.n * 2)

    @app.task
    async def add(xs: list[N]) -> N:
        return N(sum(x.n for x in xs))

    async with app, raw_redis(redis_server.url) as raw:
        job = await double.map(N(i) for i in range(5)).then(add).enqueue()
        record = await raw.hgetall(keys.flow("default", job.id))
        assert {k: record[k] for k in (b"S", b"n", b"c")} == {b"S": b"1", b"n": b"5", b"c": b"5"}
        held = [
            bytes(v or b"") if not isinstance(v, str) else v.encode()
            for v in await raw.hmget(keys.job("default", job.id), "s", "fl", "fs", "mh", "mt")
        ]
        assert held[:3] == [b"s", job.id.encode(), b"0"]
        # The body around its (empty) payload, where the hand-off splices the result in.
        assert held[3] + b"\xc4\x00" + held[4] == await raw.hget(keys.job("default", job.id), "m")
        assert (await job.info()).run_at == HELD_AT
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=2):
                assert await job.result(timeout=10) == N(20)
        assert await raw.exists(keys.flow("default", job.id)) == 0
        assert await raw.hmget(keys.job("default", job.id), "mh", "mt") == [None, None]
        assert await job.status() is JobState.COMPLETED
        flows = [k async for k in raw.scan_iter(keys.flow("default", "*"))]
    assert flows == []


async def test_a_resent_flow_enqueue_answers_created(
    redis_server: RedisProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-sent ``flow_enqueue`` (its reply was lost) stores nothing again and answers
    what the first copy answered."""
    flushall(redis_server.port)
    first_step = JobMessage(id="f1.0", task="t", queue="q", payload=b"\x91\x01")
    last_step = JobMessage(id="f1", task="t", queue="q", payload=b"")
    spec = FlowSpec(id="f1", steps=(first_step, last_step))
    tokens = iter(["f1f1f1f1", "f1f1f1f1", "f2f2f2f2"])
    monkeypatch.setattr("typedq.broker.redis.flows._request_token", lambda: next(tokens))
    async with broker_at(redis_server.url, "resend") as broker:
        first = await broker.enqueue_flows([spec])
        again = await broker.enqueue_flows([spec])  # the same call, re-sent
        other = await broker.enqueue_flows([spec])  # a new call: the flow exists
        counts = await broker.counts("q")
    assert first == again == [EnqueueOutcome("f1", True)]
    assert other == [EnqueueOutcome("f1", False)]
    assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (1, 1)


async def test_a_fan_out_past_one_chunk_of_ids(redis_server: RedisProcess) -> None:
    """The enqueue script checks ids (EXISTS) and pushes members (LPUSH) 1,000 at a time,
    and the fan-in reads the results 1,000 at a time: a member id taken past the first
    chunk refuses the flow whole, and 2,500 members are claimed in input order and fanned
    in in input order."""
    flushall(redis_server.port)
    app = App("bigfan", broker=redis_server.url)

    @app.task
    async def double(x: N) -> N:
        return N(x.n * 2)  # pragma: no cover

    size = 2500
    async with app:
        broker = app.broker
        await double.enqueue(N(-1), job_id="big.m1700")
        with pytest.raises(ConfigError, match=r"'big\.m1700' of flow 'big' is taken"):
            await double.map(N(i) for i in range(size)).enqueue(job_id="big")
        counts = await broker.counts("default")
        assert counts[JobState.WAITING] + counts[JobState.SCHEDULED] == 1  # nothing stored
        assert await broker.remove(["big.m1700"]) == [True]
        job = await double.map(N(i) for i in range(size)).enqueue(job_id="big")
        claimed: list[ClaimedJob] = []
        while len(claimed) < size:
            got = await broker.claim(["default"], 500, worker_id="w", lease=30)
            assert got
            claimed += got
        assert [c.message.id for c in claimed] == [f"big.m{i}" for i in range(size)]
        done = [
            Completion(c.message.id, c.token, double.output.encode(N(i * 2)))
            for i, c in enumerate(claimed)
        ]
        random.Random(7).shuffle(done)  # members finish in any order
        for start in range(0, size, 300):
            await broker.complete(done[start : start + 300])
        assert await job.result(timeout=10) == [N(i * 2) for i in range(size)]
