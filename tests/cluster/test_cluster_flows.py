"""Flows across slots on a real local Redis Cluster (3 primaries, 3 replicas; fixtures in
tests/conftest.py): steps and members on queues of different shards hand off through
each slot's outbox, applied on the target's slot by a second call, exactly once.

See "Flows across slots" in docs/brokers.md and the outbox in typedq/broker/redis/lua/common/flows.lua.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from tests import cluster_flow_app
from tests.redis_harness import RedisCluster, RedisProcess, failover_slot, slot_owner
from tests.redis_support import broker_at
from tests.support import In, Out, spawn_worker, stop_workers
from typedq import App, JobFailed, JobState, QueueFull
from typedq.broker.base import CancelOutcome, Completion, FinishOutcome, JobMessage
from typedq.broker.flow import FlowSpec
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import text
from typedq.broker.redis.flows import Handoff
from typedq.broker.redis.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.asyncio_only]

DEADLINE = 60.0


@pytest.fixture
def url(redis_cluster: RedisCluster) -> str:
    """The session Redis Cluster's URL, flushed: this file's own (conftest's ``redis_url``
    is the standalone server)."""
    redis_cluster.flushall()
    return redis_cluster.url


def owner(cluster: RedisCluster, keys: Keys, queue: str) -> int:
    """The port of the primary holding ``queue``'s slot."""
    return slot_owner(cluster, key_slot(keys.seq(queue).encode()))


def one_queue_per_shard(cluster: RedisCluster, app: str, prefix: str) -> list[str]:
    """Three queue names of ``app`` whose slots are on three different primaries."""
    keys = Keys(app)
    found: dict[int, str] = {}
    for i in range(200):
        q = f"{prefix}{i}"
        found.setdefault(owner(cluster, keys, q), q)
        if len(found) == 3:
            break
    queues = list(found.values())
    assert len({owner(cluster, keys, q) for q in queues}) == 3
    return queues


def partitions_on_every_shard(cluster: RedisCluster, app: str, count: int) -> str:
    """A queue name whose ``count`` partitions (``<name>.p<i>``) cover every primary."""
    keys = Keys(app)
    for i in range(200):
        base = f"fan{i}"
        if len({owner(cluster, keys, f"{base}.p{p}") for p in range(count)}) == 3:
            return base
    raise AssertionError("no queue name found whose partitions cover the 3 primaries")


async def outbox_sizes(broker: RedisBroker, queues: Sequence[str]) -> list[int]:
    """How many hand-offs each queue's outbox holds (and their records: none without),
    once the entries this broker applied are deleted (it defers that to its next call
    that applies, or its next reaper pass)."""
    acks, broker._acks = broker._acks, {}
    if acks:
        await broker._eval_many(broker._ack_calls(acks))
    redis: Any = broker._conn()
    sizes = [int(await redis.zcard(broker.keys.outbox(q))) for q in queues]
    for q in queues:
        for entry in await redis.zrange(broker.keys.outbox(q), 0, -1):
            assert await redis.exists(broker.keys.handoff(q, text(entry))) == 1
    return sizes


async def job_fields(broker: RedisBroker, queue: str, job_id: str) -> dict[str, bytes]:
    redis: Any = broker._conn()
    raw = await redis.hgetall(broker.keys.job(queue, job_id))
    return {text(k): v for k, v in raw.items()}


# -- a chain over three shards ---------------------------------------------------------


