"""asyncpg vs psycopg 3 on the PostgreSQL broker's claim/complete loop (issue 30: "pick
the driver by measurement").

One connection drains 3,000 jobs through the schema's own functions (``claim`` then
``complete``), batches of 1 and 16, on a throwaway cluster (tests/pg_harness.py); psycopg
also in pipeline mode (the previous batch's ``complete`` and the next ``claim`` in one
round trip). Runs interleaved, median of 3. psycopg is not a dependency of typedq:

    python -m venv /tmp/pgdrv && /tmp/pgdrv/bin/pip install 'psycopg[binary]>=3.2'
    PYTHONPATH=.:/tmp/pgdrv/lib/python3.11/site-packages .venv/bin/python bench/pg_drivers.py
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import asyncpg
import msgspec

from tests.pg_harness import PgCluster
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.postgres import PostgresBroker

N = 3000
CHANNEL = "typedq_typedq"
decode = msgspec.msgpack.Decoder(JobMessage).decode


async def fill(url: str, ns: str) -> None:
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    for i in range(0, N, 500):
        await broker.enqueue(
            [
                JobMessage(id=f"{ns}-{k}", task="t", queue="q", payload=b"x" * 100)
                for k in range(i, i + 500)
            ]
        )
    await broker.close()


async def run_asyncpg(url: str, ns: str, batch: int) -> float:
    conn = await asyncpg.connect(url)
    claim = 'SELECT token, message FROM "typedq".claim($1, $2, $3, $4, $5, $6)'
    complete = 'SELECT "typedq".complete($1, $2, $3, $4, $5, $6, $7)'
    done, k, start = 0, 0, time.perf_counter()
    while True:
        rows = await conn.fetch(claim, ns, ["q"], batch, "w", 30.0, f"{k:016x}")
        k += 1
        if not rows:
            break
        ids = [decode(r[1]).id for r in rows]
        tokens = [r[0] for r in rows]
        await conn.fetchval(complete, ns, ids, tokens, [b"r"] * len(ids), 3600.0, 10**9, CHANNEL)
        done += len(rows)
    elapsed = time.perf_counter() - start
    await conn.close()
    return done / elapsed


async def run_psycopg(url: str, ns: str, batch: int, pipeline: bool) -> float:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True, prepare_threshold=0)
    claim = 'SELECT token, message FROM "typedq".claim(%s, %s, %s, %s, %s, %s)'
    complete = 'SELECT "typedq".complete(%s, %s, %s, %s, %s, %s, %s)'
    done, k, start = 0, 0, time.perf_counter()
    pending: list[tuple[str, str]] = []

    def finish_args(items: list[tuple[str, str]]) -> tuple[Any, ...]:
        return (
            ns,
            [i for _, i in items],
            [t for t, _ in items],
            [b"r"] * len(items),
            3600.0,
            10**9,
            CHANNEL,
        )

    async with conn.cursor() as cur, conn.cursor() as cur2:
        while True:
            args = (ns, ["q"], batch, "w", 30.0, f"{k:016x}")
            if pipeline and pending:
                async with conn.pipeline():
                    await cur2.execute(complete, finish_args(pending))
                    await cur.execute(claim, args)
                    fetched = await cur.fetchall()
            else:
                if pending:
                    await cur2.execute(complete, finish_args(pending))
                await cur.execute(claim, args)
                fetched = await cur.fetchall()
            done += len(pending)
            k += 1
            pending = [(r[0], decode(r[1]).id) for r in fetched]
            if not pending:
                break
    elapsed = time.perf_counter() - start
    await conn.close()
    return done / elapsed


async def main() -> None:
    cluster = PgCluster()
    cluster.start()
    try:
        url = cluster.url
        await fill(url, "warm")
        results: dict[tuple[int, str], list[float]] = {}
        n = 0
        for _ in range(3):
            for batch in (1, 16):
                for name in ("asyncpg", "psycopg", "psycopg-pipeline"):
                    n += 1
                    ns = f"n{n}"
                    await fill(url, ns)
                    if name == "asyncpg":
                        rate = await run_asyncpg(url, ns, batch)
                    else:
                        rate = await run_psycopg(url, ns, batch, name.endswith("pipeline"))
                    results.setdefault((batch, name), []).append(rate)
        for (batch, name), rates in sorted(results.items()):
            print(
                f"batch={batch:2d} {name:17s} median {statistics.median(rates):7.0f} jobs/s"
                f"  runs {[round(r) for r in rates]}"
            )
    finally:
        cluster.stop()


if __name__ == "__main__":
    asyncio.run(main())
