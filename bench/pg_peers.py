"""typedq's PostgreSQL broker against the PostgreSQL job queues (issue 30, Performance).

    .venv/bin/python -m bench.pg_peers                       # full: 20,000 jobs a row, 3 reps
    .venv/bin/python -m bench.pg_peers --n 2000 --reps 1 --label smoke-loaded
    .venv/bin/python -m bench.pg_peers --systems typedq,procrastinate --rows e2e1,history

Rows, each one adapter process per system and repetition (bench/adapters/<system>.py, the
same driver as bench/run.py: bench/adapters/common.py), interleaved round-robin, medians:

- ``e2e1``, ``e2e16``, ``e2e64``: n jobs from 4 producers (single enqueues) while one
  worker process runs at concurrency 1, 16, 64; first enqueue -> last handler finish;
- ``drain``: n jobs pre-filled (bulk path, untimed), the worker at C = 16 drains them;
- ``bulk``: n jobs as consecutive bulk calls of 100 (no worker);
- ``history0`` / ``history``: the claim under history: the drain of n jobs at C = 16 with
  0 / ``--history`` (1,000,000) finished jobs already in the system's own tables. The
  fixture is written by each adapter's ``fill_history`` with one INSERT ... SELECT
  generate_series into its own tables (what it writes is in each run's ``fixture``), then
  ``VACUUM ANALYZE``; the drain's jobs/s against ``history0``'s says whether the claim slows
  down as history grows.

Every run gets a fresh database ``tqbench_<system>`` on the local PostgreSQL service
(127.0.0.1:5432, user postgres, trust auth: this machine's service; dropped and created
before each run, as bench/durable.py does), so no run inherits another's bloat. After each
run the tables' ``n_live_tup``/``n_dead_tup`` (pg_stat_user_tables) are recorded: issue 30
asks for retention without table bloat. Peers come from PyPI into bench/.venvs/<peer>
(bench/peers.toml); typedq runs from the project venv.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.run import PROJECT_PYTHON, RESULTS, ROOT, ensure_venv

SYSTEMS = ["typedq", "procrastinate", "pgqueuer", "oban", "awa", "awa-qs", "dbos"]
#: system -> (venv and adapter module, extra environment)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "awa-qs": ("awa", {"BENCH_AWA_STORAGE": "queue_storage"}),
}
ROWS = ["e2e1", "e2e16", "e2e64", "drain", "bulk", "history0", "history"]
PG = "postgresql://postgres@127.0.0.1:5432"

#: (metric, label, higher is better) per row kind
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "e2e": [("jobs_per_s", "jobs/s", True), ("p50_ms", "p50 ms", False)],
    "drain": [("jobs_per_s", "jobs/s", True)],
    "bulk": [("jobs_per_s", "jobs/s", True)],
    "history": [("jobs_per_s", "jobs/s", True)],
}


def params_of(row: str, n: int, history: int) -> dict[str, Any]:
    if row.startswith("e2e"):
        # DBOS at C = 1 runs under 50 jobs/s (a 50 ms poll, one at a time): wait for it.
        return {"workload": "e2e", "n": n, "concurrency": int(row[3:]), "producers": 4,
                "min_rate": 5}  # fmt: skip
    if row == "drain":
        return {"workload": "drain", "n": n, "concurrency": 16}
    if row == "bulk":
        return {"workload": "bulk", "n": n, "batch": 100}
    return {
        "workload": "history",
        "n": n,
        "concurrency": 16,
        "history": 0 if row == "history0" else history,
    }


def _psql(db: str, sql: str) -> str:
    done = subprocess.run(
        ["psql", f"{PG}/{db}", "-AtXqc", sql], capture_output=True, text=True, check=True
    )
    return done.stdout


def fresh_database(db: str) -> None:
    _psql("postgres", f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    _psql("postgres", f"CREATE DATABASE {db}")


def table_stats(db: str) -> dict[str, dict[str, int]]:
    """pg_stat_user_tables of the run's database (its backends have exited: stats flushed)."""
    out = _psql(
        db,
        "SELECT schemaname || '.' || relname, n_live_tup, n_dead_tup, n_tup_del "
        "FROM pg_stat_user_tables ORDER BY 1",
    )
    stats: dict[str, dict[str, int]] = {}
    for line in out.splitlines():
        name, live, dead, deleted = line.split("|")
        stats[name] = {"live": int(live), "dead": int(dead), "deleted": int(deleted)}
    return stats


