"""typedq's PostgreSQL claim at 0 vs 1,000,000 finished jobs (issue 30: "the claim does not
slow down as history grows"), measured at the claim itself rather than through a drain.

    .venv/bin/python -m bench.pg_claim_history [--history 1000000 --claims 1000]

On a fresh database of the local PostgreSQL service (``tqbench_claimhist``): the schema's
own ``claim`` (batch of 1) and ``complete`` functions on one asyncpg connection, as the
worker calls them, with ``--waiting`` jobs waiting. For each history size, in turn:
``--claims`` claim + complete pairs timed one by one (wall clock: the shared box's load is
in it), and the shared buffers one claim touches (``EXPLAIN (ANALYZE, BUFFERS)`` of the
claim's statement: pages read or hit, inside the function too), which does not depend on
the load. Then ``--history`` completed jobs are written with one INSERT ... SELECT
generate_series (as bench/adapters/typedq.py's fixture does), ``VACUUM ANALYZE``, and the
same again. A claim that walks finished jobs would show it in its buffers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import time
from typing import Any

import asyncpg
import msgspec

from bench.run import RESULTS
from typedq.broker.base import BrokerSettings, JobMessage, Retention
from typedq.broker.postgres import PostgresBroker

PG = "postgresql://postgres@127.0.0.1:5432"
DB = "tqbench_claimhist"
NS = "bench"
CHANNEL = "typedq_typedq"
CLAIM = 'SELECT token, message FROM "typedq".claim($1, $2, $3, $4, $5, $6)'
COMPLETE = 'SELECT "typedq".complete($1, $2, $3, $4, $5, $6, $7)'
decode = msgspec.msgpack.Decoder(JobMessage).decode


def _psql(db: str, sql: str) -> None:
    subprocess.run(["psql", f"{PG}/{db}", "-qXc", sql], check=True, capture_output=True)


async def enqueue(url: str, n: int, start: int) -> None:
    broker = PostgresBroker(url, BrokerSettings(namespace=NS, retention=Retention()))
    await broker.connect()
    for i in range(start, start + n, 500):
        await broker.enqueue(
            [
                JobMessage(id=f"w{k}", task="noop", queue="q", payload=b"x" * 100)
                for k in range(i, min(start + n, i + 500))
            ]
        )
    await broker.close()


async def measure(url: str, claims: int, explains: int) -> dict[str, Any]:
    conn = await asyncpg.connect(url)
    times: list[float] = []
    try:
        for k in range(claims):
            t0 = time.perf_counter()
            rows = await conn.fetch(CLAIM, NS, ["q"], 1, "w", 30.0, f"{time.time_ns():016x}{k}")
            times.append(time.perf_counter() - t0)
            if not rows:
                raise RuntimeError("no job waiting: raise --waiting")
            job = decode(rows[0][1])
            await conn.fetchval(
                COMPLETE, NS, [job.id], [rows[0][0]], [b"r"], 86400.0, 10**9, CHANNEL
            )
        buffers: list[int] = []
        reads: list[int] = []
        for k in range(explains):
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) SELECT token, message FROM "
                '"typedq".claim($1, $2, $3, $4, $5, $6)',
                NS, ["q"], 1, "w", 30.0, f"x{time.time_ns():016x}{k}",
            )  # fmt: skip
            text = "\n".join(r[0] for r in plan)
            hit = sum(int(x) for x in re.findall(r"hit=(\d+)", text.split("\n", 2)[1]))
            read = sum(int(x) for x in re.findall(r"read=(\d+)", text.split("\n", 2)[1]))
            buffers.append(hit + read)
            reads.append(read)
    finally:
        await conn.close()
    times.sort()
    return {
        "claims": claims,
        "claim_p50_ms": 1000 * statistics.median(times),
        "claim_p99_ms": 1000 * times[int(0.99 * (len(times) - 1))],
        "buffers_per_claim": statistics.median(buffers),
        "buffers_all": buffers,
        "reads_all": reads,  # of those, pages not in shared buffers (OS cache or disk)
    }


async def fill(url: str, n: int) -> float:
    conn = await asyncpg.connect(url)
    started = time.perf_counter()
    try:
        await conn.execute(
            """
            INSERT INTO typedq.jobs (ns, id, queue, message, state, seq, attempt,
                enqueued_at, started_at, finished_at, token, done_token, worker_id)
            SELECT $1, 'h' || g, 'q', '\\x00'::bytea, 3, nextval('typedq.job_seq'), 1,
                e - 2 + g * 1e-6, e - 1 + g * 1e-6, e - 1 + g * 1e-6, 't', 't', 'w'
            FROM generate_series(1, $2::bigint) g,
                (SELECT extract(epoch FROM now())::float8 - 3600 AS e) x
            """,
            NS,
            n,
        )
        await conn.execute(
            """INSERT INTO typedq.finished AS f (ns, state, n) VALUES ($1, 3, $2)
            ON CONFLICT (ns, state) DO UPDATE SET n = f.n + $2""",
            NS,
            n,
        )
    finally:
        await conn.close()
    _psql(DB, "VACUUM ANALYZE")
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=5000)
    parser.add_argument("--explains", type=int, default=20)
    opts = parser.parse_args()
    _psql("postgres", f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    _psql("postgres", f"CREATE DATABASE {DB}")
    url = f"{PG}/{DB}"
    out: dict[str, Any] = {"waiting": opts.waiting, "sizes": {}}
    await enqueue(url, opts.waiting, 0)
    _psql(DB, "VACUUM ANALYZE")
    out["sizes"]["0"] = await measure(url, opts.claims, opts.explains)
    out["fill_s"] = await fill(url, opts.history)
    await enqueue(url, opts.claims + opts.explains, opts.waiting)  # the same backlog again
    out["sizes"][str(opts.history)] = await measure(url, opts.claims, opts.explains)
    for size, got in out["sizes"].items():
        print(
            f"{int(size):>9,} finished: claim p50 {got['claim_p50_ms']:.2f} ms, "
            f"p99 {got['claim_p99_ms']:.2f} ms, {got['buffers_per_claim']:.0f} buffers a claim"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pg-claim-history.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    asyncio.run(main())
