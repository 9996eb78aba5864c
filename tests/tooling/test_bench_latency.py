"""The bench's open-loop latency workload and CPU accounting (bench/adapters/common.py): a tiny
run of typedq's adapter and of the raw floor against a real redis-server. Nothing here asserts
a timing: these tests check that the driver counts and reports what it says."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from bench import run
from bench.adapters import common
from tests.redis_harness import redis_process
from tests.tooling.test_bench_flows import adapter_run


def _adapter_run(system: str, params: dict[str, Any], url: str) -> dict[str, Any]:
    out = adapter_run(params, {"BENCH_REDIS_URL": url}, system)
    assert "error" not in out, out.get("error")
    return out


@pytest.mark.parametrize("system", ["typedq", "raw"])
def test_open_loop_run_reports_percentiles_late_sends_and_cpu(system: str) -> None:
    params = {"workload": "latency", "n": 300, "rate": 1500, "concurrency": 4}
    with redis_process() as server:
        out = _adapter_run(system, params, server.url)
    r = out["result"]
    assert (r["jobs"], r["offered_per_s"]) == (300, 1500)
    assert 0 <= r["late_sends"] <= 300
    assert 0 < r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"] <= r["max_ms"]
    # The worker runs in its own process: its CPU, Redis's and the producer's are all counted.
    for key in ("worker_cpu_ms_per_1k", "redis_cpu_ms_per_1k", "producer_cpu_ms_per_1k"):
        assert r[key] >= 0, key
    assert r["worker_cpu_ms_per_1k"] + r["redis_cpu_ms_per_1k"] > 0


def test_e2e_run_reports_cpu_per_job() -> None:
    params = {"workload": "e2e", "n": 400, "producers": 2, "concurrency": 4}
    with redis_process() as server:
        r = _adapter_run("raw", params, server.url)["result"]
    assert r["jobs_per_s"] > 0
    # 400 jobs cost the worker and Redis some CPU; a meter reading nothing would be broken.
    assert r["worker_cpu_ms_per_1k"] + r["redis_cpu_ms_per_1k"] > 0


def test_tree_cpu_counts_a_child_process() -> None:
    """A worker whose handlers run in a child process is charged for the child's CPU."""
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
        "\\ntime.sleep(30)'])\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.monotonic() + 20
        while common._tree_cpu(parent.pid) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert common._tree_cpu(parent.pid) >= 0.3
    finally:
        parent.kill()
        parent.wait()


def test_raw_floor_is_never_the_best_peer() -> None:
    cell = {"jobs_per_s": 100.0, "p50_ms": 1.0, "p95_ms": 2.0}
    data = {
        "systems": ["typedq", "arq", "raw"],
        "sizes": run.QUICK,
        "medians": {
            "e2e_c16": {
                "typedq": cell,
                "arq": {**cell, "jobs_per_s": 50.0},
                "raw": {**cell, "jobs_per_s": 400.0},
            }
        },
    }
    _header, rows = run.table_rows(data)
    jobs = next(row for row in rows if row[1] == "jobs/s")
    assert jobs[-2:] == ["arq 50", "2.00x"]
    assert jobs[4] == "400 (0.25x)"  # shown beside, with typedq's ratio to the floor


def test_latency_case_in_quick_and_full_sizes() -> None:
    for sizes in (run.QUICK, run.FULL):
        cases = {case: params for case, _w, params in run.cases(sizes, run.WORKLOADS)}
        assert cases["latency"] == {
            "workload": "latency",
            "n": sizes["latency"],
            "rate": sizes["latency_rate"],
            "concurrency": 16,
        }
