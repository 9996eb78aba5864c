"""What the PostgreSQL benches that measure a migration's cost share: a schema made with
some of the migrations only (a bench's shortcut), and the run they time on it: single
enqueues, then brokers draining a queue in batches (tests/pg_harness.py's throwaway
cluster)."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence

from tests.support import msg
from typedq.broker.base import BrokerSettings, Completion
from typedq.broker.postgres import PostgresBroker, connection, schema

__all__ = ["NEWEST", "drain_run", "print_drains", "use_migrations"]

#: The broker's migrations, all of them.
NEWEST = schema.MIGRATIONS


def use_migrations(migrations: Sequence[str]) -> None:
    """Make the schemas the broker creates from now on with ``migrations`` only (a
    prefix of :data:`NEWEST`; ``use_migrations(NEWEST)`` puts them all back)."""
    schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = tuple(migrations)


async def drain_run(
    url: str, settings: BrokerSettings, workers: int, *, jobs: int, singles: int, batch: int
) -> tuple[float, float]:
    """(single enqueues per second, jobs per second of ``workers`` brokers draining
    ``jobs``): ``singles`` jobs enqueued one at a time, the rest in one call, then each
    broker (its own pool) claims ``batch`` and completes them while claiming the next."""
    brokers = [PostgresBroker(url, settings) for _ in range(workers)]
    for broker in brokers:
        await broker.connect()
    started = time.perf_counter()
    for _ in range(singles):
        await brokers[0].enqueue([msg(queue="q")])
    single_rate = singles / (time.perf_counter() - started)
    await brokers[0].enqueue([msg(queue="q") for _ in range(jobs - singles)])
    started = time.perf_counter()

    async def loop(broker: PostgresBroker) -> None:
        claimed = await broker.claim(["q"], batch, worker_id="w", lease=30)
        while claimed:
            done = [Completion(j.message.id, j.token, b"\xc0") for j in claimed]
            _, claimed = await broker.complete_and_claim(
                done, ["q"], batch, worker_id="w", lease=30
            )

    await asyncio.gather(*(loop(broker) for broker in brokers))
    drained = jobs / (time.perf_counter() - started)
    for broker in brokers:
        await broker.close()
    return single_rate, drained


def print_drains(
    rates: dict[str, list[tuple[float, float]]], workers: int, singles: str = "single enqueues"
) -> None:
    """One line per schema of :func:`drain_run`'s runs on it: the medians."""
    for name, got in rates.items():
        single = statistics.median(g[0] for g in got)
        drained = statistics.median(g[1] for g in got)
        print(
            f"{name}: {singles} median {single:,.0f}/s; drain median "
            f"{drained:,.0f} jobs/s ({workers} workers)"
        )
