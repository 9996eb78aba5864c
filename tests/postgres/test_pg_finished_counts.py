"""The counts of finished and trimmed jobs on the PostgreSQL broker, kept in parts since
migration 16 (a row per connection's shard, summed when read): a schema migrated from
version 15 keeps its counts exactly, and the count bound goes on from them; finishes on
many connections at once keep the counts exact."""

from __future__ import annotations

import itertools
import os

import anyio
import asyncpg
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, count, msg
from typedq import JobState, Retention
from typedq.broker.base import BrokerSettings, Completion, Failure
from typedq.broker.postgres import PostgresBroker, connection
from typedq.broker.postgres.schema import MIGRATIONS

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_schemas = itertools.count()
COMPLETED, FAILED = 3, 4


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def fresh_schema(url: str) -> tuple[str, str]:
    schema = f"fincount_{next(_schemas)}_{os.getpid() % 1000}"
    return schema, f"{url}?schema={schema}"


async def counted(
    conn: asyncpg.Connection, schema: str, ns: str, *, parts: bool = True
) -> dict[int, tuple[int, int]]:
    """Per final state: (its count, ``finished`` and its parts summed; its rows in jobs)."""
    sql = f'SELECT state, n FROM "{schema}".finished WHERE ns = $1'  # noqa: S608
    if parts:  # migration 16's
        sql += f' UNION ALL SELECT state, n FROM "{schema}".finished_parts WHERE ns = $1'  # noqa: S608
    kept = await conn.fetch(f"SELECT state, sum(n) AS n FROM ({sql}) c GROUP BY state", ns)  # noqa: S608
    rows = await conn.fetch(
        f'SELECT state, count(*) AS n FROM "{schema}".jobs WHERE ns = $1 AND state >= 3 '  # noqa: S608
        "GROUP BY state",
        ns,
    )
    counts = {row["state"]: int(row["n"]) for row in kept}
    stored = {row["state"]: int(row["n"]) for row in rows}
    return {st: (counts.get(st, 0), stored.get(st, 0)) for st in sorted({*counts, *stored})}


async def finish(broker: PostgresBroker, n: int, *, fail: bool = False) -> list[str]:
    """Enqueue n jobs of queue q, claim them and complete (or fail) them; their ids."""
    messages = [msg() for _ in range(n)]
    await broker.enqueue(messages)
    jobs = await broker.claim(["q"], n, worker_id="w", lease=30)
    assert len(jobs) == n
    if fail:
        await broker.fail([Failure(id=j.message.id, token=j.token, error=b"x") for j in jobs])
    else:
        await broker.complete([Completion(j.message.id, j.token, b"") for j in jobs])
    return [m.id for m in messages]


async def test_migration_16_carries_the_counts_over_and_the_bound_goes_on_from_them(
    pg_cluster: PgCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schema at version 15 with finished and trimmed jobs counted in ``finished`` and
    ``trimmed``; six brokers connect at once and migrate it once. The counts read the
    same after, and the next completions trim from them: past completed_max=4, the
    oldest completed jobs go, counted with those trimmed before."""
    schema, url = fresh_schema(pg_cluster.url)
    settings = BrokerSettings(namespace="ns", retention=Retention(completed_max=4, failed_max=100))
    with anyio.fail_after(TEST_DEADLINE):
        monkeypatch.setattr(connection, "MIGRATIONS", MIGRATIONS[:15])
        old = PostgresBroker(url, settings)
        await old.connect()
        try:
            first = await finish(old, 5)  # the first trimmed: 4 kept
            await finish(old, 2, fail=True)
        finally:
            await old.close()
        monkeypatch.undo()
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            before = await counted(conn, schema, "ns", parts=False)
            assert before == {COMPLETED: (4, 4), FAILED: (2, 2)}
            brokers = [PostgresBroker(url, settings) for _ in range(6)]
            async with anyio.create_task_group() as tg:
                for broker in brokers:
                    tg.start_soon(broker.connect)
            try:
                versions = await conn.fetch(f'SELECT version FROM "{schema}".migrations')  # noqa: S608
                assert sorted(r[0] for r in versions) == list(range(1, len(MIGRATIONS) + 1))
                assert await counted(conn, schema, "ns") == before
                (stats,) = await brokers[0].queue_stats(["q"])
                assert stats.trimmed == {JobState.COMPLETED: 1}
                assert count(stats.counts, JobState.COMPLETED) == 4
                # Three more: seven counted, the three oldest go (the carried count read).
                later = await finish(brokers[1], 3)
                assert await counted(conn, schema, "ns") == {COMPLETED: (4, 4), FAILED: (2, 2)}
                kept = [r.message.id for r in await brokers[2].get(first + later) if r]
                assert kept == [first[-1], *later]
                (stats,) = await brokers[3].queue_stats(["q"])
                assert stats.trimmed == {JobState.COMPLETED: 4}
                # An operator's retry takes a failed job off the released row's count.
                failed = await conn.fetchval(
                    f'SELECT id FROM "{schema}".jobs WHERE ns = $1 AND state = 4 LIMIT 1',  # noqa: S608
                    "ns",
                )
                await brokers[4].retry([failed])
                assert (await counted(conn, schema, "ns"))[FAILED] == (1, 1)
            finally:
                for broker in brokers:
                    await broker.close()
        finally:
            await conn.close()


async def test_finishes_on_many_connections_at_once_keep_the_counts_exact(
    pg_cluster: PgCluster,
) -> None:
    """Eight brokers (their own connections, so their own parts) finish jobs at once,
    past the bound: the counts equal the jobs kept in every state, the trims counted
    per queue add up, and the reaper's pass leaves the bound's number exactly."""
    schema, url = fresh_schema(pg_cluster.url)
    settings = BrokerSettings(namespace="ns", retention=Retention(completed_max=30, failed_max=10))
    brokers = [PostgresBroker(url, settings) for _ in range(8)]
    conn = await asyncpg.connect(pg_cluster.url)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            for broker in brokers:
                await broker.connect()

            async def work(broker: PostgresBroker) -> None:
                for i in range(6):
                    await finish(broker, 3, fail=i % 3 == 0)

            async with anyio.create_task_group() as tg:
                for broker in brokers:
                    tg.start_soon(work, broker)
            now = await counted(conn, schema, "ns")
            assert all(c == s for c, s in now.values()), now
            (stats,) = await brokers[0].queue_stats(["q"])
            kept = count(stats.counts, JobState.COMPLETED), count(stats.counts, JobState.FAILED)
            assert kept == (now[COMPLETED][1], now[FAILED][1])
            assert stats.trimmed[JobState.COMPLETED] + kept[0] == 8 * 4 * 3
            assert stats.trimmed[JobState.FAILED] + kept[1] == 8 * 2 * 3
            await brokers[0].recover_stalled()
            assert await counted(conn, schema, "ns") == {COMPLETED: (30, 30), FAILED: (10, 10)}
    finally:
        await conn.close()
        for broker in brokers:
            await broker.close()