def python_of(system: str) -> Path:
    system = VARIANTS.get(system, (system, {}))[0]
    if system == "typedq":  # a worktree has no .venv of its own: the interpreter running this
        return PROJECT_PYTHON if PROJECT_PYTHON.exists() else Path(sys.executable)
    return ensure_venv(system)


def run_one(system: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    db = f"tqbench_{system.replace('-', '_')}"
    module, extra = VARIANTS.get(system, (system, {}))
    fresh_database(db)
    url = f"{PG}/{db}"
    env = dict(os.environ)
    env.pop("BENCH_REDIS_URL", None)
    env.update(BENCH_PG_URL=url, PYTHONPATH=str(ROOT), **extra)
    if system == "typedq":
        env["BENCH_TYPEDQ_BROKER"] = url
        if params["workload"] == "history":  # keep the fixture (see the adapter)
            env["BENCH_TYPEDQ_KEEP"] = str(10 * (int(params["history"]) + int(params["n"])) + 1)
    argv = [str(python_of(system)), "-m", f"bench.adapters.pg_{module}", json.dumps(params)]
    load = os.getloadavg()[0]
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"system": system, "params": params, "error": f"timed out after {timeout}s"}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a worker the adapter left behind
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"system": system, "params": params, "error": f"exit {proc.returncode}: "
                f"{(stderr or stdout)[-2000:]}"}  # fmt: skip
    result: dict[str, Any] = json.loads(lines[-1])
    if "error" in result:
        result["stderr_tail"] = stderr[-2000:]
    time.sleep(0.5)  # the stats collector: exited backends' counters land within moments
    with contextlib.suppress(subprocess.CalledProcessError):
        result["tables"] = table_stats(db)
    result.update(system=system, wall_s=time.monotonic() - started, loadavg_1m_before=load)
    return result


def medians(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["row"], run["system"]), []).append(run)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (row, system), items in grouped.items():
        ok = [i["result"] for i in items if "result" in i]
        cell: dict[str, Any] = {"reps": len(ok), "errors": [i["error"][-300:] for i in items
                                                            if "error" in i]}  # fmt: skip
        for key in ok[0] if ok else {}:
            values = [r[key] for r in ok if isinstance(r.get(key), int | float)]
            if values:
                cell[key] = statistics.median(values)
        out.setdefault(row, {})[system] = cell
    return out


def row_label(row: str, n: int, history: int) -> str:
    if row.startswith("e2e"):
        return f"e2e C={row[3:]} ({n:,} jobs, 4 producers)"
    if row == "drain":
        return f"drain C=16 ({n:,} jobs)"
    if row == "bulk":
        return f"bulk enqueue ({n:,} jobs, batches of 100)"
    h = 0 if row == "history0" else history
    return f"drain C=16 with {h:,} finished jobs in the table ({n:,} jobs)"


def fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


def markdown(data: dict[str, Any]) -> str:
    systems: list[str] = data["systems"]
    peers = [s for s in systems if s != "typedq"]
    n, history = data["n"], data["history"]
    lines = [
        f"| row | metric | {' | '.join(systems)} | best peer | typedq vs best |",
        "| --- | --- | " + "---: | " * (len(systems) + 2),
    ]
    for row in data["rows"]:
        cells = data["medians"].get(row, {})
        kind = "e2e" if row.startswith("e2e") else "history" if row.startswith("history") else row
        for i, (key, label, higher) in enumerate(METRICS[kind]):
            vals = {s: cells.get(s, {}).get(key) for s in systems}
            t = vals.get("typedq")
            shown = []
            for s in systems:
                v = vals[s]
                if v is None:
                    errs = cells.get(s, {}).get("errors")
                    shown.append("error" if errs else "n/a")
                elif s != "typedq" and t:
                    ratio = t / v if higher else v / t
                    shown.append(f"{fmt(v)} ({ratio:.2f}x)")
                else:
                    shown.append(fmt(v))
            have = [(s, vals[s]) for s in peers if vals[s] is not None]
            best, verdict = "n/a", "n/a"
            if have:
                b = (max if higher else min)(have, key=lambda x: x[1] or 0.0)
                best = f"{b[0]} {fmt(b[1])}"
                if t and b[1]:
                    verdict = f"{(t / b[1] if higher else b[1] / t):.2f}x"
            name = row_label(row, n, history) if i == 0 else ""
            lines.append(f"| {name} | {label} | {' | '.join(shown)} | {best} | {verdict} |")
    return "\n".join(lines)


