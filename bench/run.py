"""typedq against its Python peers on one fresh local Redis: the runnable comparison.

    .venv/bin/python bench/run.py                 # full run: 3 interleaved repetitions
    .venv/bin/python bench/run.py --quick         # tiny sizes, 1 repetition (smoke test)
    .venv/bin/python bench/run.py --systems typedq,arq --workloads single,e2e
    .venv/bin/python bench/run.py --report bench/results/latest.json [--markdown]

Each peer runs from PyPI in its own virtualenv, bench/.venvs/<peer>, created on first use from
the pins in bench/peers.toml; typedq runs in the project venv. One adapter per system
(bench/adapters/<system>.py) runs one workload per process and prints one JSON line. The runner
spawns its own redis-server on a free port, FLUSHALLs before every run, interleaves the systems
(round-robin inside every workload of every repetition, starting at a different system each
time), takes the median of the repetitions, prints the table with ratios against typedq and
against the best peer of the same run, writes bench/results/latest.json and draws
bench/results/latest.png with matplotlib from its own venv (bench/.venvs/plot).

This file uses only the standard library at import time (rich is imported for the table when
available): the plot venv runs it too, as ``run.py --plot IN.json OUT.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: bench/ is a package of the repository root
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_server import BenchRedis, redis_server

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
RESULTS = BENCH / "results"
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"

SYSTEMS = ["typedq", "arq", "saq", "streaq", "taskiq", "bullmq", "celery", "dramatiq", "rq", "raw"]
#: The prefetch of system ``typedq-prefetch`` (typedq's worker with ``--prefetch``).
TYPEDQ_PREFETCH = 4

# Not peers: reference floors, shown in the table but never the "best peer".
FLOORS = ("raw",)
WORKLOADS = ["single", "bulk", "e2e", "drain", "latency", "memory", "chain", "fanin"]
FLOW_WORKLOADS = ("chain", "fanin")

FULL: dict[str, Any] = {
    "single": 10_000,
    "bulk": 10_000,
    "e2e": 20_000,
    "drain": 20_000,
    "latency": 20_000,  # offered at latency_rate jobs/s: 20 s
    "latency_rate": 1_000,
    "memory": 1_000_000,
    "chain": 2_000,  # chains of flow_size links
    "fanin": 2_000,  # fan-outs of flow_size members + a fan-in callback
    "flow_size": 10,
    "flow_concurrency": 16,
    "flow_window": 32,
    "concurrency": [1, 4, 16, 64],
    "reps": 3,
    "memory_reps": 1,
}
QUICK: dict[str, Any] = {
    "single": 1_000,
    "bulk": 1_000,
    "e2e": 1_000,
    "drain": 1_000,
    "latency": 1_000,
    "latency_rate": 1_000,
    "memory": 10_000,
    "chain": 20,
    "fanin": 20,
    "flow_size": 10,
    "flow_concurrency": 16,
    "flow_window": 32,
    "concurrency": [1, 16],
    "reps": 1,
    "memory_reps": 1,
}

# (metric key, label, unit, higher is better)
METRICS: dict[str, list[tuple[str, str, bool]]] = {
    "single": [("jobs_per_s", "jobs/s", True), ("p99_ms", "p99 enqueue ms", False)],
    "bulk": [("jobs_per_s", "jobs/s", True), ("batch_p99_ms", "p99 per batch ms", False)],
    "e2e": [
        ("jobs_per_s", "jobs/s", True),
        ("p50_ms", "p50 ms", False),
        ("p95_ms", "p95 ms", False),
        ("worker_cpu_ms_per_1k", "worker CPU ms/1k jobs", False),
        ("redis_cpu_ms_per_1k", "Redis CPU ms/1k jobs", False),
        ("producer_cpu_ms_per_1k", "producer CPU ms/1k jobs", False),
    ],
    "latency": [
        ("p50_ms", "p50 ms", False),
        ("p99_ms", "p99 ms", False),
        ("p999_ms", "p99.9 ms", False),
        ("late_sends", "late sends", False),
        ("worker_cpu_ms_per_1k", "worker CPU ms/1k jobs", False),
        ("redis_cpu_ms_per_1k", "Redis CPU ms/1k jobs", False),
    ],
    "drain": [("jobs_per_s", "jobs/s", True)],
    "memory": [("bytes_per_job", "bytes/job", False)],
    "chain": [
        ("tasks_per_s", "tasks/s", True),
        ("p50_ms", "chain p50 ms", False),
        ("p95_ms", "chain p95 ms", False),
    ],
    "fanin": [
        ("tasks_per_s", "tasks/s", True),
        ("p50_ms", "callback p50 ms", False),
        ("p95_ms", "callback p95 ms", False),
    ],
}


# -- environments ------------------------------------------------------------------------------


def peers() -> dict[str, list[str]]:
    data = tomllib.loads((BENCH / "peers.toml").read_text())
    return {name: spec["requirements"] for name, spec in data["venvs"].items()}


def venv_python(name: str) -> str | None:
    """The Python version a venv asks for (``python = "3.12"`` in peers.toml), or None."""
    data = tomllib.loads((BENCH / "peers.toml").read_text())
    wanted: str | None = data["venvs"][name].get("python")
    return wanted


def interpreter(version: str | None) -> str:
    """``pythonX.Y`` on the PATH, else pyenv's newest X.Y.*, else this interpreter's own."""
    if version is None:
        return sys.executable
    found = shutil.which(f"python{version}")
    if found:
        return found
    pyenv = sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python"))
    if pyenv:
        return str(pyenv[-1])
    raise SystemExit(f"bench/peers.toml asks for Python {version}: no python{version} found")


def ensure_venv(name: str) -> Path:
    """bench/.venvs/<name>, created (or recreated when its pins changed) with pip."""
    reqs = peers()[name]
    wanted = venv_python(name)
    pins: Any = reqs if wanted is None else {"python": wanted, "requirements": reqs}
    venv = VENVS / name
    marker = venv / ".requirements.json"
    python = venv / "bin" / "python"
    if python.exists() and marker.exists() and json.loads(marker.read_text()) == pins:
        return python
    print(f"[setup] creating {venv.relative_to(ROOT)}: {' '.join(reqs)}", flush=True)
    subprocess.run([interpreter(wanted), "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *reqs], check=True)
    marker.write_text(json.dumps(pins))
    return python


def python_for(system: str) -> Path:
    if system.startswith("typedq") or system in FLOORS:
        return PROJECT_PYTHON
    return ensure_venv(system)


@contextlib.contextmanager
def code_tree(worktree: bool, rev: str = "HEAD") -> Iterator[tuple[Path, str]]:
    """The directory adapters run from, and a description of the typedq code in it.

    By default a snapshot of ``rev`` (HEAD; ``git archive``: typedq/ and bench/adapters/) in a
    temporary directory, so commits or edits landing in the working tree during a long run
    cannot change typedq's code half-way through. ``--worktree`` runs the working tree as it is.
    """
    commit = subprocess.run(
        ["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    if worktree:
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "typedq", "bench/adapters"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        yield ROOT, f"working tree at {commit}" + (" (with uncommitted changes)" if dirty else "")
        return
    folder = Path(tempfile.mkdtemp(prefix="typedq-bench-tree-"))
    try:
        archive = subprocess.run(
            ["git", "archive", rev, "typedq", "bench/__init__.py", "bench/adapters"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
        yield folder, f"snapshot of {'HEAD ' if rev == 'HEAD' else ''}{commit}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- running -------------------------------------------------------------------------------


def cases(sizes: dict[str, Any], workloads: list[str]) -> list[tuple[str, str, dict[str, Any]]]:
    out: list[tuple[str, str, dict[str, Any]]] = []
    for w in workloads:
        if w == "single":
            out.append(("single", w, {"workload": w, "n": sizes[w], "producers": 32}))
        elif w == "bulk":
            out.append(("bulk", w, {"workload": w, "n": sizes[w], "batch": 100}))
        elif w == "e2e":
            for c in sizes["concurrency"]:
                params = {"workload": w, "n": sizes[w], "producers": 4, "concurrency": c}
                out.append((f"e2e_c{c}", w, params))
        elif w == "drain":
            out.append(("drain", w, {"workload": w, "n": sizes[w], "concurrency": 16}))
        elif w == "latency":
            rate = sizes["latency_rate"]
            params = {"workload": w, "n": sizes[w], "rate": rate, "concurrency": 16}
            out.append(("latency", w, params))
        elif w == "memory":
            out.append(("memory", w, {"workload": w, "n": sizes[w]}))
        elif w in FLOW_WORKLOADS:
            params = {
                "workload": w,
                "n": sizes[w],
                "size": sizes["flow_size"],
                "concurrency": sizes["flow_concurrency"],
                "producers": 4,
                "window": sizes["flow_window"],
            }
            out.append((w, w, params))
    return out


def run_one(
    system: str, params: dict[str, Any], server: BenchRedis, timeout: float, tree: Path
) -> dict[str, Any]:
    server.flushall()
    env = dict(os.environ)
    env["BENCH_REDIS_URL"] = server.url
    env.pop("BENCH_TYPEDQ_BROKER", None)
    module = system.partition("@")[0]  # typedq@REV: typedq as of REV (--baseline)
    env.pop("TYPEDQ_PREFETCH", None)
    if system == "typedq-memory":
        env["BENCH_TYPEDQ_BROKER"] = "memory://"
        module = "typedq"
    elif system == "typedq-prefetch":
        # The same adapter, its worker started with `--prefetch` (TYPEDQ_PREFETCH): a
        # worker setting, not the default (docs/workers.md "Prefetch").
        env["TYPEDQ_PREFETCH"] = str(TYPEDQ_PREFETCH)
        module = "typedq"
    argv = [str(python_for(system)), "-m", f"bench.adapters.{module}", json.dumps(params)]
    load = os.getloadavg()[0]
    started = time.monotonic()
    # Its own session: on a timeout the adapter and the worker it spawned are killed together,
    # so no stray worker can take jobs from a later run.
    proc = subprocess.Popen(
        argv,
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return {"system": system, "params": params, "error": f"timed out after {timeout}s"}
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # anything the adapter left behind
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (stderr or stdout)[-2000:]
        return {"system": system, "params": params, "error": f"exit {proc.returncode}: {tail}"}
    result: dict[str, Any] = json.loads(lines[-1])
    if "error" in result:
        result["stderr_tail"] = stderr[-2000:]
    result["system"] = system
    result["wall_s"] = time.monotonic() - started
    result["loadavg_1m_before"] = load
    return result


def describe(result: dict[str, Any]) -> str:
    if "unsupported" in result:
        return str(result["unsupported"])
    if "error" in result:
        return "ERROR " + str(result["error"]).strip().splitlines()[-1][:200]
    r = result["result"]
    if "tasks_per_s" in r:
        return (
            f"{r['tasks_per_s']:,.0f} tasks/s, p50 {r['p50_ms']:,.1f} ms, p95 {r['p95_ms']:,.1f} ms"
            f" ({r['tasks_counted']:,} of {r['tasks']:,} tasks counted)"
        )
    if "offered_per_s" in r:
        return (
            f"p50 {r['p50_ms']:,.2f} ms, p99 {r['p99_ms']:,.2f} ms, p99.9 {r['p999_ms']:,.2f} ms,"
            f" {r['late_sends']:,} late sends"
        )
    if "bytes_per_job" in r:
        return f"{r['bytes_per_job']:,.0f} bytes/job"
    extra = ""
    if "p50_ms" in r and "p95_ms" in r:
        extra = f", p50 {r['p50_ms']:,.1f} ms, p95 {r['p95_ms']:,.1f} ms"
    elif "batch_p99_ms" in r:
        extra = f", batch p99 {r['batch_p99_ms']:,.1f} ms"
    return f"{r['jobs_per_s']:,.0f} jobs/s{extra}"


def machine(server: BenchRedis) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_total = ""
    with contextlib.suppress(OSError):
        mem_total = Path("/proc/meminfo").read_text().splitlines()[0].split(":", 1)[1].strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "memory": mem_total,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_version": server.info("server").get("redis_version", "?"),
        "typedq_commit": commit,
    }


def aggregate(runs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """{case: {system: {metric: median, ..., "reps": k, "errors": [...]}}}"""
    grouped: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        grouped.setdefault((run["case"], run["system"]), []).append(run)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (case, system), items in grouped.items():
        ok = [i["result"] for i in items if "result" in i]
        cell: dict[str, Any] = {
            "reps": len(ok),
            "errors": [i["error"][-300:] for i in items if "error" in i],
        }
        unsupported = [i["unsupported"] for i in items if "unsupported" in i]
        if unsupported:
            cell["unsupported"] = unsupported[0]
        for key in ok[0] if ok else {}:
            values = [r[key] for r in ok if isinstance(r.get(key), int | float)]
            if values:
                cell[key] = statistics.median(values)
        meta = next((i for i in items if "result" in i), items[0])
        cell["bulk_api"] = meta.get("bulk_api", "")
        out.setdefault(case, {})[system] = cell
    return out


def execute(args: argparse.Namespace) -> dict[str, Any]:
    sizes = dict(QUICK if args.quick else FULL)
    if args.reps:
        sizes["reps"] = args.reps
    if args.concurrency:
        sizes["concurrency"] = [int(c) for c in args.concurrency.split(",")]
    if args.memory_n:
        sizes["memory"] = args.memory_n
    if args.n:
        for w in ("single", "bulk", "e2e", "drain"):
            sizes[w] = args.n
    if args.flows:
        for w in FLOW_WORKLOADS:
            sizes[w] = args.flows
    if args.flow_window:
        sizes["flow_window"] = args.flow_window
    systems = [s for s in args.systems.split(",") if s]
    workloads = [w for w in args.workloads.split(",") if w]
    for system in systems:
        python_for(system)
    todo = cases(sizes, workloads)
    runs: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.UTC)
    load_start = os.getloadavg()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(redis_server())
        tree, code = stack.enter_context(code_tree(args.worktree))
        # Each system's code tree: typedq@REV (--baseline) runs a snapshot of REV.
        trees = {s: tree for s in systems}
        if args.baseline:
            base_tree, base_code = stack.enter_context(code_tree(False, args.baseline))
            baseline = f"typedq@{args.baseline}"
            systems.insert(systems.index("typedq") + 1 if "typedq" in systems else 0, baseline)
            trees[baseline] = base_tree
            print(f"[bench] {baseline}: {base_code}", flush=True)
        facts = machine(server)
        facts["typedq_code"] = code
        print(f"[bench] typedq code: {code}", flush=True)
        print(
            f"[bench] redis {facts['redis_version']} on port {server.port}; {facts['cores']} cores;"
            f" load average {load_start[0]:.2f}; {len(systems)} systems x {len(todo)} cases x "
            f"{sizes['reps']} repetitions",
            flush=True,
        )
        for rep in range(sizes["reps"]):
            for index, (case, _workload, params) in enumerate(todo):
                if case == "memory" and rep >= sizes["memory_reps"]:
                    continue
                participants = [
                    s for s in systems if not (case == "memory" and s == "typedq-memory")
                ]
                shift = (rep + index) % len(participants) if participants else 0
                order = participants[shift:] + participants[:shift]
                for system in order:
                    result = run_one(system, params, server, args.timeout, trees[system])
                    result.update(case=case, rep=rep)
                    runs.append(result)
                    print(
                        f"[rep {rep + 1}/{sizes['reps']}] {case:<8} {system:<14} "
                        f"{describe(result)}",
                        flush=True,
                    )
    load_end = os.getloadavg()
    versions = {}
    for run in runs:
        if "version" in run:
            versions[run["system"]] = run["version"]
    facts.update(
        loadavg_start=list(load_start),
        loadavg_end=list(load_end),
        started=started.isoformat(timespec="seconds"),
        finished=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    return {
        "mode": "quick" if args.quick else "full",
        "machine": facts,
        "sizes": sizes,
        "systems": systems,
        "versions": versions,
        "bulk_api": {r["system"]: r.get("bulk_api", "") for r in runs if "bulk_api" in r},
        "notes": {r["system"]: r.get("notes", "") for r in runs if "notes" in r},
        "flow_api": flow_apis(runs),
        "medians": aggregate(runs),
        "runs": runs,
    }


def flow_apis(runs: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """{system: {workload: the workflow API it used, or "n/a: reason"}}"""
    out: dict[str, dict[str, str]] = {}
    for run in runs:
        if "flow_api" in run:
            out.setdefault(run["system"], {})[run["params"]["workload"]] = run["flow_api"]
    return out


# -- reporting -----------------------------------------------------------------------------


def case_label(case: str, sizes: dict[str, Any]) -> str:
    if case == "single":
        return f"single enqueue ({sizes['single']:,}, 32 producers)"
    if case == "bulk":
        return f"bulk enqueue ({sizes['bulk']:,}, batches of 100)"
    if case.startswith("e2e_c"):
        return f"end-to-end C={case[5:]} ({sizes['e2e']:,}, 4 producers)"
    if case == "drain":
        return f"drain C=16 ({sizes['drain']:,} pre-filled)"
    if case == "latency":
        rate = sizes["latency_rate"]
        return f"open-loop latency, {rate:,} jobs/s offered, C=16 ({sizes['latency']:,} jobs)"
    if case == "memory":
        return f"memory at N={sizes['memory']:,} waiting"
    if case == "chain":
        c = sizes["flow_concurrency"]
        return f"chain ({sizes['chain']:,} chains of {sizes['flow_size']}, C={c})"
    if case == "fanin":
        c = sizes["flow_concurrency"]
        return f"fan-in ({sizes['fanin']:,} fan-outs of {sizes['flow_size']} + callback, C={c})"
    return case


def advantage(typedq: float, peer: float, higher_better: bool) -> float:
    """> 1: typedq is better by that factor; < 1: the peer is."""
    if typedq <= 0 or peer <= 0:
        return float("nan")
    return typedq / peer if higher_better else peer / typedq


def fmt(value: float | None, key: str) -> str:
    if value is None:
        return "-"
    if key.endswith("_ms"):
        if value < 10:
            return f"{value:,.2f}"
        return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,.0f}"


def table_rows(data: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and rows: metric | each system's median (typedq's advantage) | best peer | vs."""
    systems: list[str] = data["systems"]
    medians = data["medians"]
    reference = "typedq" if "typedq" in systems else systems[0]
    peers_ = [s for s in systems if not s.startswith("typedq") and s not in FLOORS]
    header = ["workload", "metric", *systems, "best peer", "typedq vs best"]
    rows: list[list[str]] = []
    for case, cells in medians.items():
        workload = "e2e" if case.startswith("e2e_") else case
        for key, unit, higher in METRICS[workload]:
            row = [case_label(case, data["sizes"]), unit]
            ref = cells.get(reference, {}).get(key)
            for system in systems:
                cell = cells.get(system, {})
                value = cell.get(key)
                if value is None:
                    if cell.get("unsupported"):
                        row.append("n/a")
                    else:
                        row.append("error" if cell.get("errors") else "-")
                    continue
                text = fmt(value, key)
                if system != reference and ref is not None and reference == "typedq":
                    text += f" ({advantage(ref, value, higher):.2f}x)"
                api = cell.get("bulk_api", "")
                if workload == "bulk" and key == "jobs_per_s" and "no bulk API" in api:
                    text += "*"
                row.append(text)
            best_system, best_value = None, None
            for system in peers_:
                v = cells.get(system, {}).get(key)
                if v is None:
                    continue
                if best_value is None or (v > best_value if higher else v < best_value):
                    best_system, best_value = system, v
            if best_system is None or best_value is None:
                row += ["-", "-"]
            else:
                row.append(f"{best_system} {fmt(best_value, key)}")
                row.append(
                    f"{advantage(ref, best_value, higher):.2f}x"
                    if ref is not None and reference == "typedq"
                    else "-"
                )
            rows.append(row)
    return header, rows


