"""Redis Cluster (``redis+cluster://``) on a real local cluster: 3 primaries, 3 replicas,
started once per session (tests/conftest.py ``redis_cluster``). The contract suite runs on
it too (the ``cluster-asyncio`` broker parameter); these tests cover what is particular to
a cluster: queues spread over the shards, scripts routed by their declared key, and
exactly-once across worker processes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import anyio
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from tests import redis_app
from tests.redis_harness import RedisCluster, RedisProcess, failover_slot, flushall
from tests.redis_support import broker_at, message
from tests.support import In, spawn_worker, stop_workers
from typedq import App, ConfigError
from typedq.broker.base import Completion, FinishOutcome, JobState
from typedq.broker.keys import Keys
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import text
from typedq.broker.redis.health import check_slots
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def url(redis_cluster: RedisCluster) -> str:
    redis_cluster.flushall()
    return redis_cluster.url


async def keys_per_primary(cluster: RedisCluster) -> dict[int, set[str]]:
    """Every key on each primary (by port), read from the primary itself."""
    found: dict[int, set[str]] = {}
    for port in cluster.primary_ports():
        client = aioredis.Redis(port=port)
        try:
            found[port] = {k.decode() async for k in client.scan_iter("*")}
        finally:
            await client.aclose()
    return found


async def test_the_keys_of_8_queues_spread_over_every_primary(
    url: str, redis_cluster: RedisCluster
) -> None:
    queues = [f"q{i}" for i in range(8)]
    async with broker_at(url, "spread") as broker:
        await broker.enqueue([message(f"j{i}", queue=q) for i, q in enumerate(queues)])
        jobs = await broker.claim(queues, 8, worker_id="w", lease=30)
        assert sorted(j.message.id for j in jobs) == [f"j{i}" for i in range(8)]
        done = await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])
        assert len(done) == 8
        k = broker.keys
        stats = await broker.queue_stats(queues)
        assert [s.counts[JobState.COMPLETED] for s in stats] == [1] * 8
    on = await keys_per_primary(redis_cluster)
    assert len(on) == 3
    holders: dict[str, int] = {}
    for port, names in on.items():
        for q in queues:
            mine = {n for n in names if n.startswith(k.queue_prefix(q).rstrip(":"))}
            if mine:
                # All of a queue's keys on one primary: the one owning its slot.
                assert q not in holders
                holders[q] = port
                assert k.job(q, f"j{queues.index(q)}") in mine
                assert {key_slot(n.encode()) for n in mine} == {key_slot(k.counts(q).encode())}
    assert sorted(holders) == queues
    assert set(holders.values()) == set(on)  # every primary holds some queue
    # The app-wide keys (registries, epoch) are on the app's own slot.
    assert any(k.epoch in names and k.queues in names for names in on.values())


async def test_a_partitioned_queue_spreads_its_jobs_over_every_primary(
    url: str, redis_cluster: RedisCluster
) -> None:
    app = App("parted", broker=url)

    @app.task(queue="emails", partitions=8)
    async def send(x: In) -> None:
        return None

    async with app:
        jobs = await send.enqueue_many(In(i) for i in range(64))
    by_partition = {j.queue for j in jobs}
    assert by_partition == set(app.queues)  # 64 ids reach all 8 partitions
    on = await keys_per_primary(redis_cluster)
    keys = Keys("parted")
    holders = {
        port
        for port, names in on.items()
        for job in jobs
        if keys.job(send.queue_for(job.id), job.id) in names
    }
    assert holders == set(on)  # every primary holds some of the queue's jobs
    found = sum(
        keys.job(send.queue_for(j.id), j.id) in names for j in jobs for names in on.values()
    )
    assert found == 64  # each job once, on the primary of its partition's slot


async def test_complete_and_claim_over_several_queues_is_one_call_per_queue(url: str) -> None:
    """A multi-queue worker's settle on Cluster: each queue's completions and its share of
    the claim go in one script on that queue's slot, all sent at once; the calls together
    never take more jobs than asked for, and a queue that ran short leaves its share to
    the others (a second round)."""
    queues = ["a", "b", "c", "d"]
    async with broker_at(url, "multi") as broker:
        await broker.enqueue([message(f"{q}{i}", queue=q) for q in queues for i in range(3)])
        await broker.enqueue([message(f"x{i}", queue="a") for i in range(6)])
        held = await broker.claim(queues, 4, worker_id="w", lease=30)
        assert sorted(j.message.queue for j in held) == queues  # a share of 1 each
        done = [Completion(j.message.id, j.token, b"\xc0") for j in held]
        outcomes, jobs = await broker.complete_and_claim(
            done, queues, 8, worker_id="w", lease=30, claim_id="c" * 32
        )
        assert outcomes == [FinishOutcome.OK] * 4
        assert len(jobs) == 8
        assert {j.message.id for j in jobs}.isdisjoint({j.message.id for j in held})
        # Only queue a has jobs left (6): b, c and d run short in the first round and a
        # gives the rest in the second.
        rest = await broker.claim(queues, 8, worker_id="w", lease=30)
        stats = await broker.queue_stats(queues)
        assert sorted(j.message.id for j in rest) == [f"x{i}" for i in range(6)]
        assert sum(s.counts[JobState.ACTIVE] for s in stats) == 14
        assert sum(s.counts[JobState.COMPLETED] for s in stats) == 4
        assert sum(s.counts[JobState.WAITING] for s in stats) == 0
        # A re-sent settle (same claim id) claims nothing more: it answers its jobs again.
        again, jobs_again = await broker.complete_and_claim(
            done, queues, 8, worker_id="w", lease=30, claim_id="c" * 32
        )
        assert again == [FinishOutcome.ALREADY_FINISHED] * 4
        assert sorted(j.message.id for j in jobs_again) == sorted(j.message.id for j in jobs)
        assert sum(s.counts[JobState.ACTIVE] for s in await broker.queue_stats(queues)) == 14


async def test_the_startup_check_names_keys_off_the_queue_slot() -> None:
    keys = Keys("app")
    assert check_slots(keys, ["q0", "emails"]) is None

    class Broken(Keys):
        __slots__ = ()

        def stale(self, queue: str) -> str:
            return f"typedq:{{app}}:{queue}:z"  # forgot the queue's tag

    problem = check_slots(Broken("app"), ["q0"])
    assert problem is not None
    assert "typedq:{app}:q0:z" in problem
    assert "one Redis Cluster slot" in problem


async def test_a_bad_cluster_url_is_one_clear_line() -> None:
    app = App("badurl", broker="redis+cluster://127.0.0.1:notaport")
    with pytest.raises(ConfigError, match=r"bad Redis Cluster URL .* is not host:port"):
        async with app:
            pass


@pytest.fixture
async def ledger(redis_server: RedisProcess) -> AsyncIterator[aioredis.Redis]:
    flushall(redis_server.port)
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{redis_server.port}/1")
    try:
        yield client
    finally:
        await client.aclose()


@pytest.mark.slow
async def test_two_worker_processes_run_10000_jobs_exactly_once(
    url: str, redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    total = 10_000
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_LEASE": "30",
    }
    procs = [
        spawn_worker("tests.redis_app:app", url, concurrency=16, grace=2, env=env) for _ in range(2)
    ]
    try:
        redis_app.app.use_broker(url)
        async with redis_app.app:
            jobs = await redis_app.work.enqueue_many([redis_app.Work(n=i) for i in range(total)])
            broker = redis_app.app.broker
            deadline = time.monotonic() + 240
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total:
                assert time.monotonic() < deadline, "the workers did not finish in 240 s"
                await anyio.sleep(0.2)
            counts = await broker.counts(DEFAULT_QUEUE)
    finally:
        stop_workers(procs)
        redis_app.app.use_broker("memory://")
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert len(runs) == total
    assert set(runs) == {j.id for j in jobs}
    assert set(runs.values()) == {1}  # exactly once: no job ran twice
    assert counts[JobState.COMPLETED] == total
    # Both processes took part.
    starters = {text(line).split()[1] for line in await ledger.lrange("started", 0, -1)}
    assert len(starters) == 2


@pytest.mark.slow
async def test_a_primary_fails_over_mid_run_and_nothing_is_lost(
    url: str, redis_cluster: RedisCluster, redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    """``CLUSTER FAILOVER`` of the primary holding the queue while 2 worker processes run
    its jobs: every job completes, and none runs twice except by an expired lease (a
    manual failover loses no write, so here: none at all)."""
    total = 3000
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_LEASE": "30",
    }
    procs = [
        spawn_worker("tests.redis_app:app", url, concurrency=8, grace=2, env=env) for _ in range(2)
    ]
    try:
        redis_app.app.use_broker(url)
        async with redis_app.app:
            broker = redis_app.app.broker
            assert isinstance(broker, RedisBroker)
            jobs = await redis_app.work.enqueue_many(
                [redis_app.Work(n=i, sleep=0.002) for i in range(total)]
            )
            deadline = time.monotonic() + 240
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total // 4:
                assert time.monotonic() < deadline
                await anyio.sleep(0.05)
            slot = key_slot(broker.keys.counts(DEFAULT_QUEUE).encode())
            old, new = await anyio.to_thread.run_sync(failover_slot, redis_cluster, slot)
            assert old != new
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total:
                assert time.monotonic() < deadline, "the workers did not finish in 240 s"
                await anyio.sleep(0.2)
            counts = await broker.counts(DEFAULT_QUEUE)
            assert await broker.check_epoch()  # no loss of data reported
    finally:
        stop_workers(procs)
        redis_app.app.use_broker("memory://")
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert set(runs) == {j.id for j in jobs}
    assert set(runs.values()) == {1}
    assert counts[JobState.COMPLETED] == total
    assert counts[JobState.FAILED] == 0
