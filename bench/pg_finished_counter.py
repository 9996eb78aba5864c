"""What the PostgreSQL broker's counts of finished jobs cost concurrent completions, and
where the worker's backends wait (issue 30).

    PYTHONPATH=. .venv/bin/python -m bench.pg_finished_counter --trees /work/main,. \\
        --rows e2e16,e2e64 --n 20000 --reps 3

Each run is bench/pg_peers.py's ``e2eC`` row (or ``drainC``: n jobs pre-filled, drained
at concurrency C) for typedq (bench/adapters/pg_typedq.py: n jobs
from 4 producers, single enqueues, one worker process at concurrency C), run with the code
of one tree (its ``.venv`` and its ``bench/adapters``), in a fresh database of the
PostgreSQL at ``--pg`` (default: this machine's service, fsync on, as pg_peers runs).
Trees and rows are interleaved round-robin in each repetition; medians are printed.

While a run goes, ``pg_stat_activity`` of its database is sampled every ``--every``
seconds: each sample counts the backends in each state (``active`` on CPU, waiting on a
lock, on I/O, ...) and, for a backend waiting on a lock, the relation (or transaction) the
lock is on, from ``pg_locks``. A row lock waited for shows as a wait on the holder's
transaction id (``transactionid``) or a ``tuple`` lock of the relation: both are counted
per relation where ``pg_locks`` names one.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

PG = "postgresql://postgres@127.0.0.1:5432"

SAMPLE = """
SELECT a.pid, coalesce(a.wait_event_type, 'CPU'), coalesce(a.wait_event, ''),
       coalesce((SELECT string_agg(DISTINCT coalesce(c.relname, l.locktype), ',')
                 FROM pg_locks l LEFT JOIN pg_class c ON c.oid = l.relation
                 WHERE l.pid = a.pid AND NOT l.granted), ''),
       substring(a.query FROM '[.]([a-z_]+)[(]'),
       coalesce((SELECT string_agg(DISTINCT substring(b.query FROM '[.]([a-z_]+)[(]'), ',')
                 FROM pg_stat_activity b WHERE b.pid = ANY (pg_blocking_pids(a.pid))), '')
FROM pg_stat_activity a
WHERE a.datname = %s AND a.state = 'active' AND a.pid <> pg_backend_pid()
"""


def psql(url: str, sql: str) -> str:
    done = subprocess.run(["psql", url, "-AtXqc", sql], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(done.stderr)
    return done.stdout


class Sampler(threading.Thread):
    """Samples the database's active backends until stopped."""

    def __init__(self, url: str, db: str, every: float) -> None:
        super().__init__(daemon=True)
        self.url, self.db, self.every = url, db, every
        self.stop = threading.Event()
        self.samples = 0
        self.waits: collections.Counter[str] = collections.Counter()
        self.on: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        import psycopg  # the project's dev dependency

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.wait(self.every):
                rows = conn.execute(SAMPLE.replace("%s", "%(db)s"), {"db": self.db}).fetchall()
                self.samples += 1
                for _pid, kind, event, waiting_on, fn, blockers in rows:
                    if kind == "Client":
                        continue  # idle in a statement's protocol: not the queue's work
                    self.waits[f"{kind}:{event}" if event else kind] += 1
                    if kind == "Lock":
                        self.on[f"{fn} on {waiting_on} held by {blockers}"] += 1


