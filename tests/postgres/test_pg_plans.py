"""Plans made before a schema's tables have statistics (migration 14): a claim, a run
append, a run's end and the trim of finished jobs past their bound, on a connection
whose functions were planned while the tables were empty, read what they need, not
every retained job or run.

A PL/pgSQL function keeps the generic plan it makes at its sixth call; without column
statistics (a new schema, until autovacuum's first analyze) the planner takes
``ns = $1`` for a rare value. So planned, the claim's promotion of due jobs read every
job of the namespace by the primary key at every claim, a run append's lock and a
run end's age bound every run, and a trim every job (issue 26). The buffers a call touches are counted by
``EXPLAIN (ANALYZE, BUFFERS)`` on the same connection, whose function cache holds the
plans; they include the function's own statements.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import pytest

from tests.pg_harness import PgCluster
from tests.support import connected
from typedq.broker.base import Completion, Failure, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.broker.runs import RunSpec

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_schemas = itertools.count()
#: Finished jobs (or ended runs) kept when a call is measured: the old plans read each.
_KEPT = 3000
#: Retention bounds no test run reaches ({completed, failed}).
_TTLS = [1e9, 1e9]
_CAPS = [10**6, 10**6]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def _unanalyzed(
    pg_cluster: PgCluster,
) -> AsyncIterator[tuple[PostgresBroker, asyncpg.Connection, str]]:
    """A broker on a new schema whose tables autovacuum never analyzes while the test
    runs, a connection of its own (where the test's EXPLAINs make and keep their plans)
    and the schema's name."""
    schema = f"plans{next(_schemas)}"
    base = pg_cluster.url.split("?")[0]
    # 60 s: a test stores and ends 3,000 jobs or runs (16 s alone at a load of 4, past
    # connected's 20 s default on a loaded box).
    async with connected("plans", f"{base}?schema={schema}", deadline=60) as broker:
        assert isinstance(broker, PostgresBroker)
        conn = await asyncpg.connect(base)
        try:
            for table in ("jobs", "runs"):
                await conn.execute(
                    f'ALTER TABLE "{schema}".{table} SET (autovacuum_enabled = false)'
                )
            yield broker, conn, schema
        finally:
            await conn.close()


async def _statistics(conn: asyncpg.Connection, schema: str, table: str) -> int:
    """Column statistics of ``table`` (0: never analyzed: the plans under test stand)."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stats WHERE schemaname = $1 AND tablename = $2",
            schema,
            table,
        )
    )


async def _claim_buffers(conn: asyncpg.Connection, schema: str, ns: str, claim_id: str) -> int:
    """Shared buffers one claim of an empty queue touches (no limited tasks)."""
    raw = await conn.fetchval(
        f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT * FROM "{schema}".claim('  # noqa: S608
        "$1, $2, 1, 'w', 30.0, $3, '{}'::text[], '{}'::integer[], '{}'::bigint[], "
        "'{}'::integer[], '{}'::bigint[], '{}'::bigint[])",
        ns,
        ["idle"],
        claim_id,
    )
    return _buffers(raw)


def _buffers(explained: str) -> int:
    """Shared buffers an ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` counted."""
    plan = json.loads(explained)[0]["Plan"]
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


async def _run_calls_buffers(conn: asyncpg.Connection, schema: str, ns: str) -> tuple[int, int]:
    """Shared buffers of a run append to a run that does not exist (its runs locked,
    found missing) and of a cancelled run's end with none past the bounds (the age
    bound looked at): the calls' fixed parts, which the kept runs should not grow."""
    append = await conn.fetchval(
        f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT "{schema}".run_append('
        "$1, ARRAY['missing'], ARRAY[0], ARRAY[0], '{}'::bytea[], ARRAY[NULL]::text[], "
        "ARRAY[0], '{}'::text[], ARRAY[0]::smallint[], ARRAY[NULL]::bytea[], "
        "ARRAY[NULL]::bytea[], ARRAY[0], '{}'::text[], ARRAY[NULL]::text[], "
        "ARRAY[NULL]::double precision[], $2, $3, '{}'::text[], '{}'::text[], "
        "'{}'::bytea[], '{}'::integer[], '{}'::double precision[], "
        "'{}'::double precision[], 0, 'none', '{}'::text[], '{}'::text[], '{}'::text[])",
        ns,
        _TTLS,
        _CAPS,
    )
    end = await conn.fetchval(
        f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT "{schema}".run_finish('
        "$1, 'missing', 3::smallint, NULL, NULL, $2, $3, $4)",
        ns,
        0.0,
        _TTLS,
        _CAPS,
    )
    return _buffers(append), _buffers(end)


async def test_a_claim_planned_on_empty_tables_does_not_read_the_kept_jobs(
    pg_cluster: PgCluster,
) -> None:
    """Planned (generic plans, no statistics) while the schema was empty, a claim of an
    empty queue touches about as many buffers with 3,000 finished jobs kept as with
    none (before migration 14: every kept job's index entry and row, each claim)."""
    async with _unanalyzed(pg_cluster) as (broker, conn, schema):
        for i in range(7):  # past the sixth call: the generic plans are kept
            await _claim_buffers(conn, schema, broker.ns, f"e{i}")
        empty = await _claim_buffers(conn, schema, broker.ns, "e7")
        await broker.enqueue(
            [JobMessage(id=f"j{i}", task="t", queue="busy", payload=b"") for i in range(_KEPT)]
        )
        done = 0
        while done < _KEPT:
            jobs = await broker.claim(["busy"], 500, worker_id="w", lease=30)
            assert jobs
            await broker.complete([Completion(j.message.id, j.token, b"") for j in jobs])
            done += len(jobs)
        kept = await _claim_buffers(conn, schema, broker.ns, "k")
        stats = await _statistics(conn, schema, "jobs")
    assert stats == 0, "the jobs table was analyzed: the test measured nothing"
    assert kept - empty < 100, (empty, kept)


async def test_a_run_append_and_end_planned_on_empty_tables_do_not_read_the_kept_runs(
    pg_cluster: PgCluster,
) -> None:
    """Planned (generic plans, no statistics) while the schema was empty, a run append
    and a run's end touch about as many buffers with 3,000 ended runs kept as with none
    (before migration 14: every run's index entry and row, each call)."""
    async with _unanalyzed(pg_cluster) as (broker, conn, schema):
        for _ in range(7):  # past the sixth call: the generic plans are kept
            await _run_calls_buffers(conn, schema, broker.ns)
        empty = await _run_calls_buffers(conn, schema, broker.ns)
        ids = [f"r{i}" for i in range(_KEPT)]
        specs = [
            RunSpec(
                id=run_id,
                name="f",
                queue="q",
                turn_task="typedq.run.f",
                turn_payload=b"",
                input=b"",
            )
            for run_id in ids
        ]
        await broker.create_runs(specs)
        assert all(await broker.cancel_runs(ids))
        kept = await _run_calls_buffers(conn, schema, broker.ns)
        stats = await _statistics(conn, schema, "runs")
    assert stats == 0, "the runs table was analyzed: the test measured nothing"
    assert kept[0] - empty[0] < 100, (empty, kept)
    assert kept[1] - empty[1] < 100, (empty, kept)


async def _trim_buffers(conn: asyncpg.Connection, schema: str, ns: str) -> int:
    """Shared buffers of a completion's count with the bound at 0: the trim runs, and
    deletes the completed jobs there are (up to 1,000)."""
    raw = await conn.fetchval(
        f'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT "{schema}".finished_add('
        "$1, 3::smallint, 1, 1e9, 0, 0, false)",
        ns,
    )
    return _buffers(raw)


async def test_a_trim_planned_on_empty_tables_does_not_read_the_kept_jobs(
    pg_cluster: PgCluster,
) -> None:
    """Planned (generic plans, no statistics) while the schema was empty, the trim of
    completed jobs past the count bound deletes them without reading the 3,000 failed
    jobs kept (before migration 14: every kept job's index entry and row, each trim:
    6,811 buffers against 128)."""
    async with _unanalyzed(pg_cluster) as (broker, conn, schema):
        for _ in range(7):  # past the sixth call: the generic plans are kept
            await _trim_buffers(conn, schema, broker.ns)
        empty = await _trim_buffers(conn, schema, broker.ns)
        await broker.enqueue(
            [JobMessage(id=f"j{i}", task="t", queue="busy", payload=b"") for i in range(_KEPT)]
        )
        done = 0
        while done < _KEPT:
            jobs = await broker.claim(["busy"], 500, worker_id="w", lease=30)
            assert jobs
            # Five completed (trimmed below), the others failed for good (kept).
            completed = [j for j in jobs if int(j.message.id[1:]) < 5]
            await broker.complete([Completion(j.message.id, j.token, b"") for j in completed])
            await broker.fail(
                [
                    Failure(id=j.message.id, token=j.token, error=b"x")
                    for j in jobs
                    if j not in completed
                ]
            )
            done += len(jobs)
        kept = await _trim_buffers(conn, schema, broker.ns)
        left = await conn.fetchval(
            f'SELECT count(*) FROM "{schema}".jobs WHERE ns = $1 AND state = 3',  # noqa: S608
            broker.ns,
        )
        trimmed = await conn.fetchval(  # counted in trimmed and its parts (migration 16)
            f'SELECT sum(n) FROM (SELECT n FROM "{schema}".trimmed '  # noqa: S608
            "WHERE ns = $1 AND queue = $2 AND state = 3 UNION ALL "
            f'SELECT n FROM "{schema}".trimmed_parts '
            "WHERE ns = $1 AND queue = $2 AND state = 3) t",
            broker.ns,
            "busy",
        )
        stats = await _statistics(conn, schema, "jobs")
    assert stats == 0, "the jobs table was analyzed: the test measured nothing"
    assert (left, trimmed) == (0, 5)
    # The five deletes touch some 25 buffers each (the jobs' indexes, the triggers);
    # reading the kept jobs touched about two per job.
    assert kept - empty < _KEPT // 10, (empty, kept)
