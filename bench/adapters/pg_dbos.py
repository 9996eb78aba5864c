"""DBOS queues adapter (bench/.venvs/dbos; bench/pg_peers.py).

Producer: ``DBOSClient.enqueue_async({"queue_name": "bench", "workflow_name": "noop"},
payload)``, DBOS's way to enqueue from outside the application (one workflow row per job);
DBOS has no bulk enqueue, so the bulk path gathers 100 of them (labelled so). Worker: a
process that registers the ``noop`` workflow, launches DBOS and registers the queue with
``worker_concurrency=C``: DBOS has no worker CLI; its queues are polled, 1 s by default, 50 ms
here as in bench/durable.py (the fastest setting that stays quiet on this box). The schema:
DBOS migrates its system database at launch (the client never does), so ``connect`` launches
and destroys DBOS once before the workload (untimed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from importlib.metadata import version
from typing import Any

from dbos import DBOS, DBOSClient, DBOSConfig

from . import common

QUEUE = "bench"
POLL = float(os.environ.get("BENCH_DBOS_POLL", "0.05"))
CONFIG: DBOSConfig = {
    "name": "pgbench",
    "system_database_url": common.PG_URL or "postgresql:///x",
    "log_level": "WARNING",
}


class DbosAdapter:
    name = "dbos"
    version = version("dbos")
    bulk_api = "gather of DBOSClient.enqueue_async (no bulk API)"
    notes = (
        f"DBOSClient for the producer; worker: a process with DBOS launched and the queue "
        f"registered with worker_concurrency=C, polling_interval_sec={POLL} (default 1 s); "
        "defaults otherwise."
    )

    def __init__(self) -> None:
        self.client: DBOSClient | None = None

    async def connect(self) -> None:
        DBOS(config=CONFIG)
        DBOS.launch()  # migrates the system database
        DBOS.destroy()
        self.client = DBOSClient(system_database_url=common.PG_URL, application_name="pgbench")

    async def close(self) -> None:
        if self.client is not None:
            self.client.destroy()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        assert self.client is not None
        await self.client.enqueue_async({"queue_name": QUEUE, "workflow_name": "noop"}, payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.gather(*(self.enqueue(p) for p in payloads))

    async def fill_history(self, n: int) -> str:
        import psycopg  # comes with dbos

        async with await psycopg.AsyncConnection.connect(common.PG_URL) as conn:
            await conn.execute(
                """INSERT INTO dbos.workflow_status (workflow_uuid, status, name, executor_id,
                    created_at, updated_at, recovery_attempts, queue_name, priority,
                    serialization, application_name, started_at_epoch_ms, completed_at)
                SELECT 'h-' || g, 'SUCCESS', 'noop', 'w', ms - 7200000, ms - 3600000, 1,
                    %s, 0, 'py_pickle', 'pgbench', ms - 3600000, ms - 3600000
                FROM generate_series(1, %s::bigint) g,
                    (SELECT (extract(epoch FROM now()) * 1000)::bigint AS ms) x""",
                (QUEUE, n),
            )
        return (
            f"INSERT ... SELECT generate_series: {n:,} rows of dbos.workflow_status, status "
            "SUCCESS, queue bench, finished an hour ago (no inputs/outputs stored)"
        )

    def worker_argv(self, concurrency: int) -> list[str] | None:
        return [sys.executable, "-m", "bench.adapters.pg_dbos", "worker", str(concurrency)]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


async def worker(concurrency: int) -> None:
    DBOS(config=CONFIG)

    @DBOS.workflow(name="noop")
    async def noop(payload: dict[str, Any]) -> None:
        common.hit(payload["customer_id"], payload["t"])

    DBOS.launch()
    await DBOS.register_queue_async(
        QUEUE, worker_concurrency=concurrency, polling_interval_sec=POLL
    )
    logging.getLogger("dbos").setLevel(logging.WARNING)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    DBOS.destroy()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker(int(sys.argv[2])))
    else:
        common.main(DbosAdapter())
