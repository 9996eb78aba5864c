"""What the claim of limited tasks costs the PostgreSQL broker's claim/complete loop,
before migration 11 (migration 4's claim: a limited job admitted one at a time) and after
it (a round of jobs decided in memory, the admitted ones taken in one update), on schemas
made with the migrations up to each. W connections drain N jobs of task ``t`` in claims
of 16 (each claim's jobs completed in one call), with:

- ``none``: no limits declared;
- ``conc free``: ``ConcurrencyLimit(100_000)``, never binding (every job counted);
- ``rate free``: 1,000,000 starts a minute, never binding (every start written to the
  window);
- ``conc keyed``: 2 at once per key, 16 keys (32 slots for W x 16 wanted: claims park
  and unpark jobs).

Besides the wall-clock drain rate, the database's own time in ``claim`` per job claimed
(``pg_stat_user_functions``, ``track_functions = 'pl'``: the function with all it calls),
steadier than wall-clock rates on a shared machine. Runs interleaved, median of R, on a
throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python bench/pg_limits.py [W] [R]

Wall-clock rates on a shared machine: read the ratios between the lines of one run.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time

import asyncpg
import msgspec

from tests.pg_harness import PgCluster
from tests.support import msg
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.postgres import PostgresBroker, connection, migration_11, schema
from typedq.broker.postgres.limits import limit_args
from typedq.limits import LimitSpec

N = 3000
BATCH = 16
ENQUEUE_BATCH = 100
KEYS = 16

LIMITS: dict[str, dict[str, LimitSpec]] = {
    "none": {},
    "conc free": {"t": LimitSpec(concurrency=100_000)},
    "rate free": {"t": LimitSpec(rate=1_000_000, per_us=60_000_000)},
    "conc keyed": {"t": LimitSpec(concurrency=2)},
}


def job(i: int) -> JobMessage:
    return msgspec.structs.replace(msg(queue="q", task="t"), concurrency_key=f"k{i % KEYS}")


FUNCTION_TIME = (
    "SELECT total_time FROM pg_stat_user_functions WHERE schemaname = $1 AND funcname = 'claim'"
)

#: The claim function's total ms by schema, as last read.
_seen: dict[str, float] = {}


async def claim_time(dsn: str, schema_name: str) -> float:
    """The database's ms in ``claim`` since the last look at this schema."""
    await asyncio.sleep(0.5)  # the pool's backends report their counts as they exit
    conn = await asyncpg.connect(dsn)
    try:
        total: float = await conn.fetchval(FUNCTION_TIME, schema_name) or 0.0
    finally:
        await conn.close()
    spent = total - _seen.get(schema_name, 0.0)
    _seen[schema_name] = total
    return spent


async def run(
    url: str, ns: str, limits: dict[str, LimitSpec], workers: int
) -> tuple[float, float, float]:
    """(drained jobs/s, jobs per claim that took any, database us in claim per job)."""
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    s = f'"{broker.target.schema}"'
    extra = limit_args(limits)
    pool = broker._pool
    for start in range(0, N, ENQUEUE_BATCH):
        args = broker._enqueue_args([job(start + i) for i in range(ENQUEUE_BATCH)])
        await pool.fetchval(broker._sql["enqueue"], *args)
    r = broker.settings.retention
    ids: dict[bytes, str] = {}
    for row in await pool.fetch(f"SELECT id, message FROM {s}.jobs WHERE ns = $1", ns):  # noqa: S608 (a bench's own schema)
        ids[row["message"]] = row["id"]
    sizes: list[int] = []
    done = 0

    async def loop(n: int) -> None:
        nonlocal done
        claim_id = 0
        while done < N:
            claim_id += 1
            rows = await pool.fetch(
                broker._sql["claim"], ns, ["q"], BATCH, f"w{n}", 30.0, f"c{n}x{claim_id}", *extra
            )
            if not rows:
                await asyncio.sleep(0.001)  # the others hold every free slot
                continue
            sizes.append(len(rows))
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
            done += len(rows)

    started = time.perf_counter()
    await asyncio.gather(*(loop(n) for n in range(workers)))
    drained = N / (time.perf_counter() - started)
    dsn, schema_name = broker.target.dsn, broker.target.schema
    await broker.close()
    spent = await claim_time(dsn, schema_name)
    return drained, statistics.mean(sizes), 1000 * spent / N


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    conn = await asyncpg.connect(pg.url)
    await conn.execute("ALTER DATABASE postgres SET track_functions = 'pl'")
    await conn.close()
    newest = schema.MIGRATIONS
    after = newest.index(migration_11.SQL) + 1
    versions = {"before": after - 1, "after": after}
    rates: dict[tuple[str, str], list[tuple[float, float, float]]] = {
        (case, side): [] for case in LIMITS for side in versions
    }
    try:
        for r in range(rounds):
            for case, limits in LIMITS.items():
                for side, version in versions.items():
                    # The schema is made with these migrations only (a bench's shortcut).
                    schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest[:version]
                    url = f"{pg.url}?schema=bench_v{version}"
                    ns = f"r{r}{case.replace(' ', '')}"
                    rates[case, side].append(await run(url, ns, limits, workers))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    print(f"claim+complete, {workers} workers, claims of {BATCH}, {N} jobs, median of {rounds}")
    for case in LIMITS:
        line = []
        for side in versions:
            got = rates[case, side]
            drain = statistics.median(d for d, _, _ in got)
            size = statistics.median(z for _, z, _ in got)
            spent = statistics.median(u for _, _, u in got)
            line.append(
                f"{side} {drain:,.0f} jobs/s, {spent:.0f} us/job in claim ({size:.1f} a claim)"
            )
        pairs = list(zip(rates[case, "after"], rates[case, "before"], strict=True))
        rate = statistics.median(a[0] / b[0] for a, b in pairs)
        spent = statistics.median(a[2] / b[2] for a, b in pairs)
        print(
            f"{case:>10}: " + "; ".join(line) + f"; after/before: rate x{rate:.2f},"
            f" claim time x{spent:.2f}"
        )


if __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 4,
            int(sys.argv[2]) if len(sys.argv) > 2 else 5,
        )
    )
