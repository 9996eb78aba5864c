"""What a fair claim (typedq.fair, migration 10) costs on the PostgreSQL broker against
a plain (FIFO) claim, with many active keys; and what migration 10 costs a plain claim
(the same plain claim on a schema at version 9).

Per batch size, three queues of ``keys x per_key`` jobs are filled (then vacuumed and
analyzed): plain jobs on a version-9 schema, plain jobs on the newest schema, fair jobs
(one key per tenant, weight 1) on the newest schema. Then ``rounds`` times, each queue
in turn (the order rotating) takes a chunk of ``calls`` claims of ``batch`` jobs, one
after another (the jobs stay active): by default one claim, so the three alternate
call by call and a loaded machine's drift hits them alike. Printed: the medians over
the chunks of ms per claim call (wall clock, one connection, round trip included) and
their ratios; and the database's own time per call of each schema's ``claim``
(``track_functions``, nested functions included), the mean over the run (a mean: one
stall of a loaded machine weighs in it; the medians are the figure). A throwaway
cluster (tests/pg_harness.py: ``fsync`` and ``synchronous_commit`` off, so a claim's
commit does not wait for the disk):

    PYTHONPATH=. .venv/bin/python -m bench.pg_fair_cost [--keys 10000] [--per-key 3]
        [--batch 1,16] [--calls 1] [--rounds 400]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg
import msgspec

from tests.pg_harness import PgCluster
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.postgres import PostgresBroker, connection, schema

VARIANTS = ("plain v9", "plain", "fair")
#: Each variant's schema (the database's time is read per schema's ``claim`` function).
SCHEMAS = {"plain v9": "bench_v9", "plain": "bench_v10", "fair": "bench_v10f"}


def messages(keys: int, per_key: int, fair: bool) -> list[JobMessage]:
    payload = msgspec.msgpack.encode({"n": 1})
    out = []
    for r in range(per_key):
        for k in range(keys):
            m = JobMessage(id=f"j{k}-{r}", task="t", queue="q", payload=payload)
            if fair:
                m = msgspec.structs.replace(m, fair_key=f"tenant{k}", fair_weight=1)
            out.append(m)
    return out


async def fill(url: str, db: str, ns: str, jobs: list[JobMessage]) -> PostgresBroker:
    """A connected broker of namespace ``ns`` whose queue holds ``jobs`` (tables emptied
    of the namespace first, analyzed after)."""
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    s = f'"{broker.target.schema}"'
    conn = await asyncpg.connect(db)
    try:
        lanes = await conn.fetchval(f"SELECT to_regclass('{s}.fair_lanes') IS NOT NULL")
        for table in ("jobs", "claims", *(["fair_lanes"] if lanes else [])):
            await conn.execute(f"DELETE FROM {s}.{table} WHERE ns = $1", ns)  # noqa: S608
        for i in range(0, len(jobs), 1000):
            await broker.enqueue(jobs[i : i + 1000])
        await conn.execute(f"VACUUM ANALYZE {s}.jobs")
        if lanes:
            await conn.execute(f"VACUUM ANALYZE {s}.fair_lanes")
    finally:
        await conn.close()
    await broker.claim(["q"], 1, worker_id="w", lease=3600)  # warm up
    return broker


async def function_times(db: str) -> dict[str, tuple[int, float]]:
    """Per schema of SCHEMAS: (calls, total ms) of its ``claim`` function so far."""
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch(
            "SELECT schemaname, calls, total_time FROM pg_stat_user_functions "
            "WHERE funcname = 'claim' AND schemaname = ANY ($1)",
            list(SCHEMAS.values()),
        )
    finally:
        await conn.close()
    found = {r["schemaname"]: (r["calls"], r["total_time"]) for r in rows}
    return {schema: found.get(schema, (0, 0.0)) for schema in SCHEMAS.values()}


async def chunk(broker: PostgresBroker, batch: int, calls: int) -> float:
    """ms per claim call over ``calls`` claims of ``batch``."""
    started = time.perf_counter()
    for _ in range(calls):
        got = await broker.claim(["q"], batch, worker_id="w", lease=3600)
        assert len(got) == batch
    return (time.perf_counter() - started) * 1000 / calls


async def main(args: argparse.Namespace) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    batches = [int(b) for b in args.batch.split(",")]
    plain = messages(args.keys, args.per_key, fair=False)
    fair = messages(args.keys, args.per_key, fair=True)
    try:
        conn = await asyncpg.connect(pg.url)
        db = await conn.fetchval("SELECT current_database()")
        await conn.execute(f"ALTER DATABASE \"{db}\" SET track_functions = 'pl'")
        await conn.close()
        for batch in batches:
            brokers: dict[str, PostgresBroker] = {}
            for name in VARIANTS:
                migrations = newest[:9] if name == "plain v9" else newest
                # The schema is made with these migrations only (a bench's shortcut).
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema={SCHEMAS[name]}"
                ns = name.replace(" ", "_")
                brokers[name] = await fill(url, pg.url, ns, fair if name == "fair" else plain)
            schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            before = await function_times(pg.url)
            for r in range(args.rounds):
                # Interleaved: each variant a chunk in turn, the order rotating.
                for name in VARIANTS[r % 3 :] + VARIANTS[: r % 3]:
                    times[name].append(await chunk(brokers[name], batch, args.calls))
            for broker in brokers.values():
                await broker.close()
            await asyncio.sleep(2)  # the backends' function statistics are flushed
            after = await function_times(pg.url)
            db_ms = {
                v: (after[SCHEMAS[v]][1] - before[SCHEMAS[v]][1])
                / max(1, after[SCHEMAS[v]][0] - before[SCHEMAS[v]][0])
                for v in VARIANTS
            }
            med = {v: statistics.median(times[v]) for v in VARIANTS}
            print(
                f"batch {batch}: ms per claim (median of {args.rounds} interleaved chunks of "
                f"{args.calls}): plain v9 {med['plain v9']:.3f}, plain {med['plain']:.3f}, "
                f"fair {med['fair']:.3f}; fair/plain {med['fair'] / med['plain']:.2f}x, "
                f"plain/plain v9 {med['plain'] / med['plain v9']:.2f}x",
                flush=True,
            )
            print(
                f"batch {batch}: the database's time in claim (pg_stat_user_functions, mean "
                f"per call): plain v9 {db_ms['plain v9']:.3f} ms, plain {db_ms['plain']:.3f}, "
                f"fair {db_ms['fair']:.3f}; fair/plain {db_ms['fair'] / db_ms['plain']:.2f}x, "
                f"plain/plain v9 {db_ms['plain'] / db_ms['plain v9']:.2f}x",
                flush=True,
            )
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--per-key", type=int, default=3)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=400)
    asyncio.run(main(parser.parse_args()))
