"""What the PostgreSQL broker's throughput rollups (migration 2) cost the claim/complete
loop: W brokers (each its own pool) drain 3,000 jobs in batches of 16, on a schema at
version 1 (no rollups) and on one at the newest version, runs interleaved, median of 9,
on a throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_rollups.py [W]
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
BATCH = 16
ROUNDS = 9


async def drain(url: str, ns: str, workers: int) -> float:
    """Jobs per second of ``workers`` brokers draining N jobs."""
    brokers = [PostgresBroker(url, BrokerSettings(namespace=ns)) for _ in range(workers)]
    for broker in brokers:
        await broker.connect()
        broker._registered.add("q")  # a version-1 schema has no queue registry
    await brokers[0].enqueue([msg(queue="q") for _ in range(N)])
    started = time.perf_counter()

    async def loop(broker: PostgresBroker) -> None:
        while jobs := await broker.claim(["q"], BATCH, worker_id="w", lease=30):
            await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])

    await asyncio.gather(*(loop(broker) for broker in brokers))
    rate = N / (time.perf_counter() - started)
    for broker in brokers:
        await broker.close()
    return rate


async def main(workers: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    rates: dict[str, list[float]] = {"version 1": [], f"version {len(newest)}": []}
    try:
        for r in range(ROUNDS):
            for name, migrations in zip(rates, (newest[:1], newest), strict=True):
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                rates[name].append(await drain(url, f"r{r}", workers))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    for name, got in rates.items():
        print(f"{name}: median {statistics.median(got):,.0f} jobs/s ({workers} workers)")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