async def test_a_chain_over_three_shards_runs_to_its_typed_result(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xchain", "c")
    app = App("xchain", broker=url)

    @app.task(queue=qs[0])
    async def parse(x: In) -> In:
        return In(x.n + 1)

    @app.task(queue=qs[1])
    async def enrich(x: In) -> In:
        return In(x.n * 10)

    @app.task(queue=qs[2])
    async def store(x: In) -> Out:
        return Out(x.n + 3)

    with anyio.fail_after(DEADLINE):
        async with app:
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            job = await parse.then(enrich).then(store).enqueue(In(1), job_id="chain1")
            # Stored per slot: step 0 waiting on its shard, the others held on theirs, the
            # flow record only on the root's (the flow's own job's queue).
            counts = [await broker.counts(q) for q in qs]
            assert [c[JobState.WAITING] for c in counts] == [1, 0, 0]
            assert [c[JobState.SCHEDULED] for c in counts] == [0, 1, 1]
            raw: Any = broker._conn()
            assert await raw.hget(broker.keys.flow(qs[2], "chain1"), "x") == b"1"
            assert not await raw.exists(broker.keys.flow(qs[0], "chain1"))
            assert (await job_fields(broker, qs[0], "chain1.0")).get("fp") is None  # started
            # flow_state from the flow's id, and from a step on another shard.
            state = await broker.flow_state("chain1")
            assert state is not None
            assert (state.steps, state.members, state.pending) == (3, 0, 0)
            assert await broker.flow_state("chain1.0", queue=qs[0]) == state
            assert await broker.flow_state("chain1.1") == state
            async with app.worker(concurrency=2):
                assert await job.result(timeout=30) == Out(23)
            info = await enrich.job("chain1.1").info()
            assert info.status is JobState.COMPLETED
            ended = await broker.flow_state("chain1.0", queue=qs[0])
            assert ended is not None
            assert ended.pending == -1
            assert await outbox_sizes(broker, qs) == [0, 0, 0]  # every hand-off deleted
            assert not await raw.exists(broker.keys.flow(qs[2], "chain1"))


# -- a fan-out over eight queues --------------------------------------------------------


async def test_a_fan_out_over_8_queues_fans_in_once_in_input_order(
    url: str, redis_cluster: RedisCluster
) -> None:
    base = partitions_on_every_shard(redis_cluster, "xfan", 8)
    app = App("xfan", broker=url)
    calls: Counter[str] = Counter()
    got: list[list[Out]] = []

    @app.task(queue=base, partitions=8)
    async def square(x: In) -> Out:
        await anyio.sleep(0.001 * (x.n % 3))  # finish out of order
        return Out(x.n * x.n)

    @app.task(queue="album")
    async def album(outs: list[Out]) -> Out:
        calls["album"] += 1
        got.append(outs)
        return Out(sum(o.n for o in outs))

    n = 24
    with anyio.fail_after(DEADLINE):
        async with app:
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            spec = square.map(In(i) for i in range(n)).then(album).spec(job_id="fan1")
            # The members spread over the 8 partitions (member i on partition i % 8).
            members = tuple(
                msgspec.structs.replace(m, queue=f"{base}.p{i % 8}")
                for i, m in enumerate(spec.members)
            )
            spread = FlowSpec(
                id=spec.id, steps=spec.steps, members=members, fan_out=True, collect=False
            )
            member_queues = sorted({m.queue for m in members})
            assert len(member_queues) == 8
            shards = {owner(redis_cluster, broker.keys, q) for q in member_queues}
            assert len(shards) == 3
            (outcome,) = await broker.enqueue_flows([spread])
            assert not isinstance(outcome, Exception)
            assert outcome.created
            # The fan-in counter lives with the root (album's queue) only.
            raw: Any = broker._conn()
            record = broker.keys.flow("album", "fan1")
            assert await raw.hmget(record, "c", "n", "x") == [str(n).encode()] * 2 + [b"1"]
            assert sum([(await broker.counts(q))[JobState.WAITING] for q in member_queues]) == n
            async with app.worker(concurrency=8):
                assert await album.job("fan1").result(timeout=30) == Out(
                    sum(i * i for i in range(n))
                )
            assert calls["album"] == 1  # fired exactly once
            assert got == [[Out(i * i) for i in range(n)]]  # in input order
            assert await outbox_sizes(broker, [*member_queues, "album"]) == [0] * 9
            assert not await raw.exists(record)


async def test_a_flow_within_one_slot_keeps_the_one_script_hand_off(url: str) -> None:
    """Two queues whose tags share a slot: their flow is stored by one script and hands
    off inside the completion script, as on a single Redis (no outbox, no second call)."""
    keys = Keys("xsame")
    by_slot: dict[int, str] = {}
    for i in range(100_000):
        q = f"q{i}"
        other = by_slot.setdefault(key_slot(keys.seq(q).encode()), q)
        if other != q:
            pair = [other, q]
            break
    async with broker_at(url, "xsame") as broker:
        delivered: list[Handoff] = []

        async def never(handoffs: Sequence[Handoff]) -> int:
            delivered.extend(handoffs)
            return 0

        broker._deliver = never  # type: ignore[method-assign]
        spec = chain_spec("one", [pair[0], pair[1], pair[0]], ["t0", "t1", "t2"])
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        raw: Any = broker._conn()
        assert await raw.hget(broker.keys.flow(pair[0], "one"), "x") is None
        for k, q in enumerate([pair[0], pair[1], pair[0]]):
            (job,) = await broker.claim([q], 1, worker_id="w", lease=30)
            assert job.message.id == ("one" if k == 2 else f"one.{k}")
            done = await broker.complete([Completion(job.message.id, job.token, b"\x91\x02")])
            assert done == [FinishOutcome.OK]
        (record,) = await broker.get(["one"], queue=pair[0])
        assert record is not None
        assert record.state is JobState.COMPLETED
        # A fan-out whose members are on both queues (one script stores them all).
        members = tuple(
            msgspec.structs.replace(plain(f"fo.m{i}", pair[i % 2]), task="m") for i in range(5)
        )
        spec = FlowSpec(id="fo", steps=(held("fo", pair[0], "cb"),), members=members, fan_out=True)
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        for q, n in ((pair[0], 3), (pair[1], 2)):
            jobs = await broker.claim([q], 5, worker_id="w", lease=30)
            assert sorted(j.message.id for j in jobs) == [
                f"fo.m{i}" for i in range(5) if i % 2 == (q == pair[1])
            ]
            assert len(jobs) == n
            results = [
                Completion(j.message.id, j.token, bytes([int(j.message.id[-1])])) for j in jobs
            ]
            assert await broker.complete(results) == [FinishOutcome.OK] * n
        (cb,) = await broker.claim([pair[0]], 1, worker_id="w", lease=30)
        assert cb.message.payload == b"\x95\x00\x01\x02\x03\x04"  # in input order
        assert delivered == []  # nothing went through an outbox
        assert await outbox_sizes(broker, pair) == [0, 0]


# -- failures ---------------------------------------------------------------------------


async def test_a_failing_step_fails_the_flow_with_its_record_and_ends_remote_jobs(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xfail", "f")
    app = App("xfail", broker=url)

    @app.task(queue=qs[0])
    async def first(x: In) -> In:
        return x

    @app.task(queue=qs[1], retries=0)
    async def broken(x: In) -> In:
        raise ValueError(f"bad input {x.n}")

    @app.task(queue=qs[0])
    async def third(x: In) -> In:
        return x  # pragma: no cover

    @app.task(queue=qs[2])
    async def last(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    with anyio.fail_after(DEADLINE):
        async with app:
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            # Step 2 (third) is held on another shard than the root's (last's).
            job = await first.then(broken).then(third).then(last).enqueue(In(7), job_id="ff")
            async with app.worker(concurrency=2):
                with pytest.raises(JobFailed) as caught:
                    await job.result(timeout=30)
                # The remote held step ends by its own apply, after the root's end.
                deadline = time.monotonic() + 10
                while (await third.job("ff.2").info()).status is JobState.SCHEDULED:
                    assert time.monotonic() < deadline
                    await anyio.sleep(0.02)
            record = caught.value.record
            assert (record.error_type, record.message) == ("ValueError", "bad input 7")
            for task, job_id in ((broken, "ff.1"), (third, "ff.2"), (last, "ff")):
                info = await task.job(job_id).info()
                assert info.status is JobState.FAILED, job_id
                assert info.error is not None
                assert info.error.message == "bad input 7"
            assert (await first.job("ff.0").info()).status is JobState.COMPLETED
            # No job left held anywhere, no hand-off left behind.
            for q in qs:
                counts = await broker.counts(q)
                assert counts[JobState.SCHEDULED] == counts[JobState.WAITING] == 0
            assert await outbox_sizes(broker, qs) == [0, 0, 0]


async def test_a_cancelled_flow_cancels_its_jobs_on_other_shards(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xcancel", "k")
    async with broker_at(url, "xcancel") as broker:
        spec = chain_spec("fx", qs, ["t0", "t1", "t2"])
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        assert await broker.cancel("fx", queue=qs[2]) is CancelOutcome.CANCELLED
        records = await broker.get(["fx.0"], queue=qs[0])
        records += await broker.get(["fx.1"], queue=qs[1])
        assert [r.state if r else None for r in records] == [JobState.CANCELLED] * 2
        for q in qs:
            assert (await broker.counts(q))[JobState.SCHEDULED] == 0
        assert await outbox_sizes(broker, qs) == [0, 0, 0]


async def test_a_part_refused_refuses_the_flow_and_stores_nothing(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xfull", "r")
    async with broker_at(url, "xfull", max_queue_length=2) as broker:
        await broker.enqueue([plain("a", qs[1]), plain("b", qs[1])])  # qs[1] is full
        (outcome,) = await broker.enqueue_flows([chain_spec("ful", qs, ["t0", "t1", "t2"])])
        assert isinstance(outcome, QueueFull)
        # qs[0]'s part was stored (pending) before the refusal, then dropped.
        assert [sum((await broker.counts(q)).values()) for q in qs] == [0, 2, 0]
        # The root's part refused (an id taken on the root's queue): the parts go too.
        await broker.enqueue([plain("own.1", qs[2])])
        spec = chain_spec("own", [qs[0], qs[2], qs[1]], ["t0", "t1", "t2"])
        (outcome,) = await broker.enqueue_flows([spec])
        assert isinstance(outcome, Exception)
        assert "'own.1' of flow 'own' is taken" in str(outcome)
        assert [sum((await broker.counts(q)).values()) for q in qs] == [0, 2, 1]


async def test_enqueueing_an_ended_flow_again_stores_nothing(
    url: str, redis_cluster: RedisCluster
) -> None:
    """The same flow id again, after the flow ended and retention dropped some of its
    jobs on other shards: the answer is "existed", and what the new copy's parts stored
    is dropped (never left held)."""
    qs = one_queue_per_shard(redis_cluster, "xagain", "a")
    async with broker_at(url, "xagain") as broker:
        spec = chain_spec("ag", qs, ["t0", "t1", "t2"])
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        for q in qs:
            (job,) = await broker.claim([q], 1, worker_id="w", lease=30)
            await broker.complete([Completion(job.message.id, job.token, b"\x91\x02")])
        assert await broker.remove(["ag.0"], queue=qs[0]) == [True]  # as retention would
        (again,) = await broker.enqueue_flows([spec])
        assert not isinstance(again, Exception)
        assert not again.created
        assert sum((await broker.counts(qs[0])).values()) == 0  # the copy's part dropped
        assert (await broker.counts(qs[1]))[JobState.COMPLETED] == 1
        assert await outbox_sizes(broker, qs) == [0, 0, 0]


# -- a worker killed between a settle and its apply ------------------------------------


async def test_a_worker_killed_between_settle_and_apply_the_reaper_applies_once(
    url: str, redis_cluster: RedisCluster, redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    """A worker process completes step 0 (the settle writes the hand-off to step 1 into
    its slot's outbox) and is SIGKILLed before it applies it. Nothing is lost: the
    reaper pass applies the entry once, and the flow completes."""
    qs = one_queue_per_shard(redis_cluster, "xflow", "w")
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_XQUEUES": " ".join(qs),
    }
    stalling = spawn_worker(
        "tests.cluster_flow_app:app",
        url,
        concurrency=2,
        env={**env, "TYPEDQ_TEST_STALL_HANDOFF": "1"},
    )
    procs = [stalling]
    app = cluster_flow_app
    chain = app.parse.then(app.enrich).then(app.store).spec(app.Num(1), job_id="kill1")
    steps = tuple(msgspec.structs.replace(m, queue=q) for m, q in zip(chain.steps, qs, strict=True))
    try:
        async with broker_at(url, "xflow") as broker:
            assert not isinstance(
                (await broker.enqueue_flows([FlowSpec(id="kill1", steps=steps)]))[0], Exception
            )
            popped = await ledger.blpop(["stalled"], timeout=DEADLINE)
            os.kill(stalling.pid, signal.SIGKILL)
            stalling.wait(10)
            # The window: step 0 completed, its hand-off in its slot's outbox, step 1 held.
            assert popped is not None
            assert text(popped[1]).split() == [qs[0], "kill1.1|r", qs[1]]
            assert await ledger.llen("stalled") == 0  # that one hand-off only
            (step0,) = await broker.get(["kill1.0"], queue=qs[0])
            (step1,) = await broker.get(["kill1.1"], queue=qs[1])
            assert step0 is not None
            assert step0.state is JobState.COMPLETED
            assert step1 is not None
            assert step1.state is JobState.SCHEDULED
            assert await outbox_sizes(broker, qs) == [1, 0, 0]
            # The reaper pass: too young an entry is left to its writer ...
            broker.handoff_age = 3600
            await broker.recover_stalled()
            assert await outbox_sizes(broker, qs) == [1, 0, 0]
            # ... an old one is applied (once), then deleted.
            broker.handoff_age = 0
            await broker.recover_stalled()
            assert await outbox_sizes(broker, qs) == [0, 0, 0]
            counts = await broker.counts(qs[1])
            assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (1, 0)
            await broker.recover_stalled()  # nothing left to apply: changes nothing
            assert (await broker.counts(qs[1]))[JobState.WAITING] == 1
            # Another worker process runs the rest of the flow.
            procs.append(spawn_worker("tests.cluster_flow_app:app", url, concurrency=2, env=env))
            record = await broker.wait_finished("kill1", 30, queue=qs[2])
            assert record is not None
            assert record.state is JobState.COMPLETED
            assert record.result is not None
            assert msgspec.msgpack.decode(record.result, type=app.Num) == app.Num(23)
    finally:
        stop_workers(procs)
    # The worker deleted what it applied, at the latest when it stopped.
    async with broker_at(url, "xflow") as broker:
        assert await outbox_sizes(broker, qs) == [0, 0, 0]
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert runs == {"parse": 1, "enrich": 1, "store": 1}  # each step ran once


@pytest.mark.slow
async def test_the_roots_shard_fails_over_mid_flow_and_the_flow_completes(
    url: str, redis_cluster: RedisCluster
) -> None:
    """``CLUSTER FAILOVER`` of the shard holding the flow's root while a hand-off to it is
    in flight (written, not applied): the apply reaches the new primary and the flow
    completes with every step run once."""
    qs = one_queue_per_shard(redis_cluster, "xover", "o")
    async with broker_at(url, "xover", deadline=120) as broker:
        spec = chain_spec("fo", qs, ["t0", "t1", "t2"])
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        (job,) = await broker.claim([qs[0]], 1, worker_id="w", lease=30)
        await broker.complete([Completion(job.message.id, job.token, b"\x91\x02")])
        (job,) = await broker.claim([qs[1]], 1, worker_id="w", lease=30)
        kept: list[Handoff] = []
        deliver = broker._deliver

        async def keep(handoffs: Sequence[Handoff]) -> int:
            kept.extend(handoffs)
            return 0

        broker._deliver = keep  # type: ignore[method-assign]
        await broker.complete([Completion(job.message.id, job.token, b"\x91\x03")])
        broker._deliver = deliver  # type: ignore[method-assign]
        assert [(h.home, h.target) for h in kept] == [(qs[1], qs[2])]
        slot = key_slot(broker.keys.seq(qs[2]).encode())
        old, new = await anyio.to_thread.run_sync(failover_slot, redis_cluster, slot)
        assert old != new
        assert owner(redis_cluster, broker.keys, qs[2]) == new
        await deliver(kept)
        (job,) = await broker.claim([qs[2]], 1, worker_id="w", lease=30)
        assert job.message.id == "fo"
        assert job.message.payload == b"\x91\x03"  # step 1's result
        await broker.complete([Completion("fo", job.token, b"\x91\x04")])
        (record,) = await broker.get(["fo"], queue=qs[2])
        assert record is not None
        assert record.state is JobState.COMPLETED
        assert record.result == b"\x91\x04"
        assert await outbox_sizes(broker, qs) == [0, 0, 0]
        assert await broker.check_epoch()  # no data lost


# -- applying a hand-off twice ----------------------------------------------------------


async def test_applying_the_same_hand_off_twice_changes_nothing(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xtwice", "d")
    async with broker_at(url, "xtwice") as broker:
        seen: list[Handoff] = []
        deliver = broker._deliver

        async def keep(handoffs: Sequence[Handoff]) -> int:
            seen.extend(handoffs)
            return 0

        broker._deliver = keep  # type: ignore[method-assign]
        # A fan-out of 3 members on qs[0] into a callback on qs[1], the root on qs[2].
        members = tuple(
            msgspec.structs.replace(plain(f"tw.m{i}", qs[0]), task="m") for i in range(3)
        )
        steps = (held("tw.0", qs[1], "cb"), held("tw", qs[2], "end"))
        spec = FlowSpec(id="tw", steps=steps, members=members, fan_out=True)
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        await deliver(list(seen))  # start the members (the root's 'a' entries)
        seen.clear()
        jobs = await broker.claim([qs[0]], 3, worker_id="w", lease=30)
        assert len(jobs) == 3
        done = await broker.complete([Completion(j.message.id, j.token, b"\x07") for j in jobs])
        assert done == [FinishOutcome.OK] * 3
        assert [h.target for h in seen] == [qs[2]] * 3  # three settles, for the root
        assert await outbox_sizes(broker, qs) == [3, 0, 0]
        record = broker.keys.flow(qs[2], "tw")
        raw: Any = broker._conn()
        assert await raw.hget(record, "c") == b"3"
        # The first member's settle, applied twice: counted once.
        first = seen[0]
        assert await broker._eval(
            "flow_apply", [broker.keys.seq(qs[2])], apply_args(broker, first)
        ) == [1]
        assert await raw.hget(record, "c") == b"2"
        assert await broker._eval(
            "flow_apply", [broker.keys.seq(qs[2])], apply_args(broker, first)
        ) == [0]
        assert await raw.hget(record, "c") == b"2"
        # Delivered (all three, the first once more): the fan-in releases the callback
        # on qs[1] (a hand-off of the root's own), kept here, not applied yet.
        more = list(seen)
        seen.clear()
        await deliver(more)
        assert await outbox_sizes(broker, qs) == [0, 0, 1]
        (release,) = seen
        assert (release.home, release.target) == (qs[2], qs[1])
        before = await job_fields(broker, qs[1], "tw.0")
        assert before["s"] == b"s"
        await deliver([release])
        after = await job_fields(broker, qs[1], "tw.0")
        assert after["s"] == b"w"
        counts = await broker.counts(qs[1])
        # The same release again (a re-sent apply, the reaper after the writer): no change.
        assert await broker._eval(
            "flow_apply", [broker.keys.seq(qs[1])], apply_args(broker, release)
        ) == [0]
        assert await job_fields(broker, qs[1], "tw.0") == after
        assert await broker.counts(qs[1]) == counts
        assert await raw.llen(broker.keys.waiting(qs[1], 0)) == 1
        assert await outbox_sizes(broker, qs) == [0, 0, 0]
        # The callback got the members' results in order, from one fan-in.
        (cb,) = await broker.claim([qs[1]], 1, worker_id="w", lease=30)
        assert cb.message.id == "tw.0"
        assert cb.message.payload == b"\x93\x07\x07\x07"


def apply_args(broker: RedisBroker, handoff: Handoff) -> list[Any]:
    return [broker.keys.prefix, handoff.target, handoff.record]


# -- specs built by hand ----------------------------------------------------------------


def plain(job_id: str, queue: str, payload: bytes = b"\x91\x01") -> JobMessage:
    """An envelope of task ``t``."""
    return JobMessage(id=job_id, task="t", queue=queue, payload=payload)


def held(job_id: str, queue: str, task: str) -> JobMessage:
    """A held step's envelope (its payload comes from the step before)."""
    return JobMessage(id=job_id, task=task, queue=queue, payload=b"")


def chain_spec(
    flow_id: str, queues: Sequence[str], tasks: Sequence[str], *, payload: bytes = b"\x91\x01"
) -> FlowSpec:
    """A chain of ``len(queues)`` steps, step k on ``queues[k]`` running ``tasks[k]``."""
    n = len(queues)
    steps = [
        msgspec.structs.replace(
            plain(flow_id if k == n - 1 else f"{flow_id}.{k}", q, payload if k == 0 else b""),
            task=tasks[k],
        )
        for k, q in enumerate(queues)
    ]
    return FlowSpec(id=flow_id, steps=tuple(steps))
