"""What task limits (migration 4) cost the PostgreSQL broker's enqueue and claim/complete
loop: a schema at version 3 driven by its functions (no limit columns, no gates) against
one at version 4 driven by the new ones, with no limits and with a limit that never
binds (ConcurrencyLimit(100_000), every claimed job admitted one by one under its
bucket's lock). W connections drain N jobs in claims of 16; enqueue in batches of 100.
Runs interleaved, median of R, on a throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_limits.py [W] [R]

Wall-clock rates on a shared machine: read the ratios between the lines of one run.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from typing import Any

from tests.pg_harness import PgCluster
from tests.support import msg
from typedq.broker.base import BrokerSettings
from typedq.broker.postgres import PostgresBroker, connection, schema
from typedq.broker.postgres.limits import limit_args
from typedq.limits import LimitSpec

N = 3000
BATCH = 16
ENQUEUE_BATCH = 100


async def run(url: str, ns: str, version: int, limited: bool, workers: int) -> tuple[float, float]:
    """(enqueued jobs/s, drained jobs/s) on a schema at ``version``."""
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    s = f'"{broker.target.schema}"'
    old = version < 4
    enqueue_sql = (
        f"SELECT {s}.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9)" if old else broker._sql["enqueue"]
    )
    old_claim = f"SELECT * FROM {s}.claim($1, $2, $3, $4, $5, $6)"  # noqa: S608 (a bench's own schema)
    claim_sql = old_claim if old else broker._sql["claim"]
    extra: tuple[Any, ...] = ()
    if not old:
        extra = limit_args({"t": LimitSpec(concurrency=100_000)} if limited else {})
    pool = broker._pool
    started = time.perf_counter()
    for _ in range(0, N, ENQUEUE_BATCH):
        args = broker._enqueue_args([msg(queue="q") for _i in range(ENQUEUE_BATCH)])
        await pool.fetchval(enqueue_sql, *(args[:9] if old else args))
    enqueued = N / (time.perf_counter() - started)
    r = broker.settings.retention

    async def loop(n: int) -> None:
        claim_id = 0
        while True:
            claim_id += 1
            rows = await pool.fetch(
                claim_sql, ns, ["q"], BATCH, f"w{n}", 30.0, f"c{n}x{claim_id}", *extra
            )
            if not rows:
                return
            await pool.fetchval(
                broker._sql["complete"],
                ns,
                [ids[row["message"]] for row in rows],
                [row["token"] for row in rows],
                [b"\xc0"] * len(rows),
                r.completed_ttl,
                r.completed_max,
                broker.channel,
            )

    ids: dict[bytes, str] = {}
    for row in await pool.fetch(f"SELECT id, message FROM {s}.jobs WHERE ns = $1", ns):  # noqa: S608 (a bench's own schema)
        ids[row["message"]] = row["id"]
    started = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(workers)))
    drained = N / (time.perf_counter() - started)
    await broker.close()
    return enqueued, drained


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    cases = {"version 3": (3, False), "version 4": (4, False), "version 4, limited": (4, True)}
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    try:
        for r in range(rounds):
            for name, (version, limited) in cases.items():
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest[:version]
                url = f"{pg.url}?schema=bench_v{version}"
                rates[name].append(await run(url, f"r{r}{int(limited)}", version, limited, workers))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    for name, got in rates.items():
        enq = statistics.median(e for e, _ in got)
        drain = statistics.median(d for _, d in got)
        print(
            f"{name}: enqueue {enq:,.0f} jobs/s, claim+complete {drain:,.0f} jobs/s ({workers} workers)"
        )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 4,
            int(sys.argv[2]) if len(sys.argv) > 2 else 5,
        )
    )
