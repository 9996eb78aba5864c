"""Task limits on PostgreSQL under concurrent claims: two brokers (two pools, as two
worker processes) of one app claim the same queue at once, many claims in flight on
each; a concurrency limit is never exceeded and a rate window never holds more starts
than its limit. The contract suite (tests/contract/test_limits.py) has the rules; here
is the race the database's locks must win (a throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from tests.contract.test_limits import worst_window
from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq import JobState
from typedq.broker.base import BrokerSettings, Completion, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.limits import limit_args
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def keyed(key: str) -> JobMessage:
    return msgspec.structs.replace(msg(task="t"), concurrency_key=key, rate_key=key)


async def _two_brokers(
    url: str, app_name: str, spec: LimitSpec, n: int = 2
) -> list[PostgresBroker]:
    brokers = [PostgresBroker(url, BrokerSettings(namespace=app_name)) for _ in range(n)]
    for broker in brokers:
        await broker.connect()
        broker.set_limits({"t": spec})
    return brokers


async def _overlap(first: Any, second: Any, sql: str, ns: str, args: tuple[Any, ...]) -> None:
    async with first.transaction(), second.transaction():
        # One job: the other stays untouched (not parked, not locked) by the first.
        took = await first.fetch(sql, ns, ["q"], 1, "w1", 30.0, "c1", *args)
        assert len(took) == 1
        assert await second.fetch(sql, ns, ["q"], 2, "w2", 30.0, "c2", *args) == []


@pytest.mark.parametrize(
    "spec", [LimitSpec(concurrency=1), LimitSpec(rate=1, per_us=60_000_000)], ids=["slot", "rate"]
)
async def test_a_claim_overlapping_an_uncommitted_claim_takes_nothing_of_its_bucket(
    pg_cluster: PgCluster, app_name: str, spec: LimitSpec
) -> None:
    # Two claims at once, each in its own transaction: the first has taken a job of the
    # bucket and not committed yet, when the second counts. The second must not take the
    # bucket's other job (it sees no holder and no start yet): it leaves it in line.
    (broker,) = await _two_brokers(pg_cluster.url, app_name, spec, n=1)
    jobs = [keyed("k"), keyed("k")]
    sql = broker._sql["claim"]
    args = (*limit_args({"t": spec}),)
    first = await asyncpg.connect(broker.target.dsn)
    second = await asyncpg.connect(broker.target.dsn)
    try:
        await broker.enqueue(jobs)
        with anyio.fail_after(TEST_DEADLINE):
            await _overlap(first, second, sql, app_name, args)
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 1
        assert counts[JobState.WAITING] == 1
    finally:
        await first.close()
        await second.close()
        await broker.close()


async def test_concurrent_claims_never_run_two_jobs_of_a_concurrency_one_key(
    pg_cluster: PgCluster, app_name: str
) -> None:
    keys = ["a", "b", "c"]
    jobs = [keyed(k) for _ in range(12) for k in keys]
    brokers = await _two_brokers(pg_cluster.url, app_name, LimitSpec(concurrency=1))
    running: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    done: list[str] = []
    try:
        await brokers[0].enqueue(jobs)

        async def claimer(broker: PostgresBroker, seed: int) -> None:
            rng = random.Random(seed)
            while len(done) < len(jobs):
                claimed = await broker.claim(["q"], 3, worker_id=f"w{seed}", lease=30)
                if not claimed:
                    await broker.wait_for_jobs(["q"], 0.2)
                    continue
                for job in claimed:
                    key = job.message.concurrency_key
                    running[key] += 1
                    peak[key] = max(peak[key], running[key])
                await anyio.sleep(rng.random() * 0.01)
                for job in claimed:
                    # Counted off before the completion is sent: a second holder of the
                    # key can only be claimed once this one's completion has committed.
                    running[job.message.concurrency_key] -= 1
                await broker.complete([Completion(j.message.id, j.token, b"") for j in claimed])
                done.extend(j.message.id for j in claimed)

        with anyio.fail_after(TEST_DEADLINE):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(claimer, brokers[i % 2], i)
        assert sorted(done) == sorted(m.id for m in jobs)
        assert set(peak) == set(keys)
        assert max(peak.values()) == 1
        counts = await brokers[0].counts("q")
        assert counts[JobState.COMPLETED] == len(jobs)
    finally:
        for broker in brokers:
            await broker.close()


async def test_concurrent_claims_keep_every_rate_window(
    pg_cluster: PgCluster, app_name: str
) -> None:
    limit, per_us = 3, 300_000
    jobs = [keyed("k") for _ in range(10)]
    brokers = await _two_brokers(pg_cluster.url, app_name, LimitSpec(rate=limit, per_us=per_us))
    claimed_ids: list[str] = []
    try:
        await brokers[0].enqueue(jobs)

        async def claimer(broker: PostgresBroker, n: int) -> None:
            while len(claimed_ids) < len(jobs):
                claimed = await broker.claim(["q"], 4, worker_id=f"w{n}", lease=30)
                claimed_ids.extend(j.message.id for j in claimed)
                if not claimed:
                    await broker.wait_for_jobs(["q"], 0.2)

        with anyio.fail_after(TEST_DEADLINE):
            async with anyio.create_task_group() as tg:
                for i in range(8):
                    tg.start_soon(claimer, brokers[i % 2], i)
        assert sorted(claimed_ids) == sorted(m.id for m in jobs)
        records = await brokers[0].get(claimed_ids)
        starts = [round(r.started_at * 1_000_000) for r in records if r is not None]
        assert len(starts) == len(jobs)
        assert worst_window(starts, per_us) <= limit
    finally:
        for broker in brokers:
            await broker.close()


async def test_a_waiting_worker_sleeps_while_every_job_is_parked(
    pg_cluster: PgCluster, app_name: str
) -> None:
    # Parked jobs are not work: waiting for jobs sleeps until the gate opens (or the
    # timeout), it does not return at once (a worker would spin on claims).
    brokers = await _two_brokers(pg_cluster.url, app_name, LimitSpec(concurrency=1))
    broker = brokers[0]
    try:
        await broker.enqueue([keyed("k"), keyed("k")])
        (first,) = await broker.claim(["q"], 2, worker_id="w", lease=30)
        assert await broker.claim(["q"], 2, worker_id="w", lease=30) == []
        with anyio.fail_after(TEST_DEADLINE):
            before = anyio.current_time()
            await broker.wait_for_jobs(["q"], 0.3)
            assert anyio.current_time() - before >= 0.25
            # A slot freed by the other broker wakes it.
            async with anyio.create_task_group() as tg:

                async def free_later() -> None:
                    await anyio.sleep(0.1)
                    await brokers[1].complete([Completion(first.message.id, first.token, b"")])

                tg.start_soon(free_later)
                before = anyio.current_time()
                await broker.wait_for_jobs(["q"], TEST_DEADLINE)
                assert anyio.current_time() - before < TEST_DEADLINE / 2
        (second,) = await broker.claim(["q"], 2, worker_id="w", lease=30)
        assert second.message.id != first.message.id
    finally:
        for b in brokers:
            await b.close()


async def test_the_reapers_pass_drops_rate_windows_left_idle(
    pg_cluster: PgCluster, app_name: str
) -> None:
    # One window per rate key ever used would pile up (a key per tenant): the reaper's
    # pass drops those with no start left in the window, as memory's forget_idle.
    (broker,) = await _two_brokers(pg_cluster.url, app_name, LimitSpec(rate=1, per_us=100_000), n=1)
    windows = f'SELECT count(*) FROM "{broker.target.schema}".rate_windows WHERE ns = $1'  # noqa: S608 (the test's own schema)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            await broker.enqueue([keyed("a"), keyed("b")])
            assert len(await broker.claim(["q"], 2, worker_id="w", lease=30)) == 2
            await broker.recover_stalled()
            assert await broker._fetchval("count", windows, app_name) == 2  # still in use
            await anyio.sleep(0.15)
            await broker.recover_stalled()
            assert await broker._fetchval("count", windows, app_name) == 0
    finally:
        await broker.close()
