"""``page_jobs`` on the PostgreSQL broker: the cost of one page of a state's listing by
keyset cursor, and of a whole walk, at ``--jobs`` jobs in each of the states named by
``--states`` (waiting, three priorities; scheduled, run times an hour ahead spread over
100 seconds, so a batch's jobs tie on a run time by twenties; completed, claimed and
completed in batches), each state its own queue, on a throwaway cluster
(tests/pg_harness.py). Two statements, walks interleaved, median of ``--rounds``:

- ``keyset``: the broker's statement (read from the state's index at the cursor);
- ``sorted``: the statement it replaced (the whole state sorted per page, then cut at
  the cursor), run through the same broker call.

Each is measured twice: on the table as filled with autovacuum off (never analyzed: the
planner has no statistics), then after ``VACUUM ANALYZE`` (as autovacuum keeps it).
Then the plan of one page from the middle of each walk (EXPLAIN ANALYZE).

``--drain W``: instead, what migration 12's indexes cost the write path (one more index
entry per claim): 300 single enqueues, then W brokers draining 3,000 jobs in batches of
16, on a schema at the version before migration 12 and on one at the newest version,
runs interleaved, median of ``--rounds`` (bench/pg_support.py).

Run: ``PYTHONPATH=. .venv/bin/python -m bench.pg_page_jobs [--jobs 100000 --page 500]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
import asyncpg

from bench.pg_support import NEWEST, drain_run, print_drains, use_migrations
from tests.pg_harness import PgCluster
from typedq import JobState, Retention
from typedq.broker.base import BrokerSettings, Completion, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.rows import CODE
from typedq.broker.postgres.statements import BOUND_BY_INTEGER, page_args
from typedq.names import new_job_ids

#: The queue of each state's jobs.
QUEUES = {JobState.WAITING: "w", JobState.SCHEDULED: "s", JobState.COMPLETED: "c"}

#: The statement ``page_jobs`` ran before its keyset form: each state's place computed
#: for every job of the state, compared with the cursor and sorted, per page.
_OLD_PLACES = {
    JobState.WAITING: ("-priority", "seq"),
    JobState.SCHEDULED: ("run_at", "seq"),
    JobState.COMPLETED: ("-seq", "0"),
}


def sorted_statement(state: JobState) -> str:
    """The old statement of ``state`` (its parameters renumbered as the keyset one's: the
    state written in it; $7, where the state has it, unused: the broker's call passes it)."""
    a, b = _OLD_PLACES[state]
    unused = " AND $7::bigint IS NOT NULL" if state in BOUND_BY_INTEGER else ""
    # (S608: the bench's own constants, no input.)
    return (
        f'SELECT id, ({a})::float8 AS a, ({b})::bigint AS b FROM "typedq".jobs '  # noqa: S608
        f"WHERE ns = $1 AND queue = $2 AND state = {CODE[state]}{unused} "
        f"AND (({a})::float8, ({b})::bigint, id) > ($3, $4, $5) "
        f"ORDER BY ({a})::float8, ({b})::bigint, id LIMIT $6 + 1"
    )


async def fill(broker: PostgresBroker, state: JobState, jobs: int) -> None:
    queue = QUEUES[state]
    ids = new_job_ids(jobs)
    for start in range(0, jobs, 2000):
        await broker.enqueue(
            [
                JobMessage(
                    id=ids[i],
                    task="t",
                    queue=queue,
                    payload=b"\x90",
                    priority=i % 3 if state is JobState.WAITING else 0,
                    delay=3600.0 + i % 100 if state is JobState.SCHEDULED else 0.0,
                )
                for i in range(start, min(jobs, start + 2000))
            ]
        )
    if state is JobState.COMPLETED:
        while claimed := await broker.claim([queue], 1000, worker_id="b", lease=600):
            await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in claimed])


async def walk(broker: PostgresBroker, state: JobState, page: int) -> tuple[float, int, int]:
    """(seconds, pages, jobs) of one walk of ``state``."""
    started = time.perf_counter()
    cursor: str | None = None
    pages = jobs = 0
    while True:
        pages += 1
        listed = await broker.page_jobs(QUEUES[state], state, cursor=cursor, limit=page)
        jobs += len(listed.ids)
        cursor = listed.cursor
        if cursor is None:
            return time.perf_counter() - started, pages, jobs


