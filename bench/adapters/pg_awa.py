"""awa-pg adapter (bench/.venvs/awa; bench/pg_peers.py): awa's Rust engine through PyO3.

Producer: ``AsyncClient.insert(Noop(...), queue="bench")`` and, for the bulk path, the
``enqueue_many_copy`` its README recommends for high-volume Python producers (COPY into
queue storage). Worker: awa has no worker CLI for Python handlers; its documented worker
is a process that registers ``@client.task`` handlers and calls
``client.start([(queue, C)])``: this module run as ``worker C``, awa's defaults otherwise
(200 ms poll interval as a fallback to its wake-ups, default retention). Migrations:
``client.migrate()`` before the workload (untimed).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import awa

from . import common


@dataclass
class Noop:
    customer_id: int
    invoice_id: int
    t: float
    note: str


QUEUE = "bench"
# "canonical" (what client.migrate() leaves on a fresh database: system awa) or
# "queue_storage" (its vacuum-aware engine, installed with install_queue_storage(): system
# awa-qs). Both are run: which is faster depends on the row.
STORAGE = os.environ.get("BENCH_AWA_STORAGE", "canonical")


class AwaAdapter:
    name = "awa"
    version = version("awa-pg")
    bulk_api = "AsyncClient.insert_many_copy"
    notes = (
        "awa.AsyncClient (Rust engine, PyO3), canonical storage (what client.migrate() "
        "leaves); worker: a process calling `client.start([('bench', C)])` with a "
        "`@client.task(Noop)` handler (awa's documented worker; no CLI for Python handlers), "
        "defaults otherwise."
    )

    def __init__(self) -> None:
        self.client: awa.AsyncClient | None = None
        if STORAGE == "queue_storage":
            self.name = "awa-qs"
            self.bulk_api = "AsyncClient.enqueue_many_copy"
            self.notes = self.notes.replace(
                "canonical storage (what client.migrate() leaves)",
                "queue storage (client.install_queue_storage() after migrate)",
            )

    async def connect(self) -> None:
        self.client = awa.AsyncClient(common.PG_URL, max_connections=10)
        await self.client.migrate()
        if STORAGE == "queue_storage":
            # Its README: "fresh installs go straight to the queue-storage engine", but
            # client.migrate() leaves a fresh database on the canonical engine (jobs_hot),
            # where enqueue_many_copy refuses; this is the documented all-in-one switch.
            await self.client.install_queue_storage()

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    def make(self, i: int, t: float) -> Noop:
        return Noop(customer_id=i, invoice_id=1_000_000 + i, t=t, note=common.NOTE)

    async def enqueue(self, payload: Any) -> None:
        assert self.client is not None
        await self.client.insert(payload, queue=QUEUE)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        assert self.client is not None
        if STORAGE == "queue_storage":
            await self.client.enqueue_many_copy(payloads, queue=QUEUE)
        else:
            await self.client.insert_many_copy(payloads, queue=QUEUE)

    async def fill_history(self, n: int) -> str:
        """Through psql (awa-pg brings no SQL driver of its own to Python)."""
        args = (
            "jsonb_build_object('customer_id', g, 'invoice_id', 1000000 + g, 't', 0.0, "
            f"'note', '{common.NOTE}')"
        )
        if STORAGE == "canonical":
            sql = f"""INSERT INTO awa.jobs_hot (kind, queue, args, state, priority, attempt,
                    run_at, attempted_at, finalized_at, created_at)
                SELECT 'noop', '{QUEUE}', {args}, 'completed', 2, 1, now() - interval '2 hours',
                    now() - interval '1 hour', now() - interval '1 hour', now() - interval '2 hours'
                FROM generate_series(1, {n}) g"""  # noqa: S608  # our own constants
            where = "awa.jobs_hot, state completed (finalized an hour ago)"
        else:
            # The current slot and generation of its ring: finished entries of a live queue.
            sql = f"""INSERT INTO awa.done_entries (ready_slot, ready_generation, job_id, kind,
                    queue, args, state, priority, attempt, run_lease, max_attempts, lane_seq,
                    run_at, attempted_at, finalized_at, created_at)
                SELECT r.current_slot, r.generation, -g, 'noop', '{QUEUE}', {args},
                    'completed', 2, 1, 1, 25, -g, now() - interval '2 hours',
                    now() - interval '1 hour', now() - interval '1 hour',
                    now() - interval '2 hours'
                FROM generate_series(1, {n}) g, awa.queue_ring_state r"""  # noqa: S608
            where = (
                "awa.done_entries in the queue ring's current slot (negative job ids and lane "
                "seqs, apart from real ones), state completed; its ring rotation may truncate "
                "them, which is its retention"
            )
        done = await asyncio.create_subprocess_exec(
            "psql", common.PG_URL, "-qXv", "ON_ERROR_STOP=1", "-c", sql
        )
        if await done.wait() != 0:
            raise RuntimeError("the awa fixture failed")
        return f"INSERT ... SELECT generate_series: {n:,} rows of {where}"

    def worker_argv(self, concurrency: int) -> list[str] | None:
        return [sys.executable, "-m", "bench.adapters.pg_awa", "worker", str(concurrency)]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


async def worker(concurrency: int) -> None:
    client = awa.AsyncClient(common.PG_URL, max_connections=max(10, concurrency + 4))

    @client.task(Noop, queue=QUEUE)
    async def noop(job: Any) -> None:
        common.hit(job.args.customer_id, job.args.t)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await client.start([(QUEUE, concurrency)])
    await stop.wait()
    await client.shutdown()
    await client.close()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker(int(sys.argv[2])))
    else:
        common.main(AwaAdapter())