def dead_tuples(data: dict[str, Any]) -> str:
    """Per system and row, the tables' dead and live tuples after the run (largest dead)."""
    lines = ["| row | system | table: dead / live tuples (after the run) |", "| --- | --- | --- |"]
    for run in data["runs"]:
        tables = run.get("tables") or {}
        busy = sorted(tables.items(), key=lambda kv: -kv[1]["dead"])[:4]
        text = "; ".join(f"{k}: {v['dead']:,} / {v['live']:,}" for k, v in busy) or "n/a"
        lines.append(f"| {run['row']} | {run['system']} | {text} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--n", type=int, default=20_000, help="jobs per row")
    parser.add_argument("--history", type=int, default=1_000_000, help="finished jobs")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--label", default="", help="in the file names, e.g. smoke-loaded")
    parser.add_argument("--header", default="", help="a line above the table")
    opts = parser.parse_args()
    systems = [s for s in opts.systems.split(",") if s]
    rows = [r for r in opts.rows.split(",") if r]
    for system in systems:
        python_of(system)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    pg_version = _psql("postgres", "SHOW server_version").strip()
    started = dt.datetime.now(dt.UTC)
    runs: list[dict[str, Any]] = []
    for rep in range(opts.reps):
        for index, row in enumerate(rows):
            shift = (rep + index) % len(systems)
            for system in systems[shift:] + systems[:shift]:  # interleaved, rotating start
                params = params_of(row, opts.n, opts.history)
                result = run_one(system, params, opts.timeout)
                result.update(row=row, rep=rep)
                runs.append(result)
                got = result.get("result", {})
                text = (f"{got.get('jobs_per_s', float('nan')):,.0f} jobs/s"
                        if got else f"ERROR {result.get('error', '')[:300]}")  # fmt: skip
                print(f"[rep {rep + 1}] {row:<9} {system:<14} {text}", flush=True)
    data: dict[str, Any] = {
        "commit": commit,
        "label": opts.label,
        "header": opts.header,
        "started": started.isoformat(timespec="seconds"),
        "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "postgres": pg_version,
        "cores": os.cpu_count(),
        "n": opts.n,
        "history": opts.history,
        "reps": opts.reps,
        "systems": systems,
        "rows": rows,
        "versions": {r["system"]: r["version"] for r in runs if "version" in r},
        "notes": {r["system"]: r.get("notes", "") for r in runs if "notes" in r},
        "bulk_api": {r["system"]: r.get("bulk_api", "") for r in runs if "bulk_api" in r},
        "medians": medians(runs),
        "runs": runs,
    }
    stem = f"pg-peers-{opts.label}" if opts.label else "pg-peers"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    loads = [r["loadavg_1m_before"] for r in runs if "loadavg_1m_before" in r]
    head = [
        f"# PostgreSQL peers: {opts.header}" if opts.header else "# PostgreSQL peers",
        "",
        f"typedq {commit}, PostgreSQL {pg_version} (local service), {os.cpu_count()} cores, "
        f"{started:%Y-%m-%d %H:%M}-{dt.datetime.now(dt.UTC):%H:%M} UTC, {opts.n:,} jobs a row, "
        f"median of {opts.reps}, 1-minute load before the runs "
        f"{min(loads, default=0):.1f}-{max(loads, default=0):.1f}.",
        "`(N.NNx)`: typedq's advantage over that system in the same run (> 1: typedq better).",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in data["versions"].items()),
        "",
    ]
    body = markdown(data)
    tail = ["", "## Worker and bulk setup per system", ""]
    tail += [f"- **{s}**: {data['notes'].get(s, '')} Bulk: {data['bulk_api'].get(s, '')}."
             for s in systems]  # fmt: skip
    fixtures = {r["system"]: r["result"].get("fixture") for r in runs
                if r.get("result", {}).get("history")}  # fmt: skip
    if fixtures:
        tail += ["", "## History fixtures", ""]
        tail += [f"- **{s}**: {f}" for s, f in fixtures.items()]
    errors = [r for r in runs if "error" in r]
    if errors:
        tail += ["", "## Errors", ""]
        tail += [f"- {r['row']} {r['system']}: {r['error'][:400]}" for r in errors]
    tail += ["", "## Dead tuples after each run (pg_stat_user_tables)", "", dead_tuples(data)]
    text = "\n".join(head) + "\n" + body + "\n" + "\n".join(tail) + "\n"
    (RESULTS / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
