"""Fair shares on PostgreSQL (migration 10): the key and weight read from the envelope's
last bytes, and claims racing over the lanes from two brokers while a producer adds
jobs. The rules are the contract suite's (tests/contract/test_fair.py, on every
broker); here is what only this broker's layout can get wrong (a throwaway cluster:
tests/pg_harness.py)."""

from __future__ import annotations

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq.broker.base import BrokerSettings, Completion, JobMessage
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fair(key: str, weight: int, queue: str = "q", job_id: str | None = None) -> JobMessage:
    return msgspec.structs.replace(
        msg(queue=queue, job_id=job_id), fair_key=key, fair_weight=weight
    )


async def rows(
    cluster: PgCluster, broker: PostgresBroker, sql: str, *args: object
) -> list[dict[str, object]]:
    conn = await asyncpg.connect(cluster.url)
    try:
        found = await conn.fetch(sql.format(s=f'"{broker.target.schema}"'), *args)
    finally:
        await conn.close()
    return [dict(row) for row in found]


async def test_every_weight_and_key_length_is_read_from_the_envelope(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """Weights of each msgpack int width (1 byte, uint8, uint16, whose last byte may be
    0), keys of each str header (fixstr, str8 with a length byte below and above 0x80);
    a plain job stores none."""
    weights = [1, 127, 128, 255, 256, 512, 10_000]
    keys = ["k", "k" * 31, "k" * 32, "x.y:z-" * 21, "h" * 128, "k" * 200]
    broker = PostgresBroker(pg_cluster.url, BrokerSettings(namespace=app_name))
    await broker.connect()
    try:
        jobs = [
            fair(key, w, job_id=f"j{i}-{j}")
            for i, w in enumerate(weights)
            for j, key in enumerate(keys)
        ]
        plain = msg(job_id="plain")
        await broker.enqueue([*jobs, plain])
        stored = await rows(
            pg_cluster,
            broker,
            "SELECT id, fair, fair_weight, gate FROM {s}.jobs WHERE ns = $1",
            app_name,
        )
        by_id = {row["id"]: row for row in stored}
        for job in jobs:
            row = by_id[job.id]
            assert row["fair"] == f"f\x1ft\x1f{job.fair_key}"
            assert row["fair_weight"] == job.fair_weight
            assert row["gate"] == row["fair"]  # waiting in its lane
        assert (by_id["plain"]["fair"], by_id["plain"]["gate"]) == (None, None)
        views = {(k.key, k.weight) for k in (await broker.flow_keys("q", "fair", limit=100)).keys}
        # One lane per key; the newest job's weight is the next turn's.
        assert views == {(key, weights[-1]) for key in keys}
    finally:
        await broker.close()


async def test_racing_claims_take_every_fair_job_once_while_jobs_arrive(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """Four claim loops on two brokers (two pools) drain 100 keys while a producer adds
    jobs to the same keys: every job is claimed exactly once, and no lane is left (a
    claim that drops a lane never drops one a job is joining)."""
    brokers = [PostgresBroker(pg_cluster.url, BrokerSettings(namespace=app_name)) for _ in range(2)]
    for broker in brokers:
        await broker.connect()
    first = [fair(f"k{i % 100}", 1 + i % 3, job_id=f"a{i}") for i in range(1000)]
    later = [fair(f"k{i % 100}", 1, job_id=f"b{i}") for i in range(500)]
    claimed: list[str] = []
    produced = anyio.Event()
    try:
        await brokers[0].enqueue(first)

        async def produce() -> None:
            for i in range(0, len(later), 10):
                await brokers[1].enqueue(later[i : i + 10])
            produced.set()

        async def drain(broker: PostgresBroker, worker: str) -> None:
            while True:
                jobs = await broker.claim(["q"], 7, worker_id=worker, lease=60)
                if not jobs:
                    if produced.is_set():
                        return
                    await anyio.sleep(0.01)
                    continue
                claimed.extend(j.message.id for j in jobs)
                await broker.complete([Completion(j.message.id, j.token, b"") for j in jobs])

        with anyio.fail_after(TEST_DEADLINE):
            async with anyio.create_task_group() as tg:
                tg.start_soon(produce)
                for n in range(4):
                    tg.start_soon(drain, brokers[n % 2], f"w{n}")
            # A last claim after the producer's final batch committed.
            while jobs := await brokers[0].claim(["q"], 50, worker_id="w", lease=60):
                claimed.extend(j.message.id for j in jobs)
        assert sorted(claimed) == sorted(j.id for j in first + later)
        left = await rows(
            pg_cluster, broker, "SELECT count(*) AS n FROM {s}.fair_lanes WHERE ns = $1", app_name
        )
        assert left == [{"n": 0}]
    finally:
        for broker in brokers:
            await broker.close()
