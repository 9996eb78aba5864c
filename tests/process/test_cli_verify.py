"""``typedq verify`` as a process against Redis and PostgreSQL (the embedded broker is
per process): an old release enqueues jobs and records its schemas; new releases are
verified. Exit 0 compatible, 1 incompatible, 2 could not check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.pg_harness import PgCluster
from tests.redis_harness import RedisProcess, flushall, free_port
from tests.verify_app import OrderV1, old, runs_old
from typedq.serde import codec_for

pytestmark = [pytest.mark.redis]

ROOT = Path(__file__).resolve().parents[2]
V1 = codec_for(OrderV1).fingerprint


def typedq_verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", "verify", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TYPEDQ_BROKER": "", "COLUMNS": "200"},
        check=False,
    )


def enqueue_old_jobs(url: str, n: int) -> None:
    async def fill() -> None:
        with old.using_broker(url):
            async with old:
                await old.tasks["place"].enqueue_many([OrderV1(i) for i in range(n)])

    anyio.run(fill)


def start_old_runs(url: str, n: int) -> None:
    async def start() -> None:
        with runs_old.using_broker(url):
            async with runs_old:
                for i in range(n):
                    await runs_old.durables["onboard"].start(OrderV1(i), run_id=f"r{i}")

    anyio.run(start)


@pytest.fixture
def url(redis_server: RedisProcess) -> str:
    flushall(redis_server.port)
    return redis_server.url


def test_a_compatible_release_exits_0_with_a_table(url: str) -> None:
    enqueue_old_jobs(url, 4)
    done = typedq_verify("tests.verify_app:compatible", "--broker", url)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if V1 in line]
    assert line.split()[:2] == ["place", V1]
    assert " 4 " in line
    assert "compatible" in line
    assert "counted 4 jobs, every one (exact counts, by the broker)" in done.stdout


def test_an_incompatible_release_exits_1_naming_the_field(url: str) -> None:
    enqueue_old_jobs(url, 2)
    done = typedq_verify("tests.verify_app:incompatible", "--broker", url, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["exit_code"] == 1
    (row,) = [r for r in report["rows"] if r["fingerprint"] == V1]
    assert row == {
        "task": "place",
        "fingerprint": V1,
        "jobs": 2,
        "verdict": "incompatible",
        "reason": "field `amount` became required",
        "source": "registry",
        "first_seen": row["first_seen"],
        "at_least": False,
    }
    assert row["first_seen"] > 0
    assert (report["exact"], report["capped"], report["scanned"]) == (True, False, 2)
    current = [r for r in report["rows"] if r["source"] == "current"]
    assert [r["verdict"] for r in current] == ["compatible"]


def test_jobs_are_counted_exactly_past_the_sample(url: str) -> None:
    """Redis counts the jobs itself: --sample bounds only the durable runs read."""
    enqueue_old_jobs(url, 30)
    done = typedq_verify("tests.verify_app:compatible", "--broker", url, "--sample", "10")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if V1 in line]
    assert " 30 " in line
    assert "at least" not in line
    assert "counted 30 jobs" in done.stdout
    assert "stopped at --sample" not in done.stdout


def test_a_capped_run_scan_says_at_least(url: str) -> None:
    start_old_runs(url, 5)
    done = typedq_verify("tests.verify_app:runs_compatible", "--broker", url, "--sample", "2")
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if V1 in line]
    assert line.split()[:2] == ["run:onboard", V1]
    assert "at least 2" in line
    assert "stopped at --sample 2" in done.stdout


def test_against_a_stale_stub_module(url: str) -> None:
    done = typedq_verify(
        "tests.verify_app:incompatible", "--broker", url, "--against", "tests/verify_stubs.py"
    )
    assert done.returncode == 1, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "stub" in line and V1 in line]
    assert "field `amount` became required" in line
    ok = typedq_verify(
        "tests.verify_app:compatible", "--broker", url, "--against", "tests.verify_stubs"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr


def test_forget_drops_a_schema_no_producer_runs(url: str) -> None:
    enqueue_old_jobs(url, 0)
    assert typedq_verify("tests.verify_app:incompatible", "--broker", url).returncode == 1
    done = typedq_verify(
        "tests.verify_app:incompatible", "--broker", url, "--forget", f"place:{V1}"
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_unreachable_broker_exits_2_in_one_line() -> None:
    done = typedq_verify(
        "tests.verify_app:compatible", "--broker", f"redis://127.0.0.1:{free_port()}/0"
    )
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("typedq: error:")]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr


def test_the_embedded_broker_cannot_be_verified() -> None:
    done = typedq_verify("tests.verify_app:compatible")
    assert done.returncode == 2
    assert "memory:// is this process's own embedded broker" in done.stderr


def test_running_durable_runs_are_verified(url: str) -> None:
    """Runs of the old release hold OrderV1 inputs: counted per fingerprint as
    ``run:onboard``, checked as jobs are."""
    start_old_runs(url, 3)
    done = typedq_verify("tests.verify_app:runs_compatible", "--broker", url)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if V1 in line]
    assert line.split()[:2] == ["run:onboard", V1]
    assert " 3 " in line
    assert "and 3 running durable runs" in done.stdout  # (the jobs read: their turns)
    done = typedq_verify("tests.verify_app:runs_incompatible", "--broker", url, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    (row,) = [r for r in report["rows"] if r["fingerprint"] == V1]
    assert (row["task"], row["jobs"], row["verdict"], row["reason"]) == (
        "run:onboard",
        3,
        "incompatible",
        "field `amount` became required",
    )
    assert report["runs"] == 3


@pytest.mark.postgres
def test_a_postgresql_broker_is_verified_with_exact_counts(pg_cluster: PgCluster) -> None:
    """On PostgreSQL too: the schema registry holds the old release's schema, and the
    broker counts the jobs per fingerprint itself (one statement per page)."""
    url = f"{pg_cluster.url}?schema=verify_cli"
    enqueue_old_jobs(url, 3)
    done = typedq_verify("tests.verify_app:compatible", "--broker", url)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if V1 in line]
    assert line.split()[:2] == ["place", V1]
    assert " 3 " in line
    assert "counted 3 jobs, every one (exact counts, by the broker)" in done.stdout
    done = typedq_verify("tests.verify_app:incompatible", "--broker", url, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    (row,) = [r for r in report["rows"] if r["fingerprint"] == V1]
    assert (row["jobs"], row["verdict"], row["source"]) == (3, "incompatible", "registry")
    assert (report["exact"], report["scanned"]) == (True, 3)
