"""Table bloat of the PostgreSQL broker under a compressed day of steady load: does the
size of its tables plateau while retention deletes finished jobs, and does the claim's
latency drift?

A producer enqueues ``--rate`` jobs a second (a batch every 100 ms), ``--workers``
loops claim them in claims of 16 and complete each claim's jobs in one call, and each
worker loop also runs the reaper's pass every 5 s (``recover_stalled``: retention's age
bound, at most 1,000 jobs a state a pass), as a worker process does. Retention is short
(``--ttl`` seconds, ``--max`` completed jobs), so the jobs table churns: every job is
inserted, updated twice (claim, complete) and deleted. Every ``--sample`` seconds the
bench reads ``pg_stat_user_tables`` of the broker's schema (live and dead tuples, HOT
updates, autovacuum runs) and ``pg_total_relation_size`` (table, indexes and TOAST) of
each table, and the claim latencies of the interval (p50, p99).

``--compare`` runs two schemas side by side in one cluster, at the same rate each: one
made with the migrations before migration 11 and one with all of them (for a migration
that changes storage parameters: migration 11 changes none, its claim of unlimited jobs
is the one before, so the two are a control of the run's noise). The cluster is a
throwaway one (tests/pg_harness.py: fsync off, shared_buffers 64MB, autovacuum at its
defaults: naptime 60 s, 3 workers).

    PYTHONPATH=. .venv/bin/python bench/pg_bloat.py --minutes 7 --rate 250

A day's job count compressed: 250 jobs/s for 8 minutes is 120,000 jobs, a day at
1.4 jobs/s; autovacuum's naptime is not compressed, so the run is the harder case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.pg_harness import PgCluster
from tests.support import msg
from typedq.broker.base import BrokerSettings, Completion
from typedq.broker.postgres import PostgresBroker, connection, migration_11, schema
from typedq.broker.settings import Retention

BATCH = 16
REAPER_EVERY = 5.0

STATS = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count,
       pg_total_relation_size(relid) AS total
FROM pg_stat_user_tables WHERE schemaname = $1 ORDER BY relname
"""


@dataclass
class Side:
    """One schema under load and what was measured of it."""

    label: str
    broker: PostgresBroker
    done: int = 0
    enqueued: int = 0
    latencies: list[float] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)


async def connect(url: str, version: int | None, settings: BrokerSettings) -> PostgresBroker:
    newest = schema.MIGRATIONS
    if version is not None:
        # The schema is made with these migrations only (a bench's shortcut).
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest[:version]
    try:
        broker = PostgresBroker(url, settings)
        await broker.connect()
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
    return broker


async def produce(side: Side, rate: int, until: float) -> None:
    per_tick = max(1, rate // 10)
    tick = time.monotonic()
    while tick < until:
        await side.broker.enqueue([msg(queue="q", payload=b"\xc0" * 64) for _ in range(per_tick)])
        side.enqueued += per_tick
        tick += 0.1
        await asyncio.sleep(max(0.0, tick - time.monotonic()))


async def work(side: Side, n: int, until: float) -> None:
    broker = side.broker
    reap = time.monotonic() + REAPER_EVERY * (n + 1) / 4
    while time.monotonic() < until:
        started = time.perf_counter()
        claimed = await broker.claim(["q"], BATCH, worker_id=f"w{n}", lease=60)
        side.latencies.append(time.perf_counter() - started)
        if claimed:
            await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in claimed])
            side.done += len(claimed)
        else:
            await broker.wait_for_jobs(["q"], 0.2)
        if time.monotonic() >= reap:
            await broker.recover_stalled()
            reap += REAPER_EVERY