async def walks(
    broker: PostgresBroker, states: list[JobState], args: argparse.Namespace, label: str
) -> None:
    keyset = dict(broker._page_sql)
    times: dict[tuple[JobState, str], list[float]] = {}
    pages = 0
    for r in range(args.rounds):
        for state in states:
            order = ("keyset", "sorted") if r % 2 == 0 else ("sorted", "keyset")
            for name in order:
                broker._page_sql[state] = (
                    keyset[state] if name == "keyset" else sorted_statement(state)
                )
                seconds, pages, jobs = await walk(broker, state, args.page)
                assert jobs == args.jobs, (state, name, jobs)
                times.setdefault((state, name), []).append(seconds)
    broker._page_sql.update(keyset)
    for (state, name), runs in times.items():
        med = statistics.median(runs)
        print(
            f"{label:13s} {state.value:9s} {name:6s} walk median {med:6.2f} s, {pages} pages "
            f"of {args.page}: {med / pages * 1000:6.2f} ms/page  runs {[round(x, 2) for x in runs]}"
        )


async def plans(
    broker: PostgresBroker,
    conn: asyncpg.Connection,
    states: list[JobState],
    args: argparse.Namespace,
) -> None:
    """The plan of the page from the middle of each state's walk."""
    for state in states:
        cursor: str | None = None
        for _ in range(args.jobs // args.page // 2):
            cursor = (
                await broker.page_jobs(QUEUES[state], state, cursor=cursor, limit=args.page)
            ).cursor
        params = page_args(state, cursor, args.page)
        plan = await conn.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF) " + broker._page_sql[state],
            "bench",
            QUEUES[state],
            *params,
        )
        print(f"plan of a middle page, {state.value}:")
        for row in plan:
            print("   ", row[0])


async def drain_cost(workers: int, rounds: int) -> None:
    before = next(i for i, sql in enumerate(NEWEST) if "jobs_active_order" in sql)
    pg = PgCluster()
    pg.start()
    rates: dict[str, list[tuple[float, float]]] = {
        f"version {before}": [],
        f"version {len(NEWEST)}": [],
    }
    try:
        for r in range(rounds):
            pairs = list(zip(rates, (NEWEST[:before], NEWEST), strict=True))
            for name, migrations in pairs if r % 2 == 0 else pairs[::-1]:
                use_migrations(migrations)
                url = f"{pg.url}?schema=bench_v{len(migrations)}"
                settings = BrokerSettings(namespace=f"r{r}")
                rates[name].append(
                    await drain_run(url, settings, workers, jobs=3000, singles=300, batch=16)
                )
    finally:
        use_migrations(NEWEST)
        pg.stop()
    print_drains(rates, workers)


async def main(args: argparse.Namespace) -> None:
    if args.drain:
        await drain_cost(args.drain, args.rounds)
        return
    states = [JobState(s) for s in args.states.split(",")]
    cluster = PgCluster()
    cluster.start()
    try:
        # Retention keeps every completed job (the default keeps 10,000 a queue).
        keep = Retention(completed_max=args.jobs)
        broker = PostgresBroker(cluster.url, BrokerSettings(namespace="bench", retention=keep))
        await broker.connect()
        conn = await asyncpg.connect(broker.target.dsn)
        try:
            # Never analyzed: autovacuum must not analyze it behind the bench's back.
            await conn.execute('ALTER TABLE "typedq".jobs SET (autovacuum_enabled = off)')
            for state in states:
                began = time.perf_counter()
                await fill(broker, state, args.jobs)
                print(
                    f"filled {args.jobs} {state.value} jobs in {time.perf_counter() - began:.1f} s"
                )
            analyzed = await conn.fetchval(
                "SELECT coalesce(last_analyze, last_autoanalyze) FROM pg_stat_user_tables "
                "WHERE schemaname = 'typedq' AND relname = 'jobs'"
            )
            assert analyzed is None, analyzed
            await walks(broker, states, args, "never analyzed")
            await plans(broker, conn, states, args)
            await conn.execute('VACUUM ANALYZE "typedq".jobs')
            await walks(broker, states, args, "analyzed")
            await plans(broker, conn, states, args)
        finally:
            await conn.close()
            await broker.close()
    finally:
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--page", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--states", default="waiting,scheduled,completed")
    parser.add_argument("--drain", type=int, default=0, help="workers: the write cost instead")
    anyio.run(main, parser.parse_args(), backend="asyncio")