def print_table(data: dict[str, Any]) -> None:
    header, rows = table_rows(data)
    title = (
        f"typedq vs peers ({data['mode']} run, median of {data['sizes']['reps']}; "
        f"{data['machine']['cores']} cores, redis {data['machine']['redis_version']}, "
        f"load avg {data['machine']['loadavg_start'][0]:.2f} -> "
        f"{data['machine']['loadavg_end'][0]:.2f})"
    )
    foot = (
        "(Nx) = typedq's advantage over that system in this run: >1 typedq better, <1 worse. "
        "* = no bulk API: best available path (see bulk_api in the JSON)."
    )
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(" | ".join(header))
        for row in rows:
            print(" | ".join(row))
        print(foot)
        return
    table = Table(title=title, caption=foot, show_lines=False)
    for i, name in enumerate(header):
        table.add_column(name, justify="left" if i < 2 else "right", overflow="fold")
    previous = None
    for row in rows:
        first = row[0] if row[0] != previous else ""
        previous = row[0]
        table.add_row(first, *row[1:])
    Console(width=max(160, 24 * len(header))).print(table)


def markdown(data: dict[str, Any]) -> str:
    header, rows = table_rows(data)
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(" --- " if i < 2 else " ---: " for i in range(len(header))) + "|",
    ]
    previous = None
    for row in rows:
        first = row[0] if row[0] != previous else ""
        previous = row[0]
        lines.append("| " + " | ".join([first, *row[1:]]) + " |")
    return "\n".join(lines)


