"""Observability end to end: ``/metrics`` scraped from a real ``typedq worker`` process
after a mixed run, JSON log lines from one, failure logs (caplog) with the traceback and
the job's id, task and attempt, and the worker registry across processes (one of them
SIGKILLed)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import obs_app
from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, redis_process
from typedq import App, Backoff, JobFailed
from typedq.broker.base import JobMessage, WorkerInfo
from typedq.names import new_job_id


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    with redis_process(appendonly=True) as process:
        yield process


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape by (name, sorted labels)."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def _mixed_run(url: str) -> None:
    """6 completions of ok (one from a producer with another schema fingerprint), 3
    flaky jobs (a retry each, then completed), 2 broken (a retry each, then failed), and
    one broken job scheduled far ahead."""
    app = obs_app.app
    with app.using_broker(url):
        async with app:
            jobs = [await obs_app.ok.enqueue(obs_app.Item(n=i)) for i in range(5)]
            jobs += [await obs_app.flaky.enqueue(obs_app.Item(n=i)) for i in range(3)]
            failing = [await obs_app.broken.enqueue(obs_app.Item(n=i)) for i in range(2)]
            await obs_app.broken.enqueue(obs_app.Item(n=99), delay=3600)
            odd = JobMessage(
                id=new_job_id(),
                task="ok",
                queue="fast",
                payload=obs_app.ok.input.encode(obs_app.Item(n=7)),
                fingerprint="0123456789abcdef",
            )
            await app.broker.enqueue([odd])
            for job in jobs:
                await job.result(timeout=30)
            for job in failing:
                with pytest.raises(JobFailed):
                    await job.result(timeout=30)
            assert (await app.broker.wait_finished(odd.id, 30)) is not None


def _scrape(process: TypedqProcess) -> str:
    line = process.wait_for("serving metrics on")
    match = re.search(r":(\d+)/metrics", line)
    assert match is not None, line
    with urllib.request.urlopen(f"http://127.0.0.1:{match.group(1)}/metrics", timeout=30) as r:
        body: bytes = r.read()
    return body.decode()


@pytest.mark.redis
def test_metrics_of_a_worker_process_after_a_mixed_run(server: RedisProcess) -> None:
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", server.url, "--metrics-port", "0"
    )
    try:
        process.wait_for("started")
        anyio.run(_mixed_run, server.url)
        # A job's result is visible a moment before its worker has counted it: scrape
        # until all 16 attempts are counted (then check everything).
        deadline = time.monotonic() + 30
        while True:
            samples = _samples(_scrape(process))
            counted = sum(v for (name, _), v in samples.items() if name == "typedq_jobs_total")
            if counted >= 16 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        process.proc.send_signal(signal.SIGTERM)
        process.wait()
        process.close()

    expected = {
        ("ok", "fast"): {"completed": 6},
        ("flaky", "fast"): {"completed": 3, "retried": 3},
        ("broken", "slow"): {"failed": 2, "retried": 2},
    }
    for (task, queue), outcomes in expected.items():
        for outcome in ("completed", "failed", "retried", "cancelled", "released", "lease_lost"):
            got = _value(samples, "typedq_jobs_total", task=task, queue=queue, outcome=outcome)
            assert got == outcomes.get(outcome, 0), (task, outcome)
        attempts = sum(outcomes.values())
        count = _value(samples, "typedq_job_duration_seconds_count", task=task, queue=queue)
        assert count == attempts
        # Queue wait: one observation per attempt (a retry's from its due time).
        waits = _value(samples, "typedq_queue_wait_seconds_count", task=task, queue=queue)
        assert waits == attempts
        assert _value(samples, "typedq_queue_wait_seconds_sum", task=task, queue=queue) >= 0
        assert _value(samples, "typedq_lease_losses_total", task=task, queue=queue) == 0
    assert _value(samples, "typedq_schema_mismatches_total", task="ok", queue="fast") == 1
    assert _value(samples, "typedq_schema_mismatches_total", task="flaky", queue="fast") == 0
    # Read from the broker at scrape time.
    states = {"fast": {"completed": 9}, "slow": {"failed": 2, "scheduled": 1}}
    for queue, by_state in states.items():
        for state in ("waiting", "scheduled", "active", "completed", "failed", "cancelled"):
            got = _value(samples, "typedq_queue_jobs", queue=queue, state=state)
            assert got == by_state.get(state, 0), (queue, state)
        assert _value(samples, "typedq_queue_oldest_waiting_seconds", queue=queue) == 0
    assert _value(samples, "typedq_worker_in_flight") == 0
    assert _value(samples, "typedq_stalled_recovered_total") == 0
    assert not [k for k in samples if k[0] == "typedq_broker_errors_total"]


@pytest.mark.redis
def test_json_log_lines_parse_and_name_the_job(server: RedisProcess) -> None:
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", server.url, "--log-format", "json"
    )
    try:
        process.wait_for("started")

        async def run() -> str:
            app = obs_app.app
            with app.using_broker(server.url):
                async with app:
                    job = await obs_app.broken.enqueue(obs_app.Item(n=5))
                    with pytest.raises(JobFailed):
                        await job.result(timeout=30)
                    return job.id

        job_id = anyio.run(run)
        process.wait_for('"level": "ERROR"')
    finally:
        process.proc.send_signal(signal.SIGTERM)
        process.wait()
        process.close()
    lines = [line for line in process.lines if line]
    documents = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= d.keys() for d in documents)
    about = [d for d in documents if d.get("job_id") == job_id]
    retry = [d for d in about if d["level"] == "WARNING"]
    final = [d for d in about if d["level"] == "ERROR"]
    assert len(retry) == 1
    assert len(final) == 1
    assert retry[0]["attempt"] == 1
    assert final[0]["attempt"] == 2
    for document in retry + final:
        assert document["task"] == "broken"
        assert document["queue"] == "slow"
        assert "ValueError: broken 5" in document["message"]
    # The final failure carries the traceback; a retry is one line (its traceback: DEBUG).
    assert "Traceback (most recent call last)" in final[0]["message"]
    assert "Traceback" not in retry[0]["message"]


class Boom(msgspec.Struct, frozen=True):
    """Input of the in-process logging test."""

    n: int


@pytest.mark.anyio
async def test_failure_logs_carry_traceback_job_id_task_and_attempt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("obslog", broker="memory://")

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0))
    async def explode(item: Boom) -> None:
        raise KeyError(f"missing {item.n}")

    caplog.set_level(logging.DEBUG, logger="typedq")
    async with app, app.worker(concurrency=2):
        job = await explode.enqueue(Boom(n=3))
        with pytest.raises(JobFailed):
            await job.result(timeout=10)
    about = [r for r in caplog.records if getattr(r, "job_id", None) == job.id]
    retried = [r for r in about if r.levelno == logging.WARNING]
    final = [r for r in about if r.levelno == logging.ERROR]
    assert len(retried) == 1
    assert len(final) == 1
    for record, attempt in ((retried[0], 1), (final[0], 2)):
        message = record.getMessage()
        assert getattr(record, "task", None) == "explode"
        assert getattr(record, "attempt", None) == attempt
        assert getattr(record, "queue", None) == "default"
        assert f"job {job.id} (explode) attempt {attempt}" in message
        assert "KeyError: 'missing 3'" in message
    # A retry is one line (issue 29): task, job id, attempt, error, next delay ...
    assert retried[0].getMessage() == (
        f"job {job.id} (explode) attempt 1 failed; retry in 0s: error: KeyError: 'missing 3'"
    )
    # ... its traceback at DEBUG; the final failure carries the traceback itself.
    final_text = final[0].getMessage()
    assert "failed for good" in final_text
    assert "Traceback (most recent call last)" in final_text
    assert 'raise KeyError(f"missing {item.n}")' in final_text
    debug = [r.getMessage() for r in about if r.levelno == logging.DEBUG]
    (retry_trace,) = [m for m in debug if "traceback of the failure to retry" in m]
    assert retry_trace.startswith(f"job {job.id} (explode) attempt 1:")
    assert 'raise KeyError(f"missing {item.n}")' in retry_trace
    # Start and finish of each attempt at DEBUG, naming the job too.
    assert f"job {job.id} (explode) attempt 1 started" in debug
    assert any(m.startswith(f"job {job.id} (explode) attempt 2 finished: failed") for m in debug)


@pytest.mark.anyio
async def test_a_retry_is_one_warning_line_without_a_traceback_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``make demo`` must not look like a crash: at INFO, a retried attempt is one line."""
    app = App("obslog", broker="memory://")

    @app.task(retries=2, backoff=Backoff(kind="fixed", base=0))
    async def shaky(item: Boom) -> None:
        raise RuntimeError(f"down\nfor {item.n}")

    caplog.set_level(logging.INFO, logger="typedq")
    async with app, app.worker(concurrency=1):
        job = await shaky.enqueue(Boom(n=4))
        with pytest.raises(JobFailed):
            await job.result(timeout=10)
    about = [r for r in caplog.records if getattr(r, "job_id", None) == job.id]
    warnings = [r.getMessage() for r in about if r.levelno == logging.WARNING]
    assert warnings == [
        f"job {job.id} (shaky) attempt {n} failed; retry in 0s: error: RuntimeError: down for 4"
        for n in (1, 2)
    ]
    assert all(r.exc_info is None for r in about if r.levelno == logging.WARNING)
    (error,) = [r.getMessage() for r in about if r.levelno == logging.ERROR]
    assert "attempt 3 failed for good" in error
    assert "Traceback (most recent call last)" in error


