"""What workflows on the PostgreSQL broker (migration 6: the flows' triggers, columns and
index on the jobs table) cost jobs with no flow: 300 single enqueues, then W brokers
(each its own pool) draining 3,000 jobs in batches of 16, on a schema at version 5 (no
flows) and on one at the newest version, runs interleaved, median of 9, on a throwaway
cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_flows_cost.py [W]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from tests.pg_harness import PgCluster
from tests.support import msg
from typedq.broker.base import BrokerSettings, Completion
from typedq.broker.postgres import PostgresBroker, connection, schema

N = 3000
SINGLES = 300
BATCH = 16
ROUNDS = 9


async def run(url: str, ns: str, workers: int) -> tuple[float, float]:
    """(single enqueues per second, jobs per second of ``workers`` brokers draining N)."""
    brokers = [PostgresBroker(url, BrokerSettings(namespace=ns)) for _ in range(workers)]
    for broker in brokers:
        await broker.connect()
    started = time.perf_counter()
    for _ in range(SINGLES):
        await brokers[0].enqueue([msg(queue="q")])
    singles = SINGLES / (time.perf_counter() - started)
    await brokers[0].enqueue([msg(queue="q") for _ in range(N - SINGLES)])
    started = time.perf_counter()

    async def loop(broker: PostgresBroker) -> None:
        jobs = await broker.claim(["q"], BATCH, worker_id="w", lease=30)
        while jobs:
            done = [Completion(j.message.id, j.token, b"\xc0") for j in jobs]
            _, jobs = await broker.complete_and_claim(done, ["q"], BATCH, worker_id="w", lease=30)

    await asyncio.gather(*(loop(broker) for broker in brokers))
    drained = N / (time.perf_counter() - started)
    for broker in brokers:
        await broker.close()
    return singles, drained


async def main(workers: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    rates: dict[str, list[tuple[float, float]]] = {"version 5": [], f"version {len(newest)}": []}
    try:
        for r in range(ROUNDS):
            for name, migrations in zip(rates, (newest[:5], newest), strict=True):
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                rates[name].append(await run(url, f"r{r}", workers))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    for name, got in rates.items():
        singles = statistics.median(g[0] for g in got)
        drained = statistics.median(g[1] for g in got)
        print(
            f"{name}: single enqueues median {singles:,.0f}/s; drain median "
            f"{drained:,.0f} jobs/s ({workers} workers)"
        )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