def plot(src: Path, dest: Path) -> None:
    """Runs inside bench/.venvs/plot (matplotlib is never a typedq dependency)."""
    import matplotlib  # type: ignore[import-not-found, unused-ignore]  # only in the plot venv

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]

    data = json.loads(src.read_text())
    systems: list[str] = data["systems"]
    medians = data["medians"]
    # The default cycle has 10 colours; more systems (all peers plus --baseline) need tab20's
    # 20 so that no two bars share one.
    palette = plt.get_cmap("tab20") if len(systems) > 10 else None
    colors = {s: palette(i) if palette else f"C{i}" for i, s in enumerate(systems)}
    e2e_cases = [c for c in medians if c.startswith("e2e_c")]
    panels = [
        ("single enqueue: jobs/s", ["single"], "jobs_per_s", False),
        ("bulk enqueue: jobs/s", ["bulk"], "jobs_per_s", False),
        ("drain C=16: jobs/s", ["drain"], "jobs_per_s", False),
        ("end-to-end: jobs/s by concurrency", e2e_cases, "jobs_per_s", False),
        ("end-to-end: p50 latency ms (log)", e2e_cases, "p50_ms", True),
        ("memory: bytes per waiting job", ["memory"], "bytes_per_job", False),
        ("chain: tasks/s", ["chain"], "tasks_per_s", False),
        ("fan-in: tasks/s", ["fanin"], "tasks_per_s", False),
        ("fan-in: callback p50 ms after last member", ["fanin"], "p50_ms", False),
    ]
    panels = [p for p in panels if any(c in medians for c in p[1])]
    cols = 3
    rows_n = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(6 * cols, 4.2 * rows_n), squeeze=False)
    for ax, (title, case_list, key, log) in zip(axes.flat, panels, strict=False):
        width = 0.8 / max(1, len(systems))
        for i, system in enumerate(systems):
            values = [medians.get(c, {}).get(system, {}).get(key, 0) or 0 for c in case_list]
            xs = [j + i * width for j in range(len(case_list))]
            ax.bar(xs, values, width, label=system, color=colors[system])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(case_list))])
        ax.set_xticklabels([("C=" + c[5:]) if c.startswith("e2e_c") else "" for c in case_list])
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(systems))
    m = data["machine"]
    fig.suptitle(
        f"typedq vs Python peers, {data['mode']} run, median of {data['sizes']['reps']} "
        f"({m['cores']} cores, redis {m['redis_version']}, {m['started'][:10]})",
    )
    fig.tight_layout(rect=(0, 0.05, 1, 0.96))
    fig.savefig(dest, dpi=90)


