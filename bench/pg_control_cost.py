"""What unique windows and debounce on the PostgreSQL broker (migration 8: a column of
the jobs table, a delete trigger on keyed jobs, a table of markers) cost jobs with no
key, and what a keyed enqueue costs: 300 single plain enqueues, then W brokers (each its
own pool) draining 3,000 jobs in batches of 16 with retention trimming the completed
ones (``completed_max=500``: deletes fire the trigger's condition), on a schema at
the version before it (7) and on one at the newest version; then, on the newest, 300
single unique enqueues (fresh keys) and 300 debounce enqueues of one key (each replaces
the job).
Runs interleaved, median of R, on a throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_control_cost.py [W] [R]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from bench.pg_support import NEWEST, drain_run, print_drains, use_migrations
from tests.pg_harness import PgCluster
from tests.support import msg
from typedq import Retention
from typedq.broker.base import BrokerSettings, EnqueueControl
from typedq.broker.postgres import PostgresBroker

N = 3000
SINGLES = 300
BATCH = 16

#: The migrations before the one that adds unique windows and debounce (found by its
#: table, so the bench follows later migrations and a renumbering).
BEFORE = next(i for i, sql in enumerate(NEWEST) if "{s}.ctl_markers (" in sql)


def settings(ns: str) -> BrokerSettings:
    return BrokerSettings(namespace=ns, retention=Retention(completed_max=500))


async def keyed(url: str, ns: str) -> tuple[float, float]:
    """(unique enqueues per second, debounce replacements per second), one at a time."""
    broker = PostgresBroker(url, settings(ns))
    await broker.connect()
    unique = EnqueueControl(key="k", unique_for=3600.0)
    started = time.perf_counter()
    for i in range(SINGLES):
        control = EnqueueControl(key=f"k{i}", unique_for=unique.unique_for)
        await broker.enqueue_controlled([(msg(queue="u"), control)])
    uniques = SINGLES / (time.perf_counter() - started)
    debounce = EnqueueControl(key="d", wait=600.0, max_wait=3600.0)
    await broker.enqueue_controlled([(msg(queue="d"), debounce)])
    started = time.perf_counter()
    for _ in range(SINGLES):
        await broker.enqueue_controlled([(msg(queue="d"), debounce)])
    debounces = SINGLES / (time.perf_counter() - started)
    await broker.close()
    return uniques, debounces


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    rates: dict[str, list[tuple[float, float]]] = {
        f"version {BEFORE}": [],
        f"version {len(NEWEST)}": [],
    }
    controlled: list[tuple[float, float]] = []
    try:
        for r in range(rounds):
            pairs = list(zip(rates, (NEWEST[:BEFORE], NEWEST), strict=True))
            # Each version goes first every other round (a later run finds a warmer cache).
            for name, migrations in pairs if r % 2 == 0 else pairs[::-1]:
                use_migrations(migrations)
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                rates[name].append(
                    await drain_run(
                        url, settings(f"r{r}"), workers, jobs=N, singles=SINGLES, batch=BATCH
                    )
                )
            controlled.append(await keyed(f"{pg.url}?schema=bench_v{len(NEWEST)}", f"k{r}"))
    finally:
        use_migrations(NEWEST)
        pg.stop()
    print_drains(rates, workers, "single plain enqueues")
    print(
        f"keyed, version {len(NEWEST)}: single unique enqueues median "
        f"{statistics.median(c[0] for c in controlled):,.0f}/s; debounce replacements "
        f"median {statistics.median(c[1] for c in controlled):,.0f}/s"
    )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [4, 5][len(args) :])))
