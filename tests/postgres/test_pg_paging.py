"""The PostgreSQL broker's ``page_jobs`` beyond the contract: its keyset statements (read
from each state's index at the cursor) list every state in the order of its place, as
the whole state sorted would, with jobs that tie on their priority, due time or start
time, at every page size and from cursors between two places; and each state's page is
answerable from an index in order, with no sort of the state (a throwaway cluster:
tests/pg_harness.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq import JobState
from typedq.broker.base import BrokerSettings, Completion, Failure
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.rows import CODE
from typedq.broker.postgres.statements import page_args

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

#: Each state's place (its listing order), as SQL: the order the pages must follow.
PLACES = {
    JobState.WAITING: ("-priority", "seq"),
    JobState.SCHEDULED: ("run_at", "seq"),
    JobState.ACTIVE: ("started_at", "seq"),
    JobState.COMPLETED: ("-seq", "0"),
    JobState.FAILED: ("-seq", "0"),
    JobState.CANCELLED: ("-seq", "0"),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def sorted_ids(
    conn: asyncpg.Connection, ns: str, state: JobState, after: tuple[float, int, str] | None
) -> list[str]:
    """The ids of ``state`` in the order of their places, after the place ``after``:
    the whole state sorted (what the pages must answer)."""
    a, b = PLACES[state]
    place = f"({a})::float8, ({b})::bigint, id"
    rows = await conn.fetch(
        f'SELECT id FROM "typedq".jobs WHERE ns = $1 AND queue = $2 AND state = $3 '  # noqa: S608
        f"AND ({place}) > ($4, $5, $6) ORDER BY {place}",
        ns,
        "q",
        CODE[state],
        *(after or (float("-inf"), 0, "")),
    )
    return [row["id"] for row in rows]


async def walk(
    broker: PostgresBroker, state: JobState, limit: int, cursor: str | None
) -> list[str]:
    ids: list[str] = []
    while True:
        page = await broker.page_jobs("q", state, cursor=cursor, limit=limit)
        assert len(page.ids) <= limit
        ids += page.ids
        if page.cursor is None:
            return ids
        cursor = page.cursor


@contextlib.asynccontextmanager
async def filled(url: str, ns: str) -> AsyncIterator[tuple[PostgresBroker, asyncpg.Connection]]:
    """A broker of namespace ``ns`` with jobs in every state (:func:`fill`), and a
    connection of its own to the database."""
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    try:
        conn = await asyncpg.connect(broker.target.dsn)
        try:
            await fill(broker)
            yield broker, conn
        finally:
            await conn.close()
    finally:
        await broker.close()


async def fill(broker: PostgresBroker) -> None:
    """Jobs of every state, many tying on their first place part: priority levels,
    one batch's due time, one claim's start time."""
    await broker.enqueue([msg(priority=(0, 5, -3)[i % 3]) for i in range(60)])
    await broker.enqueue([msg(delay=3600.0) for _ in range(25)])  # one run_at: tied
    await broker.enqueue([msg(delay=3600.0 + i % 4) for i in range(20)])
    claimed = [j for _ in range(4) for j in await broker.claim(["q"], 9, worker_id="w", lease=60)]
    done = [Completion(j.message.id, j.token, b"\xc0") for j in claimed[:12]]
    await broker.complete(done)
    await broker.fail(
        [Failure(id=j.message.id, token=j.token, error=b"\xc0") for j in claimed[12:18]]
        + [
            Failure(id=j.message.id, token=j.token, error=b"\xc0", cancelled=True)
            for j in claimed[18:22]
        ]
    )
    # Left active: claimed[22:] (14 jobs, three claims' start times).


async def test_pages_follow_each_state_sorted_by_place(
    pg_cluster: PgCluster, app_name: str
) -> None:
    with anyio.fail_after(TEST_DEADLINE):
        async with filled(pg_cluster.url, app_name) as (broker, conn):
            for state in PLACES:
                expected = await sorted_ids(conn, app_name, state, None)
                assert expected, state
                for limit in (1, 4, 1000):
                    assert await walk(broker, state, limit, None) == expected, (state, limit)
            # Cursors between places: between two priorities (no job of the higher one
            # follows), between two due times, between two finished jobs' seqs, and
            # before every place.
            cursors = {
                JobState.WAITING: [(-2.5, 0, "z"), (-5, 10**12, ""), (-7.25, 3, "a")],
                JobState.SCHEDULED: [(0.5, 0, ""), (1e12, 0, "")],
                JobState.COMPLETED: [(-1e15, 0, ""), (-2.5, 0, "")],
            }
            for state, places in cursors.items():
                letter = "wsacfx"[list(JobState).index(state)]
                for after in places:
                    cursor = f"{letter}{after[0]!r}:{after[1]}:{after[2] or '-'}"
                    exact = (after[0], after[1], after[2] or "-")
                    expected = await sorted_ids(conn, app_name, state, exact)
                    assert await walk(broker, state, 3, cursor) == expected, (state, cursor)
            # A cursor in the middle of the tied due times, by the place the broker gave.
            middle = await broker.page_jobs("q", JobState.SCHEDULED, limit=11)
            assert middle.cursor is not None
            rest = await walk(broker, JobState.SCHEDULED, 5, middle.cursor)
            assert middle.ids + rest == await sorted_ids(conn, app_name, JobState.SCHEDULED, None)


async def test_each_page_is_read_from_an_index_in_order(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """With sorts and sequential scans priced out, a statement whose order no index
    gives still sorts: none does here but the waiting page's merge of its two branches
    (at most twice the page's rows), and each scan is an index scan of an index in the
    state's order, whatever the table's size or statistics. (A final state's page may
    be read from ``jobs_finished_order``, the namespace's finished jobs by seq, when the
    planner takes the queue for most of them: in order too, the queue a filter.)"""
    finals = ("jobs_queue_state", "jobs_finished_order")
    indexes = {
        JobState.WAITING: ("jobs_waiting",),
        JobState.SCHEDULED: ("jobs_scheduled_order",),
        JobState.ACTIVE: ("jobs_active_order",),
        JobState.COMPLETED: finals,
        JobState.FAILED: finals,
        JobState.CANCELLED: finals,
    }
    with anyio.fail_after(TEST_DEADLINE):
        async with filled(pg_cluster.url, app_name) as (broker, conn), conn.transaction():
            await conn.execute("SET LOCAL enable_sort = off")
            await conn.execute("SET LOCAL enable_seqscan = off")
            await conn.execute("SET LOCAL enable_bitmapscan = off")
            for state, names in indexes.items():
                cursor = (await broker.page_jobs("q", state, limit=2)).cursor
                assert cursor is not None, state
                plan = "\n".join(
                    row[0]
                    for row in await conn.fetch(
                        "EXPLAIN (COSTS OFF) " + broker._page_sql[state],
                        app_name,
                        "q",
                        *page_args(state, cursor, 2),
                    )
                )
                scans = [line for line in plan.splitlines() if "Scan" in line and "using" in line]
                assert scans, plan
                assert all(any(f"using {index} on" in line for index in names) for line in scans), (
                    plan
                )
                sorts = plan.count("Sort Key")
                assert sorts == (1 if state is JobState.WAITING else 0), plan