def draw_png(json_path: Path, png_path: Path) -> None:
    python = ensure_venv("plot")
    proc = subprocess.run(
        [str(python), str(Path(__file__).resolve()), "--plot", str(json_path), str(png_path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        print(f"[plot] failed: {proc.stderr[-2000:]}")
    else:
        print(f"[plot] wrote {png_path}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 repetition")
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    parser.add_argument("--reps", type=int, default=0, help="repetitions (default 3, quick 1)")
    parser.add_argument("--concurrency", default="", help="end-to-end C values, e.g. 1,4,16,64")
    parser.add_argument("--n", type=int, default=0, help="override N of the timed workloads")
    parser.add_argument("--memory-n", type=int, default=0, help="waiting jobs for `memory`")
    parser.add_argument("--flows", type=int, default=0, help="override N of chain and fanin")
    parser.add_argument(
        "--flow-window", type=int, default=0, help="flows in flight at most (default 32)"
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument(
        "--baseline",
        default="",
        metavar="REV",
        help="also run typedq as of git REV (system typedq@REV), interleaved: before/after",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "latest.json")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--worktree",
        action="store_true",
        help="run typedq and the adapters from the working tree (default: a snapshot of HEAD)",
    )
    parser.add_argument("--report", type=Path, help="print the table of an existing JSON")
    parser.add_argument("--markdown", action="store_true", help="with --report: markdown")
    parser.add_argument(
        "--plot", nargs=2, type=Path, metavar=("JSON", "PNG"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.plot:
        plot(*args.plot)
        return
    if args.report:
        data = json.loads(args.report.read_text())
        print(markdown(data) if args.markdown else "", end="\n" if args.markdown else "")
        if not args.markdown:
            print_table(data)
        return
    data = execute(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"[bench] wrote {args.out}")
    print_table(data)
    if not args.no_plot:
        draw_png(args.out, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