def _workers(url: str) -> list[WorkerInfo]:
    async def run() -> list[WorkerInfo]:
        app = App("obs", broker=url)
        async with app:
            return await app.broker.list_workers()

    return anyio.run(run)


def _until(condition: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not callable(check) or not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        time.sleep(0.1)


@pytest.mark.redis
def test_registry_lists_two_worker_processes_and_drops_a_killed_one(
    server: RedisProcess,
) -> None:
    args = ("worker", "tests.obs_app:app", "--broker", server.url, "--heartbeat", "0.3")
    first = TypedqProcess(*args)
    second = TypedqProcess(*args, "--concurrency", "3")
    try:
        first.wait_for("started")
        second.wait_for("started")
        pids = {first.proc.pid, second.proc.pid}
        _until("two workers", lambda: {w.pid for w in _workers(server.url)} == pids)
        workers = _workers(server.url)
        assert sorted(w.concurrency for w in workers) == [3, 16]
        for worker in workers:
            assert worker.queues == ["fast", "slow"]
            assert worker.host
            assert worker.started_at > 0
            assert worker.version
        listed = subprocess.run(
            [
                sys.executable,
                "-m",
                "typedq",
                "inspect",
                "--app",
                "obs",
                "--broker",
                server.url,
                "--workers",
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "TYPEDQ_BROKER": ""},
        )
        assert listed.returncode == 0, listed.stderr
        assert {w["pid"] for w in json.loads(listed.stdout)} == pids
        second.proc.send_signal(signal.SIGKILL)
        second.wait()
        _until(
            "the killed worker to age out",
            lambda: {w.pid for w in _workers(server.url)} == {first.proc.pid},
        )
        # A clean shutdown leaves the registry at once.
        first.proc.send_signal(signal.SIGTERM)
        assert first.wait() == 0
        assert _workers(server.url) == []
    finally:
        first.close()
        second.close()


_ANY = "0.0.0.0"  # noqa: S104 - what the test asks for, on a free port, for a moment


def _listening_on(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at ``port`` (Linux: /proc/net/tcp)."""
    found = set()
    with open("/proc/net/tcp") as f:
        for line in list(f)[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
@pytest.mark.parametrize(("args", "host"), [((), "127.0.0.1"), (("--metrics-host", _ANY), _ANY)])
def test_the_metrics_server_listens_on_loopback_unless_told(
    args: tuple[str, ...], host: str
) -> None:
    # Issue 24 defect 9: it listened on every interface by default.
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", "memory://", "--metrics-port", "0", *args
    )
    try:
        line = process.wait_for("serving metrics on")
        match = re.search(r"http://([\d.]+):(\d+)/metrics", line)
        assert match is not None, line
        assert match.group(1) == host
        assert _listening_on(int(match.group(2))) == {host}
    finally:
        process.proc.send_signal(signal.SIGTERM)
        process.wait()
        process.close()


@pytest.mark.redis
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads /proc/net/tcp")
@pytest.mark.parametrize(("args", "host"), [((), "127.0.0.1"), (("--metrics-host", _ANY), _ANY)])
def test_the_group_metrics_server_listens_on_loopback_unless_told(
    redis_url: str, args: tuple[str, ...], host: str
) -> None:
    process = TypedqProcess(
        "worker",
        "tests.obs_app:app",
        "--broker",
        redis_url,
        "--processes",
        "2",
        "--metrics-port",
        "0",
        *args,
    )
    try:
        line = process.wait_for("serving the metrics of 2 worker processes")
        match = re.search(r"http://([\d.]+):(\d+)/metrics", line)
        assert match is not None, line
        assert _listening_on(int(match.group(2))) == {host}
    finally:
        process.proc.send_signal(signal.SIGTERM)
        process.wait()
        process.close()
