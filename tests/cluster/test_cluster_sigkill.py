"""A primary of the local Redis Cluster SIGKILLed while a worker process runs its queue's
jobs, and its replica promoted by the cluster itself (no ``CLUSTER FAILOVER``): every job
completes, none runs twice (issue 24). A cluster of its own (the session's must stay
whole), with a short ``cluster-node-timeout`` so the promotion takes about a second."""

from __future__ import annotations

import time

import anyio
import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot

from tests import redis_app
from tests.redis_harness import (
    RedisCluster,
    RedisProcess,
    _command,
    replica_of,
    slot_owner,
)
from tests.support import spawn_worker, stop_workers
from typedq import BrokerUnavailable
from typedq.broker.base import JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import text
from typedq.task import DEFAULT_QUEUE

pytestmark = [
    pytest.mark.redis,
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.anyio,
    pytest.mark.asyncio_only,
]


def is_primary(port: int) -> bool:
    return _command(port, "ROLE").startswith(b"*3\r\n$6\r\nmaster")


async def completed(broker: RedisBroker) -> int:
    """Completed jobs of the queue, 0 while the cluster cannot answer."""
    try:
        return (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED]
    except BrokerUnavailable:
        return 0


async def test_a_sigkilled_primary_is_promoted_away_and_no_job_is_lost_or_run_twice(
    redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    total = 600
    cluster = RedisCluster(node_timeout_ms=500)
    cluster.start()
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_LEASE": "30",
    }
    procs = [spawn_worker("tests.redis_app:app", cluster.url, concurrency=8, grace=2, env=env)]
    try:
        redis_app.app.use_broker(cluster.url)
        async with redis_app.app:
            broker = redis_app.app.broker
            assert isinstance(broker, RedisBroker)
            jobs = await redis_app.work.enqueue_many(
                [redis_app.Work(n=i, sleep=0.005) for i in range(total)]
            )
            deadline = time.monotonic() + 120
            while await completed(broker) < total // 4:
                assert time.monotonic() < deadline
                await anyio.sleep(0.02)
            slot = key_slot(broker.keys.counts(DEFAULT_QUEUE).encode())
            old = slot_owner(cluster, slot)
            new = replica_of(cluster, old)
            victim = next(n for n in cluster.nodes if n.port == old)
            victim.kill()  # SIGKILL: no warning, no handover
            killed_at = time.monotonic()
            while not is_primary(new):
                assert time.monotonic() < deadline, "the replica was not promoted"
                await anyio.sleep(0.05)
            promoted_after = time.monotonic() - killed_at
            while await completed(broker) < total:
                assert time.monotonic() < deadline, "the worker did not finish in 120 s"
                await anyio.sleep(0.1)
            counts = await broker.counts(DEFAULT_QUEUE)
    finally:
        stop_workers(procs)
        redis_app.app.use_broker("memory://")
        cluster.stop()
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert set(runs) == {j.id for j in jobs}  # none lost
    assert set(runs.values()) == {1}  # none ran twice
    assert counts[JobState.COMPLETED] == total
    assert counts[JobState.FAILED] == 0
    print(f"promoted {promoted_after:.2f} s after the SIGKILL")
    assert promoted_after < 10
