"""Durable runs: typedq against DBOS Transact, the same workflows (issue 26).

A run is a durable function of ``--steps`` no-op steps (each a task of the app: a
``run.step`` in typedq, a ``@DBOS.step()`` in DBOS); ``--runs`` of them are started
``--concurrency`` at a time and awaited, in one process that also runs them (DBOS runs
workflows in the process that starts them; typedq's worker is ``app.worker()`` in the same
process). Systems, each in a process of its own, interleaved, ``--reps`` times, medians:

- ``typedq-memory``: the embedded broker
- ``typedq-redis``: a fresh redis-server of its own (bench/redis_server.py)
- ``typedq-postgres``: the PostgreSQL broker on the local PostgreSQL (database
  ``typedqdur``, its schema dropped before each run)
- ``dbos-direct``: ``DBOS.start_workflow_async`` on the local PostgreSQL (a fresh database)
- ``dbos-queue``: a DBOS queue with ``worker_concurrency`` = concurrency (its docs' way
  to bound concurrency), polled every 50 ms

Run: ``.venv/bin/python -m bench.durable [--runs 1000 --steps 5 --concurrency 16 --reps 3]``.
DBOS comes from PyPI into bench/.venvs/dbos (bench/peers.toml); PostgreSQL must answer on
127.0.0.1:5432 as ``postgres`` (trust auth, as on this machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.redis_server import redis_server
from bench.run import PROJECT_PYTHON, ROOT, ensure_venv

SYSTEMS = ("typedq-memory", "typedq-redis", "typedq-postgres", "dbos-direct", "dbos-queue")
#: The PostgreSQL broker's database (typedq-postgres).
PG_DATABASE = "typedqdur"
DATABASE = "durbench"
FIELDS = ("steps_per_s", "runs_per_s", "run_p50_ms", "run_p99_ms")


def _postgres(*argv: str) -> None:
    subprocess.run([*argv, "-h", "127.0.0.1", "-U", "postgres", DATABASE], check=False,
                   capture_output=True)  # fmt: skip


def one(system: str, params: dict[str, Any], redis_url: str) -> dict[str, Any]:
    """Run one system once in a fresh process; its JSON line."""
    if system.startswith("typedq"):
        broker = {
            "typedq-memory": "memory://",
            "typedq-postgres": f"postgresql://postgres@127.0.0.1:5432/{PG_DATABASE}?schema=durbench",
        }.get(system, redis_url)
        python, module = PROJECT_PYTHON, "bench.adapters.durable_typedq"
        args = {**params, "broker": broker}
        if system == "typedq-postgres":
            subprocess.run(["createdb", "-h", "127.0.0.1", "-U", "postgres", PG_DATABASE],
                           check=False, capture_output=True)  # fmt: skip
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", PG_DATABASE, "-c",
                            "DROP SCHEMA IF EXISTS durbench CASCADE"],
                           check=True, capture_output=True)  # fmt: skip
        elif broker != "memory://":
            subprocess.run(
                ["redis-cli", "-u", redis_url, "FLUSHALL"], check=True, capture_output=True
            )
    else:
        _postgres("dropdb", "--if-exists")  # DBOS creates and migrates its database
        python, module = ensure_venv("dbos"), "bench.adapters.durable_dbos"
        args = {
            **params,
            "mode": system.removeprefix("dbos-"),
            "database": f"postgresql://postgres@127.0.0.1:5432/{DATABASE}",
        }
    done = subprocess.run(
        [str(python), "-m", module, json.dumps(args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{system} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out", type=Path, default=None, help="write every run as JSON")
    opts = parser.parse_args()
    systems = opts.systems.split(",")
    params = {"runs": opts.runs, "steps": opts.steps, "concurrency": opts.concurrency}
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    with redis_server() as redis:
        for rep in range(opts.reps):
            for system in systems:  # interleaved: every system once per repetition
                got = one(system, params, redis.url)
                rows[system].append(got)
                print(f"[rep {rep + 1}] {system}: " + ", ".join(
                    f"{f} {got[f]:,.1f}" for f in FIELDS), flush=True)  # fmt: skip
    print(f"\n{opts.runs} runs x {opts.steps} steps, concurrency {opts.concurrency}, "
          f"median of {opts.reps}, typedq {commit}, {time.strftime('%Y-%m-%d')}")  # fmt: skip
    print(f"| system | {' | '.join(FIELDS)} |")
    print("|---|" + "---|" * len(FIELDS))
    medians = {s: {f: statistics.median(r[f] for r in rows[s]) for f in FIELDS} for s in systems}
    for system in systems:
        print(f"| {system} | " + " | ".join(f"{medians[system][f]:,.1f}" for f in FIELDS) + " |")
    dbos = [s for s in systems if s.startswith("dbos")]
    if dbos:
        best = max(dbos, key=lambda s: medians[s]["steps_per_s"])
        for system in (s for s in systems if s.startswith("typedq")):
            ratio = medians[system]["steps_per_s"] / medians[best]["steps_per_s"]
            print(f"{system}: {ratio:.1f}x the steps/s of {best}")
    if opts.out is not None:
        opts.out.write_text(
            json.dumps({"commit": commit, "params": params, "runs": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
