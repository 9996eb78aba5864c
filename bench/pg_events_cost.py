"""What the PostgreSQL broker's event streams (migration 5) cost the claim/complete loop:
W brokers (each its own pool) drain 3,000 jobs in batches of 16, on a schema at the
version before the event streams' migration (no event trigger: "before"), on one at
the newest version with the queue's stream off (the trigger probes ``event_queues`` for
each job ending, finds nothing) and on one with it on (an event per job), runs
interleaved, median of ROUNDS, on a throwaway cluster (tests/pg_harness.py):

    PYTHONPATH=. .venv/bin/python -m bench.pg_events_cost [W] [ROUNDS]

``--functions``: where the database's time goes, by function (``track_functions``):
3,200 jobs completed by 200 calls of ``complete``, the queue's stream off then on, the
time per job ending of ``complete`` itself and of the event trigger (``job_final``).

``--micro [ROUNDS]``: the database's own time for the completions alone, without the
clients' and the drain's noise on a loaded machine: 3,200 claimed jobs completed by
200 calls of ``complete`` with 16 each (a transaction each), the CPU time the
connection's backend spent on them (/proc, the cluster is local), a schema each,
interleaved (the order reversed every round), median of ROUNDS.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys

from bench.pg_rollups import drain
from tests.pg_harness import PgCluster
from tests.support import msg
from typedq.broker.base import BrokerSettings, Completion
from typedq.broker.postgres import PostgresBroker, connection, schema

#: The migrations before the one that adds the event streams (found by its table, so the
#: bench follows a renumbering).
BEFORE = next(i for i, sql in enumerate(schema.MIGRATIONS) if "{s}.event_queues (" in sql)


async def enable(url: str, ns: str) -> None:
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    await broker.enable_events("q")
    await broker.close()


MICRO_JOBS = 3200


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` used so far (Linux /proc): the
    backend's work, whatever else the loaded machine runs meanwhile."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def micro_once(url: str, ns: str) -> float:
    """CPU seconds of the backend completing MICRO_JOBS claimed jobs in batches of 16."""
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    broker._registered.add("q")
    try:
        await broker.enqueue([msg(queue="q") for _ in range(MICRO_JOBS)])
        jobs = await broker.claim(["q"], MICRO_JOBS, worker_id="w", lease=300)
        ids = [j.message.id for j in jobs]
        tokens = [j.token for j in jobs]
        sql = broker._sql["complete"]
        retention = broker.settings.retention
        async with broker._pool.acquire() as conn:
            pid = await conn.fetchval("SELECT pg_backend_pid()")
            started = cpu_seconds(pid)
            # A transaction per call, as a worker's completions (one transaction
            # updating the same counter rows hundreds of times costs what no worker
            # pays: each update walks the row's versions of that transaction).
            for at in range(0, MICRO_JOBS, 16):
                await conn.fetchval(
                    sql,
                    ns,
                    ids[at : at + 16],
                    tokens[at : at + 16],
                    [b"\xc0"] * 16,
                    retention.completed_ttl,
                    1_000_000,
                    broker.channel,
                )
            return cpu_seconds(pid) - started
    finally:
        await broker.close()


async def micro(rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    took: dict[str, list[float]] = {"before": [], "events off": [], "events on": []}
    try:
        for r in range(rounds):
            # A schema each (tables of the same size), the order reversed every round.
            names = list(took) if r % 2 == 0 else list(reversed(took))
            for name in names:
                migrations = newest[:BEFORE] if name == "before" else newest
                schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = migrations
                url = f"{pg.url}?schema=micro_{name.replace(' ', '_')}"
                ns = f"m{r}"
                if name == "events on":
                    await enable(url, ns)
                took[name].append(await micro_once(url, ns))
    finally:
        schema.MIGRATIONS = vars(connection)["MIGRATIONS"] = newest
        pg.stop()
    base = statistics.median(took["before"])
    for name, got in took.items():
        med = statistics.median(got)
        print(
            f"{name:>10}: median {med / MICRO_JOBS * 1e6:.1f} us CPU per job completed "
            f"({med / base:.1%} of before)"
        )


async def functions() -> None:
    pg = PgCluster()
    pg.start()
    try:
        for stream in ("off", "on"):
            ns = f"f{stream}"
            broker = PostgresBroker(pg.url, BrokerSettings(namespace=ns))
            await broker.connect()
            if stream == "on":
                await broker.enable_events("q")
            await broker.enqueue([msg(queue="q") for _ in range(MICRO_JOBS)])
            jobs = await broker.claim(["q"], MICRO_JOBS, worker_id="w", lease=300)
            async with broker._pool.acquire() as conn:
                await conn.execute("SET track_functions = 'all'")
                await conn.execute("SELECT pg_stat_reset()")
                for at in range(0, MICRO_JOBS, 16):
                    batch = jobs[at : at + 16]
                    done = [Completion(j.message.id, j.token, b"\xc0") for j in batch]
                    args = broker._completion_args(done)
                    await conn.fetchval(broker._sql["complete"], *args)
                await asyncio.sleep(1.2)  # the backend's statistics are flushed at most
                await conn.execute("SELECT 1")  # once a second, at a transaction's end
                rows = await conn.fetch(
                    "SELECT funcname, calls, self_time FROM pg_stat_user_functions "
                    "WHERE funcname IN ('complete', 'job_final')"
                )
            times = {r["funcname"]: (r["calls"], r["self_time"]) for r in rows}
            calls, complete_ms = times["complete"]
            ended = calls * 16
            trigger_ms = times.get("job_final", (0, 0.0))[1]
            print(
                f"stream {stream}: complete {complete_ms / ended * 1000:.1f} us per job, "
                f"job_final {trigger_ms / ended * 1000:.1f} us per job "
                f"({trigger_ms / complete_ms:.1%} of complete's own time; "
                f"{calls} calls counted)"
            )
            await broker.close()
    finally:
        pg.stop()


async def main(workers: int, rounds: int) -> None:
    pg = PgCluster()
    pg.start()
    newest = schema.MIGRATIONS
    rates: dict[str, list[float]] = {"before": [], "events off": [], "events on": []}
    try:
        for r in range(rounds):
            for name in rates:
                migrations = newest[:BEFORE] if name == "before" else newest
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
    base = statistics.median(rates["before"])
    for name, got in rates.items():
        med = statistics.median(got)
        print(
            f"{name:>10}: median {med:,.0f} jobs/s ({med / base:.1%} of before)  "
            f"runs {', '.join(f'{x:,.0f}' for x in got)}"
        )


if __name__ == "__main__" and sys.argv[1:2] == ["--functions"]:
    asyncio.run(functions())
elif __name__ == "__main__" and sys.argv[1:2] == ["--micro"]:
    asyncio.run(micro(int(sys.argv[2]) if len(sys.argv) > 2 else 15))
elif __name__ == "__main__":
    asyncio.run(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 4,
            int(sys.argv[2]) if len(sys.argv) > 2 else 9,
        )
    )
