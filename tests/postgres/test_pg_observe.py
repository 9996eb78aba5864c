"""The PostgreSQL broker's observability beyond the contract files: a schema released at
version 1 migrated to the registries and rollups (its queues kept), the rollups of many
workers' connections summed, and the dashboard and ``typedq inspect --workers`` on a
PostgreSQL app (a throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import anyio
import asyncpg
import httpx
import pytest

from tests.dash_app import Charge, Report, app, charge, report
from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, claim_one, connected, msg
from typedq import JobFailed
from typedq.broker.base import HISTORY_MINUTES, BrokerSettings, Completion, WorkerInfo
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.schema import MIGRATIONS, migrate_sql
from typedq.dashboard import create_app

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_schemas = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.url


def fresh_schema(url: str) -> tuple[str, str]:
    schema = f"obs_{next(_schemas)}_{os.getpid() % 1000}"
    return schema, f"{url}?schema={schema}"


async def test_a_schema_at_version_1_migrates_and_keeps_its_queues(pg_url: str) -> None:
    schema, url = fresh_schema(pg_url)
    conn = await asyncpg.connect(pg_url)
    try:
        # The released first version, with a job stored by its enqueue function.
        async with conn.transaction():
            await conn.execute(f'CREATE SCHEMA "{schema}"')
            await conn.execute(
                f'CREATE TABLE "{schema}".migrations (version integer PRIMARY KEY, '
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            await conn.execute(migrate_sql(1, schema))
            await conn.execute(f'INSERT INTO "{schema}".migrations (version) VALUES (1)')  # noqa: S608 (a test's own name)
        old = PostgresBroker(url, BrokerSettings(namespace="old"))
        # Version 1's enqueue takes the first nine (no task or limit keys).
        args = old._enqueue_args([msg(queue="legacy")])[:9]
        await conn.fetchval(f'SELECT "{schema}".enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9)', *args)
    finally:
        await conn.close()
    with anyio.fail_after(TEST_DEADLINE):
        broker = PostgresBroker(url, BrokerSettings(namespace="old"))
        await broker.connect()
        try:
            assert await broker.schema_versions(apply=False) == (len(MIGRATIONS), len(MIGRATIONS))
            assert await broker.list_queues() == ["legacy"]
            job = await claim_one(broker, "legacy")
            await broker.complete([Completion(job.message.id, job.token, b"\xc0")])
            (rows,) = await broker.history(["legacy"], minutes=2)
            assert sum(r.completed for r in rows) == 1
        finally:
            await broker.close()


async def test_rollups_of_many_connections_are_summed(pg_url: str, app_name: str) -> None:
    with anyio.fail_after(TEST_DEADLINE):
        async with connected(app_name, pg_url) as broker:
            await broker.enqueue([msg(queue="q") for _ in range(40)])
            jobs = await broker.claim(["q"], 40, worker_id="w", lease=30)
            assert len(jobs) == 40

            async def finish(i: int) -> None:
                j = jobs[i]
                await broker.complete([Completion(j.message.id, j.token, b"\xc0")])

            # Completions sent at once go over the pool's connections (several backends,
            # so several of a minute's rows): the history sums them.
            async with anyio.create_task_group() as tg:
                for i in range(40):
                    tg.start_soon(finish, i)
            (rows,) = await broker.history(["q"], minutes=3)
            assert sum(r.completed for r in rows) == 40
            assert rows[-1].minute <= time.time() < rows[-1].minute + 120


def _client() -> httpx.AsyncClient:
    dash = create_app(app)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=dash), base_url="http://dash")


async def test_the_dashboard_on_postgres(pg_url: str, tmp_path: Path) -> None:
    _, url = fresh_schema(pg_url)
    with app.using_broker(url), anyio.fail_after(TEST_DEADLINE):
        async with app:
            bad = await charge.enqueue(Charge(order=7, ticket=str(tmp_path / "ticket")))
            good = [await report.enqueue(Report(n=i)) for i in range(3)]
            async with app.worker(concurrency=4, queues=["billing", "reports"]):
                with pytest.raises(JobFailed):
                    await bad.result(timeout=10)
                for job in good:
                    await job.result(timeout=10)
                async with _client() as http:
                    r = await http.get("/workers")
                    assert r.status_code == 200
                    assert "billing" in r.text
            async with _client() as http:
                r = await http.get("/")
                assert r.status_code == 200
                html = r.text
                for queue in ("billing", "reports"):
                    assert f'href="/queues/{queue}"' in html
                assert "queue billing: 0 completed and 1 failed in the last hour" in html
                assert "queue reports: 3 completed and 0 failed in the last hour" in html
                r = await http.get("/queues/billing", params={"state": "failed"})
                assert bad.id in r.text
                r = await http.get(f"/jobs/{bad.id}")
                assert "card declined for order 7" in r.text
                for path in ("/schedules", "/workers"):
                    r = await http.get(path)
                    assert r.status_code == 200, path
                    assert r.text.count("<h1>") == 1


async def test_inspect_lists_the_workers_of_a_postgres_app(pg_url: str, app_name: str) -> None:
    now = time.time()
    info = WorkerInfo(
        id="w-1",
        host="host-a",
        pid=4321,
        queues=["mail"],
        concurrency=8,
        in_flight=2,
        started_at=now,
        heartbeat_at=now,
        version="0.1.0",
    )
    with anyio.fail_after(TEST_DEADLINE):
        async with connected(app_name, pg_url) as broker:
            await broker.register_worker(info, ttl=60)
            listed = await anyio.run_process(
                [
                    sys.executable,
                    "-m",
                    "typedq",
                    "inspect",
                    "--app",
                    app_name,
                    "--broker",
                    pg_url,
                    "--workers",
                    "--json",
                ],
                check=False,
                env={**os.environ, "TYPEDQ_BROKER": ""},
            )
            assert listed.returncode == 0, listed.stderr.decode()
            (worker,) = json.loads(listed.stdout)
            assert worker["id"] == "w-1"
            assert worker["pid"] == 4321
            assert worker["queues"] == ["mail"]
            await broker.unregister_worker("w-1")
            assert await broker.list_workers() == []
            assert "mail" in await broker.list_queues()


async def test_the_reapers_pass_drops_rollups_older_than_a_day(pg_url: str, app_name: str) -> None:
    with anyio.fail_after(TEST_DEADLINE):
        async with connected(app_name, pg_url) as broker:
            await broker.enqueue([msg(queue="q")])
            job = await claim_one(broker, "q")
            await broker.complete([Completion(job.message.id, job.token, b"\xc0")])
            now_minute = int(time.time() // 60)
            conn = await asyncpg.connect(pg_url)
            try:
                # A day and a minute ago, and a day less a minute ago.
                await conn.execute(
                    "INSERT INTO typedq.rollups (ns, queue, minute, shard, completed) "
                    "VALUES ($1, 'q', $2, 0, 5), ($1, 'q', $3, 0, 7)",
                    app_name,
                    now_minute - HISTORY_MINUTES - 1,
                    now_minute - HISTORY_MINUTES + 2,
                )
                await broker.recover_stalled()
                kept = await conn.fetch(
                    "SELECT minute FROM typedq.rollups WHERE ns = $1 ORDER BY minute", app_name
                )
            finally:
                await conn.close()
            assert kept[0][0] == now_minute - HISTORY_MINUTES + 2
            assert len(kept) >= 2  # that one and the completion's minute
            (rows,) = await broker.history(["q"], minutes=HISTORY_MINUTES)
            assert sum(r.completed for r in rows) == 8
