"""The count bound of ended runs on the PostgreSQL broker (migration 13): ended runs are
counted per state in ``run_counts`` by triggers on ``runs``, and an end past the bound
deletes the oldest of its state, without reading the others."""

from __future__ import annotations

import itertools
import os

import anyio
import asyncpg
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, connected
from typedq import Retention
from typedq.broker.postgres import PostgresBroker, migration_9, migration_13
from typedq.broker.postgres.schema import MIGRATIONS, migrate_sql
from typedq.broker.runs import RunAppend, RunSpec, RunState

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_schemas = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def spec(run_id: str) -> RunSpec:
    return RunSpec(
        id=run_id, name="f", queue="q", turn_task="typedq.run.f", turn_payload=b"", input=b""
    )


def fresh_schema() -> str:
    return f"runret_{next(_schemas)}_{os.getpid() % 1000}"


async def counts(conn: asyncpg.Connection, schema: str, ns: str) -> dict[int, tuple[int, int]]:
    """Per ended state: (its count in run_counts, its rows in runs)."""
    sql = f'SELECT state, n FROM "{schema}".run_counts WHERE ns = $1'  # noqa: S608
    if await conn.fetchval("SELECT to_regclass($1)", f'"{schema}".run_count_parts'):
        # Counted in parts since migration 16, summed.
        sql += f' UNION ALL SELECT state, n FROM "{schema}".run_count_parts WHERE ns = $1'  # noqa: S608
    kept = await conn.fetch(
        f"SELECT state, sum(n) AS n FROM ({sql}) c GROUP BY state HAVING sum(n) <> 0",  # noqa: S608
        ns,
    )
    rows = await conn.fetch(
        f'SELECT state, count(*) AS n FROM "{schema}".runs WHERE ns = $1 AND state > 0 '  # noqa: S608
        "GROUP BY state",
        ns,
    )
    counted = {row["state"]: row["n"] for row in kept}
    stored = {row["state"]: row["n"] for row in rows}
    return {st: (counted.get(st, 0), stored.get(st, 0)) for st in sorted({*counted, *stored})}


async def test_the_count_bound_trims_the_oldest_ended_runs_of_a_state_first(
    pg_cluster: PgCluster,
) -> None:
    schema = fresh_schema()
    url = f"{pg_cluster.url}?schema={schema}"
    retention = Retention(completed_max=3, failed_max=2)
    conn = await asyncpg.connect(pg_cluster.url)
    try:
        async with connected("runret", url, retention=retention) as broker:
            assert isinstance(broker, PostgresBroker)
            done = [f"c{i}" for i in range(6)]
            failed = [f"f{i}" for i in range(4)]
            cancelled = ["x0", "x1"]
            await broker.create_runs([spec(i) for i in [*done, *failed, *cancelled, "live"]])
            # Ended one at a time: each end is later than the one before.
            for run_id in done:
                [ok] = await broker.append_runs(
                    [RunAppend(run_id=run_id, expected=0, state=RunState.COMPLETED, result=b"")]
                )
                assert ok.value == "appended"
                kept = await counts(conn, schema, broker.ns)
                assert kept[1] == (min(done.index(run_id) + 1, 3),) * 2
            for run_id in failed:
                await broker.append_runs(
                    [RunAppend(run_id=run_id, expected=0, state=RunState.FAILED, result=None)]
                )
            assert await broker.cancel_runs(cancelled) == [True, True]
            # Each state's bound alone: the oldest went, the newest stay; cancelled runs
            # are bound by failed_max too (a state of their own), the running one by none.
            present = [r is not None for r in await broker.get_runs([*done, *failed])]
            assert present == [False, False, False, True, True, True, False, False, True, True]
            assert [r is not None for r in await broker.get_runs([*cancelled, "live"])] == [
                True
            ] * 3
            assert await counts(conn, schema, broker.ns) == {1: (3, 3), 2: (2, 2), 3: (2, 2)}
            # A run deleted by any path leaves the count (an operator's delete here).
            await conn.execute(
                f'DELETE FROM "{schema}".runs WHERE ns = $1 AND id = $2',  # noqa: S608
                broker.ns,
                "c5",
            )
            assert (await counts(conn, schema, broker.ns))[1] == (2, 2)
            # A new end under the bound trims nothing; the next one trims the oldest.
            await broker.create_runs([spec("c6"), spec("c7")])
            for run_id in ("c6", "c7"):
                await broker.append_runs(
                    [RunAppend(run_id=run_id, expected=0, state=RunState.COMPLETED, result=b"")]
                )
            present = [r is not None for r in await broker.get_runs(["c3", "c4", "c6", "c7"])]
            assert present == [False, True, True, True]
            assert (await counts(conn, schema, broker.ns))[1] == (3, 3)
    finally:
        await conn.close()


async def test_migration_13_counts_the_runs_ended_before_it(pg_cluster: PgCluster) -> None:
    """Applied to a schema holding ended runs (after migration 9: it depends on none of
    the migrations between), migration 13 counts them, per namespace and state."""
    schema = fresh_schema()
    conn = await asyncpg.connect(pg_cluster.url)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with conn.transaction():
                await conn.execute(f'CREATE SCHEMA "{schema}"')
                for version in range(1, MIGRATIONS.index(migration_9.SQL) + 2):
                    await conn.execute(migrate_sql(version, schema))
                for i, (ns, state) in enumerate(
                    [("a", 1), ("a", 1), ("a", 2), ("a", 0), ("b", 3), ("b", 1)]
                ):
                    await conn.execute(
                        f'INSERT INTO "{schema}".runs (ns, id, name, queue, turn_task, '  # noqa: S608
                        "turn_payload, input, fingerprint, turn_head, turn_tail, state, "
                        "created_at, finished_at, ttls, caps) VALUES ($1, $2, 'f', 'q', 't', "
                        "'', '', '', '', '', $3, 0, $4, '{1e9,1e9}', '{10,10}')",
                        ns,
                        f"r{i}",
                        state,
                        float(i),
                    )
                await conn.execute(migration_13.SQL.format(s=f'"{schema}"'))
            assert await counts(conn, schema, "a") == {1: (2, 2), 2: (1, 1)}
            assert await counts(conn, schema, "b") == {1: (1, 1), 3: (1, 1)}
    finally:
        await conn.close()
