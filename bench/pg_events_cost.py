"""What the PostgreSQL broker's event streams (migration 5) cost the claim/complete loop:
W brokers (each its own pool) drain 3,000 jobs in batches of 16, on a schema at version 4
(no event trigger), on one at the newest version with the queue's stream off (the trigger
probes ``event_queues`` for each job ending, finds nothing) and on one with it on (an
event per job), runs interleaved, median of ROUNDS, on a throwaway cluster
(tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python -m bench.pg_events_cost [W] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import statistics
import sys

from bench.pg_rollups import drain
from tests.pg_harness import PgCluster
from typedq.broker.base import BrokerSettings
from typedq.broker.postgres import PostgresBroker, connection, schema


async def enable(url: str, ns: str) -> None:
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    await broker.enable_events("q")
    await broker.close()


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    rates: dict[str, list[float]] = {"version 4": [], "events off": [], "events on": []}
    try:
        for r in range(rounds):
            for name in rates:
                migrations = newest[:4] if name == "version 4" else newest
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                ns = f"r{r}"
                if name == "events on":
                    ns += "e"
                    await enable(url, ns)
                rates[name].append(await drain(url, ns, workers))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    base = statistics.median(rates["version 4"])
    for name, got in rates.items():
        med = statistics.median(got)
        print(
            f"{name:>10}: median {med:,.0f} jobs/s ({med / base:.1%} of version 4)  "
            f"runs {', '.join(f'{x:,.0f}' for x in got)}"
        )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 4,
            int(sys.argv[2]) if len(sys.argv) > 2 else 9,
        )
    )
