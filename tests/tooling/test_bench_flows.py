"""The bench's workflow workloads (bench/: `chain`, `fanin`): the driver's bookkeeping, the
table, and a tiny run of typedq's adapter on both brokers. Nothing here asserts a timing:
the numbers are the benchmark's business (bench/run.py), these tests check that it counts
right and completes."""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import run
from bench.adapters import common
from tests.redis_harness import redis_process

ROOT = Path(__file__).resolve().parents[2]


def _recorder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int) -> common.FlowRecorder:
    monkeypatch.setenv("BENCH_N", str(n))
    monkeypatch.setenv("BENCH_OUT", str(tmp_path / "result.json"))
    monkeypatch.delenv("BENCH_NOTIFY", raising=False)
    recorder = common.FlowRecorder()
    monkeypatch.setattr(common, "FLOWS", recorder)
    return recorder


def test_chain_links_count_tasks_and_the_last_link_ends_the_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _recorder(tmp_path, monkeypatch, n=2)
    enqueued = [100.0, 200.0]
    for t in enqueued:
        for k in range(3):
            common.link_done(k, 3, t)
    summary = json.loads((tmp_path / "result.json").read_text())
    assert (summary["count"], summary["tasks"]) == (2, 6)
    # Latency is the last link's finish minus that chain's enqueue time: one per chain.
    assert len(recorder.latencies) == 2
    assert recorder.latencies[1] == pytest.approx(summary["last"] - enqueued[1])
    assert summary["p95"] == max(recorder.latencies)


def test_fanin_latency_runs_from_the_last_member_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = _recorder(tmp_path, monkeypatch, n=1)
    finishes = [common.member_finished() for _ in range(4)]
    started = finishes[-1] + 0.25
    common.callback_started(finishes[0] - 1.0, [finishes[2], finishes[-1], finishes[0]], started)
    summary = json.loads((tmp_path / "result.json").read_text())
    assert (summary["count"], summary["tasks"]) == (1, 5)
    assert recorder.latencies == [pytest.approx(0.25)]
    assert recorder.totals == [pytest.approx(started - (finishes[0] - 1.0))]
    assert summary["total_p50"] == pytest.approx(recorder.totals[0])


def test_finished_flows_reach_the_driver_over_udp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(10)
        monkeypatch.setenv("BENCH_NOTIFY", "{}:{}".format(*sock.getsockname()))
        monkeypatch.setenv("BENCH_N", "2")
        monkeypatch.setenv("BENCH_OUT", str(tmp_path / "result.json"))
        recorder = common.FlowRecorder()
        try:
            recorder.flow(1.0, 0.1)
            recorder.flow(2.0, 0.1)
        finally:
            recorder.close()
        assert [sock.recv(64), sock.recv(64)] == [b"1", b"2"]


def test_the_window_frees_one_slot_per_finished_flow_despite_lost_datagrams() -> None:
    async def freed() -> int:
        slots = asyncio.Semaphore(0)
        feedback = common._FlowFeedback(slots)
        feedback.datagram_received(b"3", None)
        feedback.datagram_received(b"2", None)  # late, older count: frees nothing more
        feedback.datagram_received(b"5", None)  # "4" was lost: still 5 in all
        feedback.datagram_received(b"junk", None)
        count = 0
        while not slots.locked():
            await slots.acquire()
            count += 1
        return count

    assert asyncio.run(freed()) == 5


def _data(medians: dict[str, Any], systems: list[str]) -> dict[str, Any]:
    sizes = dict(run.FULL)
    return {"systems": systems, "medians": medians, "sizes": sizes}


def test_the_table_says_n_a_for_a_system_without_a_native_workflow_api() -> None:
    medians = {
        "fanin": {
            "typedq": {"tasks_per_s": 6000.0, "p50_ms": 4.0, "p95_ms": 9.0},
            "bullmq": {"tasks_per_s": 1500.0, "p50_ms": 8.0, "p95_ms": 16.0},
            "arq": {"reps": 0, "errors": [], "unsupported": "n/a: no workflow API"},
        }
    }
    header, rows = run.table_rows(_data(medians, ["typedq", "bullmq", "arq"]))
    assert header[-2:] == ["best peer", "typedq vs best"]
    by_metric = {row[1]: row for row in rows}
    assert set(by_metric) == {"tasks/s", "callback p50 ms", "callback p95 ms"}
    tasks = by_metric["tasks/s"]
    assert tasks[0].startswith("fan-in (2,000 fan-outs of 10")
    assert tasks[2:] == ["6,000", "1,500 (4.00x)", "n/a", "bullmq 1,500", "4.00x"]
    assert by_metric["callback p50 ms"][-1] == "2.00x"


def test_quick_sizes_include_the_workflow_workloads() -> None:
    cases = {case: params for case, _w, params in run.cases(run.QUICK, run.WORKLOADS)}
    assert cases["chain"]["n"] == run.QUICK["chain"] < run.FULL["chain"]
    assert cases["fanin"]["size"] == run.QUICK["flow_size"]
    assert cases["fanin"]["concurrency"] == run.QUICK["flow_concurrency"]


def adapter_run(
    params: dict[str, Any], env: dict[str, str], system: str = "typedq"
) -> dict[str, Any]:
    """``python -m bench.adapters.SYSTEM PARAMS``, as bench/run.py starts it; its JSON line."""
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.adapters.{system}", json.dumps(params)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(lines[-1])
    return out


def _flow_params(workload: str) -> dict[str, Any]:
    return {
        "workload": workload,
        "n": 6,
        "size": 4,
        "concurrency": 4,
        "producers": 2,
        "window": 3,
    }


def _check(out: dict[str, Any], workload: str) -> None:
    assert "error" not in out, out.get("error")
    result = out["result"]
    per_flow = 4 if workload == "chain" else 5  # 4 links; 4 members + the callback
    assert result["tasks"] == result["tasks_counted"] == 6 * per_flow
    assert result["tasks_per_s"] > 0
    assert not math.isnan(result["p50_ms"])
    assert out["flow_api"].startswith(("link.then", "await member.map"))


@pytest.mark.parametrize("workload", ["chain", "fanin"])
def test_typedq_flow_workloads_complete_on_the_embedded_broker(workload: str) -> None:
    out = adapter_run(_flow_params(workload), {"BENCH_TYPEDQ_BROKER": "memory://"})
    _check(out, workload)
    assert out["system"] == "typedq-memory"


@pytest.mark.redis
@pytest.mark.parametrize("workload", ["chain", "fanin"])
def test_typedq_flow_workloads_complete_on_redis_with_a_worker_process(workload: str) -> None:
    with redis_process() as server:
        env = {"BENCH_REDIS_URL": server.url, "BENCH_TYPEDQ_BROKER": ""}
        out = adapter_run(_flow_params(workload), env)
    _check(out, workload)
    assert out["system"] == "typedq"


def test_a_peer_without_a_workflow_api_reports_n_a_without_running() -> None:
    class NoFlows:
        name = "none"
        version = "0"
        bulk_api = ""
        notes = ""

        def __init__(self) -> None:
            self.flow_api = {"chain": "n/a: no workflow API here"}

    out = common.flow_api(NoFlows(), "chain")  # type: ignore[arg-type]
    assert out == "n/a: no workflow API here"
    assert common.flow_api(NoFlows(), "fanin").startswith("n/a")  # type: ignore[arg-type]
