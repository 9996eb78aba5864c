"""What unique windows and debounce on the PostgreSQL broker (migration 8: a column of
the jobs table, a delete trigger on keyed jobs, a table of markers) cost jobs with no
key, and what a keyed enqueue costs: 300 single plain enqueues, then W brokers (each its
own pool) draining 3,000 jobs in batches of 16 with retention trimming the completed
ones (``completed_max=500``: deletes fire the trigger's condition), on a schema at
the version before it and on one at the newest version; then, on the newest, 300 single unique
enqueues (fresh keys) and 300 debounce enqueues of one key (each replaces the job).
Runs interleaved, median of R, on a throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_control_cost.py [W] [R]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

from tests.pg_harness import PgCluster
from tests.support import msg
from typedq import Retention
from typedq.broker.base import BrokerSettings, Completion, EnqueueControl
from typedq.broker.postgres import PostgresBroker, connection, schema

N = 3000
SINGLES = 300
BATCH = 16


def settings(ns: str) -> BrokerSettings:
    return BrokerSettings(namespace=ns, retention=Retention(completed_max=500))


async def run(url: str, ns: str, workers: int) -> tuple[float, float]:
    """(single enqueues per second, jobs per second of ``workers`` brokers draining N)."""
    brokers = [PostgresBroker(url, settings(ns)) for _ in range(workers)]
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
    newest = schema.MIGRATIONS
    rates: dict[str, list[tuple[float, float]]] = {
        f"version {len(newest) - 1}": [],
        f"version {len(newest)}": [],
    }
    controlled: list[tuple[float, float]] = []
    try:
        for r in range(rounds):
            pairs = list(zip(rates, (newest[:-1], newest), strict=True))
            # Each version goes first every other round (a later run finds a warmer cache).
            for name, migrations in pairs if r % 2 == 0 else pairs[::-1]:
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                rates[name].append(await run(url, f"r{r}", workers))
            controlled.append(await keyed(f"{pg.url}?schema=bench_v{len(newest)}", f"k{r}"))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    for name, got in rates.items():
        singles = statistics.median(g[0] for g in got)
        drained = statistics.median(g[1] for g in got)
        print(
            f"{name}: single plain enqueues median {singles:,.0f}/s; drain median "
            f"{drained:,.0f} jobs/s ({workers} workers)"
        )
    print(
        f"keyed, version {len(newest)}: single unique enqueues median "
        f"{statistics.median(c[0] for c in controlled):,.0f}/s; debounce replacements "
        f"median {statistics.median(c[1] for c in controlled):,.0f}/s"
    )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [4, 5][len(args) :])))
