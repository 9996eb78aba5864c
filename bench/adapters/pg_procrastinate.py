"""Procrastinate adapter (bench/.venvs/procrastinate; bench/pg_peers.py).

Producer: ``await noop.defer_async(**payload)`` (one INSERT per job, through its
``PsycopgConnector`` pool) and ``noop.batch_defer_async(*payloads)`` (one call per batch).
Worker: the ``procrastinate worker`` CLI with ``--concurrency C``, its defaults otherwise
(LISTEN/NOTIFY wake-ups, a 5 s poll as a fallback; finished jobs kept: ``delete_jobs``
``never``). The schema is applied with ``schema_manager.apply_schema_async()`` before the
workload (untimed).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

import procrastinate
import psycopg

from . import common

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=common.PG_URL or "postgresql:///x")
)


@app.task(name="noop", queue="bench")
async def noop(customer_id: int, invoice_id: int, t: float, note: str) -> None:
    common.hit(customer_id, t)


class ProcrastinateAdapter:
    name = "procrastinate"
    version = version("procrastinate")
    bulk_api = "Task.batch_defer_async"
    notes = (
        "psycopg 3 pool; worker: `procrastinate --app ... worker --concurrency C` (LISTEN/NOTIFY, "
        "defaults otherwise: finished jobs kept)."
    )

    async def connect(self) -> None:
        await app.open_async()
        with_schema = await self._has_schema()
        if not with_schema:
            await app.schema_manager.apply_schema_async()

    async def _has_schema(self) -> bool:
        async with await psycopg.AsyncConnection.connect(common.PG_URL) as conn:
            cur = await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
            row = await cur.fetchone()
            return bool(row and row[0])

    async def close(self) -> None:
        await app.close_async()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await noop.defer_async(**payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await noop.batch_defer_async(*payloads)

    async def fill_history(self, n: int) -> str:
        async with await psycopg.AsyncConnection.connect(common.PG_URL) as conn:
            await conn.execute(
                """INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts)
                SELECT 'bench', 'noop', jsonb_build_object('customer_id', g, 'invoice_id',
                    1000000 + g, 't', 0.0, 'note', %s::text), 'succeeded', 1
                FROM generate_series(1, %s::bigint) g""",
                (common.NOTE, n),
            )
        return (
            f"INSERT ... SELECT generate_series: {n:,} rows of procrastinate_jobs, status "
            "succeeded (no procrastinate_events rows: its insert trigger writes them for "
            "'todo' only)"
        )

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "procrastinate")
        return [cli, "--app", "bench.adapters.pg_procrastinate.app", "worker",
                "--concurrency", str(concurrency), "--queues", "bench"]  # fmt: skip

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(ProcrastinateAdapter())