class Notes(threading.Thread):
    """Counts the notifications of the run's broker channel (``typedq_typedq``) by kind
    (``w`` work, ``f`` a job's end, ...): each notifying transaction takes the
    database's notify lock at its commit, and each listening backend reads every one."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.kinds: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("LISTEN typedq_typedq")
            self.ready.set()
            while not self.stop.is_set():
                for note in conn.notifies(timeout=0.2):
                    self.kinds[note.payload.partition(":")[0]] += 1


def run_one(tree: Path, row: str, n: int, base: str, every: float) -> dict[str, Any]:
    # The runner's pid in the name: two people running this at once on one server do
    # not drop each other's database.
    db = f"tqfin_{'main' if tree.name == 'main' else 'branch'}_{os.getpid()}"
    psql(f"{base}/postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    psql(f"{base}/postgres", f"CREATE DATABASE {db}")
    url = f"{base}/{db}"
    if row.startswith("drain"):  # n jobs pre-filled (bulk, untimed), drained at C
        params: dict[str, Any] = {"workload": "drain", "n": n, "concurrency": int(row[5:])}
    else:
        params = {"workload": "e2e", "n": n, "concurrency": int(row[3:]), "producers": 4,
                  "min_rate": 5}  # fmt: skip
    env = dict(os.environ, BENCH_PG_URL=url, BENCH_TYPEDQ_BROKER=url, PYTHONPATH=str(tree))
    env.pop("BENCH_REDIS_URL", None)
    sampler = Sampler(f"{base}/postgres", db, every)
    notes = Notes(url)
    notes.start()
    notes.ready.wait(10)
    load = os.getloadavg()[0]
    sampler.start()
    done = subprocess.run(
        [str(tree / ".venv/bin/python"), "-m", "bench.adapters.pg_typedq", json.dumps(params)],
        cwd=tree, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    sampler.stop.set()
    sampler.join()
    time.sleep(1.0)  # the backends' statistics land within moments of their exit
    notes.stop.set()
    notes.join()
    query = "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted, blks_hit + blks_read "
    query += f"FROM pg_stat_database WHERE datname = '{db}'"
    stats = psql(url, query).split("|")
    psql(f"{base}/postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")  # named per runner
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    out: dict[str, Any] = json.loads(lines[-1]) if lines else {"error": done.stderr[-2000:]}
    out.update(tree=str(tree), row=row, load_1m=load, samples=sampler.samples,
               waits=dict(sampler.waits), lock_on=dict(sampler.on), notes=dict(notes.kinds),
               db_stats=dict(zip(("commits", "inserted", "updated", "deleted", "blocks"),
                                 map(int, stats), strict=True)))  # fmt: skip
    return out


def attach(base: str, db: str, every: float, command: list[str]) -> None:
    """Sample ``db`` while ``command`` runs; print its output and the waits."""
    sampler = Sampler(f"{base}/postgres", db, every)
    sampler.start()
    subprocess.run(command, check=False)
    sampler.stop.set()
    sampler.join()
    print(json.dumps({"samples": sampler.samples, "waits": dict(sampler.waits.most_common()),
                      "lock_on": dict(sampler.on.most_common(12))}))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trees", default=".", help="comma-separated checkouts, each with .venv")
    ap.add_argument("--rows", default="e2e16,e2e64", help="e2eC and drainC rows")
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--pg", default=PG, help="server URL without the database")
    ap.add_argument("--every", type=float, default=0.02, help="seconds between samples")
    ap.add_argument("--out", help="write every run as JSON")
    ap.add_argument("--attach", metavar="DB", help="only sample DB while the command after "
                    "-- runs (e.g. bench.durable), then print the waits")  # fmt: skip
    ap.add_argument("command", nargs="*")
    args = ap.parse_args()
    if args.attach:
        attach(args.pg, args.attach, args.every, args.command)
        return
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    rows = args.rows.split(",")
    runs: list[dict[str, Any]] = []
    for rep in range(args.reps):
        for i, row in enumerate(rows):
            k = (rep + i) % len(trees)
            for tree in trees[k:] + trees[:k]:
                run = run_one(tree, row, args.n, args.pg, args.every)
                runs.append(run)
                res = run.get("result", {})
                print(json.dumps({"rep": rep, "tree": tree.name, "row": row,
                                  "jobs_per_s": res.get("jobs_per_s"),
                                  "p50_ms": res.get("p50_ms"), "load": run["load_1m"],
                                  "samples": run["samples"], "waits": run["waits"],
                                  "lock_on": run["lock_on"], "db": run["db_stats"],
                                  "notes": run["notes"],
                                  "error": run.get("error")}),
                      flush=True)  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(runs, indent=1))
    print()
    for row in rows:
        for tree in trees:
            mine = [r for r in runs if r["row"] == row and r["tree"] == str(tree)]
            rates = [r["result"]["jobs_per_s"] for r in mine if "result" in r]
            p50 = [r["result"].get("p50_ms", 0) for r in mine if "result" in r]
            total: collections.Counter[str] = collections.Counter()
            samples = sum(r["samples"] for r in mine)
            for r in mine:
                total.update(r["waits"])
            top = ", ".join(f"{k} {v / max(samples, 1):.2f}" for k, v in total.most_common(6))
            print(f"{row} {tree.name}: jobs/s {[round(x) for x in rates]} median "
                  f"{statistics.median(rates) if rates else 0:,.0f}; p50 ms median "
                  f"{statistics.median(p50) if p50 else 0:.1f}; backends per sample: {top}")  # fmt: skip


if __name__ == "__main__":
    main()
