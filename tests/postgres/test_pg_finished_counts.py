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
    """Per final state with any: (its count, ``finished`` and its parts summed; its rows
    in jobs)."""
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
    both = {st: (counts.get(st, 0), stored.get(st, 0)) for st in sorted({*counts, *stored})}
    return {st: pair for st, pair in both.items() if pair != (0, 0)}


async def finish(
    broker: PostgresBroker, n: int, *, fail: bool = False, queue: str = "q"
) -> list[str]:
    """Enqueue n jobs of ``queue``, claim them and complete (or fail) them; their ids."""
    messages = [msg(queue=queue) for _ in range(n)]
    await broker.enqueue(messages)
    jobs = await broker.claim([queue], n, worker_id="w", lease=30)
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
        # Version 15's plain enqueue (enqueue_waking is migration 17's).
        old._sql["enqueue_waking"] = old._sql["enqueue"]
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

            async def work(broker: PostgresBroker, queue: str) -> None:
                for i in range(6):
                    await finish(broker, 3, fail=i % 3 == 0, queue=queue)

            queues = [f"q{i}" for i in range(len(brokers))]
            async with anyio.create_task_group() as tg:
                for broker, queue in zip(brokers, queues, strict=True):
                    tg.start_soon(work, broker, queue)
            now = await counted(conn, schema, "ns")
            assert all(c == s for c, s in now.values()), now
            stats = await brokers[0].queue_stats(queues)
            for state, made in ((JobState.COMPLETED, 8 * 4 * 3), (JobState.FAILED, 8 * 2 * 3)):
                kept = sum(count(q.counts, state) for q in stats)
                assert kept == now[COMPLETED if state is JobState.COMPLETED else FAILED][1]
                assert sum(q.trimmed.get(state, 0) for q in stats) + kept == made
            await brokers[0].recover_stalled()
            assert await counted(conn, schema, "ns") == {COMPLETED: (30, 30), FAILED: (10, 10)}
            # The operator actions take jobs off the count (the released row, made by the
            # first finish of each state in a schema that never had one).
            one = f'SELECT id FROM "{schema}".jobs WHERE ns = $1 AND state = $2 LIMIT 1'  # noqa: S608
            await brokers[1].retry([await conn.fetchval(one, "ns", FAILED)])
            await brokers[2].remove([await conn.fetchval(one, "ns", COMPLETED)])
            assert await counted(conn, schema, "ns") == {COMPLETED: (29, 29), FAILED: (9, 9)}
    finally:
        await conn.close()
        for broker in brokers:
            await broker.close()


async def test_an_excess_over_the_bound_is_deleted_once_by_two_finishes_at_once(
    pg_cluster: PgCluster,
) -> None:
    """15 completed jobs kept, then two completions at once with completed_max=10: each
    sees 5 over the bound beside its own job. They delete that excess once (the second
    waits for the bound's lock and reads the count again): 10 kept, not 15 + 2 - 12."""
    schema, url = fresh_schema(pg_cluster.url)
    settings = BrokerSettings(namespace="ns", retention=Retention(completed_max=100))
    broker = PostgresBroker(url, settings)
    first = await asyncpg.connect(pg_cluster.url)
    second = await asyncpg.connect(pg_cluster.url)
    broker_conn = await asyncpg.connect(pg_cluster.url)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            await broker.connect()
            await finish(broker, 15)
            await broker.enqueue([msg(), msg()])
            jobs = await broker.claim(["q"], 2, worker_id="w", lease=30)
            sql = f'SELECT "{schema}".complete($1, $2, $3, $4, 1e9, 10, $5)'
            one, two = first.transaction(), second.transaction()
            await one.start()
            await two.start()
            a, b = (("ns", [j.message.id], [j.token], [b""], f"typedq_{schema}") for j in jobs)
            assert await first.fetchval(sql, *a) == [0]
            done = anyio.Event()

            async def call() -> None:
                await second.fetchval(sql, *b)
                done.set()

            waits = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1"
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                # The second call waits for a lock (or has ended: it did not wait).
                while not done.is_set():
                    if await broker_conn.fetchval(waits, second.get_server_pid()):
                        break
                    await anyio.sleep(0.01)
                await one.commit()
            await two.commit()
            assert await counted(first, schema, "ns") == {COMPLETED: (10, 10)}
    finally:
        for conn in (first, second, broker_conn):
            await conn.close()
        await broker.close()
