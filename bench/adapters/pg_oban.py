"""Oban for Python adapter (bench/.venvs/oban, Python 3.12: oban requires it; bench/pg_peers.py).

Producer: ``await Noop.enqueue(args)`` through an ``Oban`` in client mode (no queues) on a
psycopg ``AsyncConnectionPool``; the bulk path ``oban.enqueue_many(jobs)`` (one INSERT per
batch). Worker: the ``oban start`` CLI, ``--queues bench:C``, its defaults otherwise (insert
triggers notify the nodes; finished jobs kept, pruned after a day). The schema: the library's
``install_schema`` (what ``oban install`` runs) before the workload (untimed).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from oban import Oban, worker
from oban.schema import install as install_schema
from psycopg_pool import AsyncConnectionPool

from . import common

QUEUE = "bench"


@worker(queue=QUEUE)
class Noop:
    async def process(self, job: Any) -> None:
        common.hit(job.args["customer_id"], job.args["t"])


class ObanAdapter:
    name = "oban"
    version = version("oban")
    bulk_api = "Oban.enqueue_many"
    notes = (
        "psycopg 3 pool, Oban in client mode for the producer; worker: `oban start --queues "
        "bench:C` (one process), defaults otherwise (finished jobs kept a day)."
    )

    def __init__(self) -> None:
        self.pool: AsyncConnectionPool | None = None
        self.oban: Oban | None = None

    async def connect(self) -> None:
        self.pool = AsyncConnectionPool(common.PG_URL, min_size=2, max_size=8, open=False)
        await self.pool.open()
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT to_regclass('oban_jobs') IS NOT NULL")
            row = await cur.fetchone()
        if not (row and row[0]):
            await install_schema(self.pool)
        self.oban = Oban(pool=self.pool)
        await self.oban.__aenter__()

    async def close(self) -> None:
        if self.oban is not None:
            await self.oban.__aexit__(None, None, None)
        if self.pool is not None:
            await self.pool.close()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await Noop.enqueue(payload)  # type: ignore[attr-defined]

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        assert self.oban is not None
        await self.oban.enqueue_many([Noop.new(p) for p in payloads])  # type: ignore[attr-defined]

    async def fill_history(self, n: int) -> str:
        assert self.pool is not None
        async with self.pool.connection() as conn:
            await conn.execute(
                """INSERT INTO oban_jobs (state, queue, worker, attempt, args, attempted_by,
                    inserted_at, scheduled_at, attempted_at, completed_at)
                SELECT 'completed', %s, %s, 1, jsonb_build_object('customer_id', g,
                    'invoice_id', 1000000 + g, 't', 0.0, 'note', %s::text), ARRAY['w'],
                    u - interval '2 hours', u - interval '2 hours', u - interval '1 hour',
                    u - interval '1 hour'
                FROM generate_series(1, %s::bigint) g, (SELECT timezone('UTC', now()) u) x""",
                (QUEUE, "bench.adapters.pg_oban.Noop", common.NOTE, n),
            )
        return (
            f"INSERT ... SELECT generate_series: {n:,} rows of oban_jobs, state completed an "
            "hour ago (its pruner keeps them a day)"
        )

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "oban")
        return [cli, "start", "--dsn", common.PG_URL, "--queues", f"{QUEUE}:{concurrency}",
                "--log-level", "WARNING"]  # fmt: skip

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    # Oban names a worker by its class's module: the jobs must name
    # bench.adapters.pg_oban.Noop, which the worker process imports, not __main__.Noop.
    from bench.adapters import pg_oban

    common.main(pg_oban.ObanAdapter())
