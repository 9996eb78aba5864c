"""Durable runs on a real local Redis Cluster: a run lives on its queue's slot, and its
steps on queues of other slots tell it of their end through the outbox of flows across
slots (typedq/broker/redis/runs.py, lua/common/runs.lua).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import pytest
from redis.crc import key_slot

from tests.redis_harness import RedisCluster, slot_owner
from tests.redis_support import broker_at
from typedq import App
from typedq.broker.base import Completion, Failure, FinishOutcome, JobMessage, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import text
from typedq.broker.redis.flows import Handoff
from typedq.broker.redis.keys import Keys
from typedq.broker.runs import AppendOutcome, RunAppend, RunSpec, StepOutcome
from typedq.durable import Run

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.asyncio_only]

DEADLINE = 60.0


@pytest.fixture
def url(redis_cluster: RedisCluster) -> str:
    """The session Redis Cluster's URL, flushed."""
    redis_cluster.flushall()
    return redis_cluster.url


def one_queue_per_shard(cluster: RedisCluster, app: str, prefix: str) -> list[str]:
    """Three queue names of ``app`` whose slots are on three different primaries."""
    keys = Keys(app)
    found: dict[int, str] = {}
    for i in range(200):
        q = f"{prefix}{i}"
        found.setdefault(slot_owner(cluster, key_slot(keys.seq(q).encode())), q)
        if len(found) == 3:
            break
    assert len(found) == 3
    return list(found.values())


async def outbox_size(broker: RedisBroker, queue: str) -> int:
    """How many hand-offs ``queue``'s outbox holds, once the applied ones are deleted."""
    acks, broker._acks = broker._acks, {}
    if acks:
        await broker._eval_many(broker._ack_calls(acks))
    redis: Any = broker._conn()
    return int(await redis.zcard(broker.keys.outbox(queue)))


class N(msgspec.Struct, frozen=True):
    n: int


async def test_a_run_with_steps_on_three_shards_completes(
    url: str, redis_cluster: RedisCluster
) -> None:
    name = "xruns"
    home, left, right = one_queue_per_shard(redis_cluster, name, "r")
    app = App(name, broker=url)
    calls: Counter[str] = Counter()

    @app.task(queue=left)
    async def double(x: N) -> N:
        calls["double"] += 1
        return N(x.n * 2)

    @app.task(queue=right)
    async def plus(x: N) -> N:
        calls["plus"] += 1
        return N(x.n + 1)

    @app.durable(queue=home)
    async def compute(run: Run, x: N) -> N:
        a = await run.step(double, x)
        b, c = await run.gather(run.step(plus, a), run.step(double, a))
        return N(b.n + c.n)

    with anyio.fail_after(DEADLINE):
        async with app, app.worker(concurrency=4):
            handle = await compute.start(N(5), run_id="three-shards")
            assert await handle.result(timeout=DEADLINE) == N(11 + 20)
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            assert [await outbox_size(broker, q) for q in (home, left, right)] == [0, 0, 0]
    assert calls == Counter(double=2, plus=1)


async def test_a_steps_hand_off_left_behind_is_applied_by_the_reaper_once(
    url: str, redis_cluster: RedisCluster
) -> None:
    """The script that finished a step on another slot wrote the run's hand-off to its
    own outbox, and its caller died before applying it: the reaper pass applies it (the
    outcome is kept, the waiting run woken), and applying it again changes nothing."""
    home, steps, _ = one_queue_per_shard(redis_cluster, "xrunsr", "s")
    async with broker_at(url, "xrunsr") as broker:
        seen: list[Handoff] = []
        deliver = broker._deliver

        async def keep(handoffs: Sequence[Handoff]) -> int:
            seen.extend(handoffs)
            return 0

        spec = RunSpec(
            id="r", name="f", queue=home, turn_task="typedq.run.f", turn_payload=b"", input=b""
        )
        await broker.create_runs([spec])
        [turn] = await broker.claim([home], 1, worker_id="w", lease=30)
        assert turn.message.id == "r:t1"
        await broker.enqueue(
            [
                JobMessage(id=f"r:{i}", task="t", queue=steps, payload=b"", run_queue=home)
                for i in range(2)
            ]
        )
        [ok] = await broker.append_runs([RunAppend(run_id="r", expected=0, wait_jobs=("r:0",))])
        assert ok is AppendOutcome.APPENDED
        broker._deliver = keep  # type: ignore[method-assign]
        one, two = await broker.claim([steps], 2, worker_id="w", lease=30)
        assert await broker.complete([Completion(one.message.id, one.token, b"1")]) == [
            FinishOutcome.OK
        ]
        assert await broker.fail([Failure(id=two.message.id, token=two.token, error=b"e")]) == [
            FinishOutcome.OK
        ]
        assert [(h.home, h.target) for h in seen] == [(steps, home)] * 2
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert record.outcomes == {}  # not applied yet
        assert await outbox_size(broker, steps) == 2
        # The reaper pass, once the entries are old enough, applies them.
        broker._deliver = deliver  # type: ignore[method-assign]
        broker.handoff_age = 0
        await broker.recover_stalled()
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert record.outcomes["r:0"] == StepOutcome(state=JobState.COMPLETED, result=b"1")
        assert record.outcomes["r:1"].state is JobState.FAILED
        [woken] = await broker.get(["r:t2"], queue=home)
        assert woken is not None
        assert woken.state is JobState.WAITING
        # Applied again (a re-sent apply): the run already took it, no second turn.
        again = await broker._eval(
            "flow_apply", [broker.keys.seq(home)], [broker.keys.prefix, home, seen[0].record]
        )
        assert again == [1]
        assert await broker.get(["r:t3"], queue=home) == [None]
        # Once an append recorded the outcome, a late copy of its hand-off keeps nothing.
        [ok] = await broker.append_runs([RunAppend(run_id="r", expected=0, recorded_jobs=("r:0",))])
        assert ok is AppendOutcome.APPENDED
        late = await broker._eval(
            "flow_apply", [broker.keys.seq(home)], [broker.keys.prefix, home, seen[0].record]
        )
        assert late == [0]
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert set(record.outcomes) == {"r:1"}
        assert await outbox_size(broker, steps) == 0
        redis: Any = broker._conn()
        assert text(await redis.hget(broker.keys.runs, "r")) == home