def _ms(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


async def sample(side: Side, t: float) -> None:
    rows = await side.broker._fetch("stats", STATS, side.broker.target.schema)
    tables = {r["relname"]: dict(r) for r in rows}
    lat, side.latencies = side.latencies, []
    jobs = tables.get("jobs", {})
    side.samples.append(
        {
            "t": round(t),
            "done": side.done,
            "backlog": side.enqueued - side.done,
            "jobs_mb": jobs.get("total", 0) / 2**20,
            "live": jobs.get("n_live_tup", 0),
            "dead": jobs.get("n_dead_tup", 0),
            "hot": jobs.get("n_tup_hot_upd", 0) / max(1, jobs.get("n_tup_upd", 0)),
            "autovac": jobs.get("autovacuum_count", 0),
            "schema_mb": sum(r["total"] for r in tables.values()) / 2**20,
            "claim_p50": _ms(lat, 0.5),
            "claim_p99": _ms(lat, 0.99),
            "tables": {
                name: {k: v for k, v in r.items() if k != "relname"} for name, r in tables.items()
            },
        }
    )


def report(side: Side) -> None:
    print(f"\n== {side.label}")
    print(
        "   t(s)     done  backlog  jobs MB     live     dead   HOT%  autovac  schema MB"
        "  claim p50 ms  p99 ms"
    )
    for s in side.samples:
        print(
            f"{s['t']:7d} {s['done']:8d} {s['backlog']:8d} {s['jobs_mb']:8.1f} {s['live']:8d} {s['dead']:8d}"
            f" {100 * s['hot']:6.1f} {s['autovac']:8d} {s['schema_mb']:10.1f}"
            f" {s['claim_p50']:13.2f} {s['claim_p99']:7.2f}"
        )
    k = len(side.samples)
    if k < 4:
        return
    half = [s["schema_mb"] for s in side.samples[k // 2 :]]
    first = [s["schema_mb"] for s in side.samples[: k // 2]]
    growth = max(half) / max(first)
    early = statistics.median(s["claim_p50"] for s in side.samples[1 : k // 4 + 1])
    late = statistics.median(s["claim_p50"] for s in side.samples[-(k // 4) :])
    print(
        f"schema size: max {max(first):.1f} MB in the first half, {max(half):.1f} MB in the"
        f" second (x{growth:.2f}: {'plateau' if growth < 1.15 else 'still growing'});"
        f" claim p50 {early:.2f} ms in the first quarter, {late:.2f} ms in the last"
    )
    last = side.samples[-1]["tables"]
    big = sorted(last.items(), key=lambda kv: -kv[1]["total"])[:6]
    print(
        "largest tables at the end: "
        + ", ".join(
            f"{name} {r['total'] / 2**20:.1f} MB ({r['n_live_tup']} live, {r['n_dead_tup']} dead,"
            f" {r['autovacuum_count']} autovacuums)"
            for name, r in big
        )
    )


async def main(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    pg = PgCluster()
    pg.start()
    settings = BrokerSettings(
        namespace="bloat", retention=Retention(completed_ttl=args.ttl, completed_max=args.max)
    )
    newest = len(schema.MIGRATIONS)
    before = schema.MIGRATIONS.index(migration_11.SQL)
    plan: list[tuple[str, str, int | None]] = [("all migrations", f"{pg.url}?schema=after", None)]
    if args.compare:
        plan.insert(0, ("before migration 11", f"{pg.url}?schema=before", before))
    sides = [Side(label, await connect(url, v, settings)) for label, url, v in plan]
    started = time.monotonic()
    until = started + args.minutes * 60
    try:
        async with asyncio.TaskGroup() as tg:
            for side in sides:
                tg.create_task(produce(side, args.rate, until))
                for n in range(args.workers):
                    tg.create_task(work(side, n, until))

            async def sampler() -> None:
                while True:
                    now = time.monotonic()
                    for side in sides:
                        await sample(side, now - started)
                    if now >= until:
                        return
                    await asyncio.sleep(min(args.sample, until - now + 0.5))

            tg.create_task(sampler())
    finally:
        for side in sides:
            await side.broker.close()
        pg.stop()
    print(
        f"{args.minutes} min at {args.rate} jobs/s a schema ({args.workers} workers, claims of"
        f" {BATCH}), retention {args.ttl:g} s / {args.max} completed; schema versions:"
        f" {', '.join(f'{s.label}' for s in sides)} (newest {newest})"
    )
    for side in sides:
        report(side)
    return {s.label: s.samples for s in sides}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--rate", type=int, default=250, help="jobs enqueued a second")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=20.0, help="completed_ttl, seconds")
    parser.add_argument("--max", type=int, default=10_000, help="completed_max")
    parser.add_argument("--sample", type=float, default=20.0, help="seconds between samples")
    parser.add_argument("--compare", action="store_true", help="also a schema before migration 11")
    parser.add_argument("--json", help="write the samples to this file")
    options = parser.parse_args()
    samples = asyncio.run(main(options))
    if options.json:
        Path(options.json).write_text(json.dumps(samples, indent=1))
