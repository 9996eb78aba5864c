"""PgQueuer adapter (bench/.venvs/pgqueuer; bench/pg_peers.py).

Producer: ``Queries(AsyncpgPoolDriver(pool)).enqueue("noop", payload_bytes)`` (JSON bytes:
PgQueuer's payload is bytes) and, for the bulk path, the same call with lists (one
statement per batch). Worker: what the ``pgq run module:factory`` CLI runs (``pgqueuer.run``; the CLI itself
fails at start in 1.6.0, see :func:`worker`), the factory an async
context manager yielding a ``PgQueuer`` on one asyncpg connection (its docs' setup), with
``--max-concurrent-tasks C --batch-size min(10, C // 2)`` (it refuses a cap below twice the
batch); at C = 1 the entrypoint's ``concurrency_limit=1`` with ``--batch-size 1`` instead.
LISTEN/NOTIFY wake-ups; finished jobs leave its queue table for ``pgqueuer_log``. The schema:
``Queries.install()`` before the workload (untimed).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, PgQueuer, Queries
from pgqueuer.models import Job

from . import common


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """What ``pgq run bench.adapters.pg_pgqueuer:create_pgqueuer`` runs."""
    conn = await asyncpg.connect(common.PG_URL)
    pgq = PgQueuer(AsyncpgDriver(conn))
    limit = 1 if os.environ.get("BENCH_C") == "1" else 0

    @pgq.entrypoint("noop", concurrency_limit=limit)
    async def noop(job: Job) -> None:
        data = json.loads(job.payload or b"{}")
        common.hit(data["customer_id"], data["t"])

    try:
        yield pgq
    finally:
        await conn.close()


class PgqueuerAdapter:
    name = "pgqueuer"
    version = version("pgqueuer")
    bulk_api = "Queries.enqueue(list of entrypoints, list of payloads, list of priorities)"
    notes = (
        "asyncpg (pool for the producer); worker: `pgqueuer.run(create_pgqueuer, "
        "max_concurrent_tasks=C, batch_size=min(10, C//2))`, what `pgq run` calls (its CLI "
        "fails at start in 1.6.0 under typer 0.29); C = 1: concurrency_limit=1, batch 1; "
        "defaults otherwise (LISTEN/NOTIFY)."
    )

    def __init__(self) -> None:
        self.pool: asyncpg.Pool | None = None
        self.queries: Queries | None = None

    async def connect(self) -> None:
        self.pool = await asyncpg.create_pool(common.PG_URL, min_size=2, max_size=8)
        self.queries = Queries(AsyncpgPoolDriver(self.pool))
        async with self.pool.acquire() as conn:
            installed = await conn.fetchval("SELECT to_regclass('pgqueuer') IS NOT NULL")
        if not installed:
            await self.queries.install()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    def make(self, i: int, t: float) -> bytes:
        return json.dumps(common.payload_dict(i, t), separators=(",", ":")).encode()

    async def enqueue(self, payload: Any) -> None:
        assert self.queries is not None
        await self.queries.enqueue("noop", payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        assert self.queries is not None
        n = len(payloads)
        await self.queries.enqueue(["noop"] * n, payloads, [0] * n)

    async def fill_history(self, n: int) -> str:
        assert self.pool is not None
        async with self.pool.acquire() as conn:
            await conn.execute(
                """INSERT INTO pgqueuer_log (created, job_id, status, priority, entrypoint,
                    aggregated)
                SELECT now() - interval '1 hour', g, 'successful', 0, 'noop', true
                FROM generate_series(1, $1::bigint) g""",
                n,
            )
            await conn.execute("SELECT setval('pgqueuer_id_seq', $1::bigint)", n)
        return (
            f"{n:,} rows of pgqueuer_log (one insert over generate_series), status successful, "
            "aggregated (PgQueuer deletes a finished job from its queue table and keeps its log "
            "rows), the job id sequence moved past them"
        )

    def worker_argv(self, concurrency: int) -> list[str] | None:
        os.environ["BENCH_C"] = str(concurrency)
        return [sys.executable, "-m", "bench.adapters.pg_pgqueuer", "worker", str(concurrency)]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


def worker(concurrency: int) -> None:
    """``pgq run`` without its CLI: the CLI of 1.6.0 fails at start under typer 0.29
    (``setup_fancy_logger``: 'str' object has no attribute 'name', with or without
    ``--log-level``), so this calls the function it calls, ``pgqueuer.run`` (SIGTERM stops
    it), with the same options: the cap at C, the batch min(10, C // 2), or 1 at C = 1."""
    import pgqueuer

    batch = 1 if concurrency == 1 else max(1, min(10, concurrency // 2))
    cap = None if concurrency == 1 else concurrency
    asyncio.run(pgqueuer.run(create_pgqueuer, batch_size=batch, max_concurrent_tasks=cap))


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker(int(sys.argv[2]))
    else:
        common.main(PgqueuerAdapter())
