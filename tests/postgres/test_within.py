"""Transactional enqueue on the PostgreSQL broker (``within=``, SPEC section 10): the job
exists if and only if the caller's transaction commits, through each driver a caller may
hold (asyncpg, psycopg 3, SQLAlchemy's AsyncSession over either), on a throwaway cluster
(tests/pg_harness.py)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import asyncpg
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, In, Out
from typedq import App, InvalidOption, JobState

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_tables = itertools.count()

DRIVERS = ["asyncpg", "psycopg", "sqlalchemy+asyncpg", "sqlalchemy+psycopg"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Tx:
    """A caller's transaction on one driver: its business write, commit and rollback,
    and the object the caller passes as ``within=``."""

    def __init__(self, driver: str, handle: Any, table: str) -> None:
        self.driver = driver
        self.handle = handle  # what within= gets
        self.table = table
        self._asyncpg_tx: Any = None

    async def begin(self) -> None:
        if self.driver == "asyncpg":
            self._asyncpg_tx = self.handle.transaction()
            await self._asyncpg_tx.start()
        # psycopg (autocommit off) and SQLAlchemy's session begin at their first statement.

    async def write(self, order: int) -> None:
        # The table's name is the test's own (orders_<n>), the value an int.
        sql = f"INSERT INTO {self.table} (id) VALUES ({order})"  # noqa: S608
        if self.driver in ("asyncpg", "psycopg"):
            await self.handle.execute(sql)
        else:
            await self.handle.execute(text(sql))

    async def commit(self) -> None:
        if self.driver == "asyncpg":
            await self._asyncpg_tx.commit()
        else:
            await self.handle.commit()

    async def rollback(self) -> None:
        if self.driver == "asyncpg":
            await self._asyncpg_tx.rollback()
        else:
            await self.handle.rollback()


@asynccontextmanager
async def transaction(driver: str, pg: PgCluster, table: str) -> AsyncIterator[Tx]:
    """A connection of ``driver`` to the cluster, with a transaction begun."""
    url = pg.url
    if driver == "asyncpg":
        conn = await asyncpg.connect(url)
        try:
            tx = Tx(driver, conn, table)
            await tx.begin()
            yield tx
        finally:
            await conn.close()
    elif driver == "psycopg":
        aconn = await psycopg.AsyncConnection.connect(url)
        try:
            tx = Tx(driver, aconn, table)
            yield tx
        finally:
            await aconn.close()
    else:
        dialect = driver.split("+")[1]
        engine = create_async_engine(url.replace("postgresql://", f"postgresql+{dialect}://"))
        try:
            async with AsyncSession(engine) as session:
                yield Tx(driver, session, table)
        finally:
            await engine.dispose()


async def orders_table(pg: PgCluster) -> str:
    table = f"orders_{next(_tables)}"
    conn = await asyncpg.connect(pg.url)
    try:
        await conn.execute(f"CREATE TABLE {table} (id integer PRIMARY KEY)")
    finally:
        await conn.close()
    return table


async def orders(pg: PgCluster, table: str) -> list[int]:
    conn = await asyncpg.connect(pg.url)
    try:
        rows = await conn.fetch(f"SELECT id FROM {table} ORDER BY id")  # noqa: S608
        return [r[0] for r in rows]
    finally:
        await conn.close()


def work_app(app_name: str, pg: PgCluster) -> tuple[App, Any]:
    app = App(app_name, broker=pg.url)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n * 10)

    return app, work


async def stored(app: App) -> int:
    return sum((await app.broker.counts("default")).values())


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_rolled_back_transaction_leaves_no_job(
    driver: str, app_name: str, pg_cluster: PgCluster
) -> None:
    table = await orders_table(pg_cluster)
    app, work = work_app(app_name, pg_cluster)
    with anyio.fail_after(TEST_DEADLINE):
        async with app, transaction(driver, pg_cluster, table) as tx:
            await tx.write(1)
            job = await work.enqueue(In(1), within=tx.handle)
            assert job.created
            await tx.rollback()
            assert await stored(app) == 0
            assert await orders(pg_cluster, table) == []


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_committed_transaction_runs_its_job_and_only_then(
    driver: str, app_name: str, pg_cluster: PgCluster
) -> None:
    table = await orders_table(pg_cluster)
    app, work = work_app(app_name, pg_cluster)
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2) as worker:
            async with transaction(driver, pg_cluster, table) as tx:
                await tx.write(7)
                job = await work.enqueue(In(7), within=tx.handle)
                # Not visible outside the transaction: nothing to claim, nothing stored.
                await anyio.sleep(0.05)
                assert await stored(app) == 0
                assert worker.stats.claimed == 0
                await tx.commit()
            # The waiting worker hears of it at the commit (NOTIFY), and runs it once.
            assert await job.result(timeout=10) == Out(70)
    assert await orders(pg_cluster, table) == [7]
    assert worker.stats.completed == 1


@pytest.mark.parametrize("driver", ["asyncpg", "psycopg"])
async def test_enqueue_many_within_stores_all_or_nothing(
    driver: str, app_name: str, pg_cluster: PgCluster
) -> None:
    table = await orders_table(pg_cluster)
    app, work = work_app(app_name, pg_cluster)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with transaction(driver, pg_cluster, table) as tx:
                jobs = await work.enqueue_many([In(i) for i in range(5)], within=tx.handle)
                assert [j.created for j in jobs] == [True] * 5
                await tx.rollback()
            assert await stored(app) == 0
            async with transaction(driver, pg_cluster, table) as tx:
                jobs = await work.enqueue_many([In(i) for i in range(5)], within=tx.handle)
                await tx.commit()
            counts = await app.broker.counts("default")
            assert counts[JobState.WAITING] == 5
            assert [r.message.id for r in await app.broker.get([j.id for j in jobs])] == [  # type: ignore[union-attr]
                j.id for j in jobs
            ]


async def test_a_savepoint_rolled_back_takes_its_job_with_it(
    app_name: str, pg_cluster: PgCluster
) -> None:
    app, work = work_app(app_name, pg_cluster)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            conn = await asyncpg.connect(pg_cluster.url)
            try:
                async with conn.transaction():
                    kept = await work.enqueue(In(1), within=conn)
                    savepoint = conn.transaction()  # nested: a SAVEPOINT
                    await savepoint.start()
                    dropped = await work.enqueue(In(2), within=conn)
                    await savepoint.rollback()
            finally:
                await conn.close()
            records = await app.broker.get([kept.id, dropped.id])
            assert records[0] is not None
            assert records[0].state is JobState.WAITING
            assert records[1] is None


async def test_a_connection_lost_before_commit_leaves_no_job(
    app_name: str, pg_cluster: PgCluster
) -> None:
    """The caller's process dies between its business write and its commit: PostgreSQL
    rolls the transaction back, the job with it."""
    table = await orders_table(pg_cluster)
    app, work = work_app(app_name, pg_cluster)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            conn = await asyncpg.connect(pg_cluster.url)
            tx = conn.transaction()
            await tx.start()
            await conn.execute(f"INSERT INTO {table} (id) VALUES (3)")  # noqa: S608
            await work.enqueue(In(3), within=conn)
            pid = conn.get_server_pid()
            admin = await asyncpg.connect(pg_cluster.url)
            try:
                assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            finally:
                await admin.close()
            conn.terminate()
            assert await stored(app) == 0
            assert await orders(pg_cluster, table) == []


async def test_a_connection_with_no_transaction_open_is_refused_in_one_line(
    app_name: str, pg_cluster: PgCluster
) -> None:
    app, work = work_app(app_name, pg_cluster)
    async with app:
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            with pytest.raises(
                InvalidOption, match=r"^within= got asyncpg\..*no transaction is open"
            ) as refused:
                await work.enqueue(In(1), within=conn)
            assert "\n" not in str(refused.value)
        finally:
            await conn.close()
        aconn = await psycopg.AsyncConnection.connect(pg_cluster.url, autocommit=True)
        try:
            with pytest.raises(InvalidOption, match=r"no transaction is open on it \(autocommit\)"):
                await work.enqueue(In(1), within=aconn)
        finally:
            await aconn.close()
        with pytest.raises(
            InvalidOption, match=r"^within= got builtins\.dict: pass the connection"
        ):
            await work.enqueue(In(1), within={})
        assert await stored(app) == 0


@pytest.mark.parametrize("driver", DRIVERS)
async def test_a_workflow_within_a_transaction_is_stored_whole_at_its_commit(
    driver: str, app_name: str, pg_cluster: PgCluster
) -> None:
    """A chain and a fan-in enqueued ``within=`` exist (every job of them) if and only if
    the transaction commits, and then run to their results."""
    table = await orders_table(pg_cluster)
    app = App(app_name, broker=pg_cluster.url)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n * 10)

    @app.task
    async def again(x: Out) -> In:
        return In(x.n + 1)

    @app.task
    async def total(xs: list[Out]) -> Out:
        return Out(sum(x.n for x in xs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with transaction(driver, pg_cluster, table) as tx:
                await tx.write(1)
                chain = await work.then(again).then(work).enqueue(In(1), within=tx.handle)
                fan = await work.map([In(1), In(2)]).then(total).enqueue(within=tx.handle)
                assert chain.created
                assert fan.created
                await tx.rollback()
            assert await stored(app) == 0
            async with transaction(driver, pg_cluster, table) as tx:
                await tx.write(2)
                chain = await work.then(again).then(work).enqueue(In(1), within=tx.handle)
                fan = await work.map([In(1), In(2)]).then(total).enqueue(within=tx.handle)
                await tx.commit()
            assert await stored(app) == 3 + 3
            async with app.worker(concurrency=4):
                assert await chain.result(timeout=10) == Out(110)
                assert await fan.result(timeout=10) == Out(30)
    assert await orders(pg_cluster, table) == [2]
