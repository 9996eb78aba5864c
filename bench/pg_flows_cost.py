"""What workflows on the PostgreSQL broker (migration 6: the flows' triggers, columns and
index on the jobs table) cost jobs with no flow: 300 single enqueues, then W brokers
(each its own pool) draining 3,000 jobs in batches of 16, on a schema at version 5 (no
flows) and on one at the newest version, runs interleaved, median of 9 (``R``), on a
throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_flows_cost.py [W] [R]
"""

from __future__ import annotations

import asyncio
import sys

from bench.pg_support import NEWEST, drain_run, print_drains, use_migrations
from tests.pg_harness import PgCluster
from typedq.broker.base import BrokerSettings

N = 3000
SINGLES = 300
BATCH = 16
ROUNDS = 9


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    rates: dict[str, list[tuple[float, float]]] = {"version 5": [], f"version {len(NEWEST)}": []}
    try:
        for r in range(rounds):
            for name, migrations in zip(rates, (NEWEST[:5], NEWEST), strict=True):
                use_migrations(migrations)
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                settings = BrokerSettings(namespace=f"r{r}")
                rates[name].append(
                    await drain_run(url, settings, workers, jobs=N, singles=SINGLES, batch=BATCH)
                )
    finally:
        use_migrations(NEWEST)
        pg.stop()
    print_drains(rates, workers)


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [4, ROUNDS][len(args) :])))
