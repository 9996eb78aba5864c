"""``typedq worker --processes N``: real supervisor and worker processes on a real Redis.

The group's ``/metrics`` adds up the children's series after a mixed run; a SIGKILLed
child is restarted (and its jobs still finish); SIGTERM shuts every child down
gracefully; a child's usage error stops the group instead of a restart loop; a
supervisor killed with SIGKILL takes its children down with it.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests import obs_app
from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, _command, redis_process
from typedq import JobFailed
from typedq.supervisor import merge_expositions

pytestmark = pytest.mark.slow

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(text: str) -> Samples:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def _child_pids(process: TypedqProcess, count: int) -> list[int]:
    """The pids of the first ``count`` 'worker process N started (pid P)' lines."""
    deadline = time.monotonic() + 30
    while True:
        pids = [
            int(p) for p in re.findall(r"worker process \d+ started \(pid (\d+)\)", process.text)
        ]
        if len(pids) >= count:
            return pids
        assert time.monotonic() < deadline, process.text
        time.sleep(0.05)


def _wait_ready(process: TypedqProcess, children: int) -> None:
    """Until ``children`` worker processes have logged that they started their worker."""
    deadline = time.monotonic() + 30
    while len(re.findall(r"worker \S+ started:", process.text)) < children:
        assert time.monotonic() < deadline, process.text
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


async def _run_jobs(url: str, count: int) -> None:
    app = obs_app.app
    with app.using_broker(url):
        async with app:
            jobs = await obs_app.ok.enqueue_many(obs_app.Item(n=i) for i in range(count))
            for job in jobs:
                assert (await job.result(timeout=30)).n >= 0


async def _mixed_run(url: str) -> None:
    """5 completions, 3 flaky jobs (one retry each), 2 broken ones (failed)."""
    app = obs_app.app
    with app.using_broker(url):
        async with app:
            jobs = [await obs_app.ok.enqueue(obs_app.Item(n=i)) for i in range(5)]
            jobs += [await obs_app.flaky.enqueue(obs_app.Item(n=i)) for i in range(3)]
            failing = [await obs_app.broken.enqueue(obs_app.Item(n=i)) for i in range(2)]
            for job in jobs:
                await job.result(timeout=30)
            for job in failing:
                with pytest.raises(JobFailed):
                    await job.result(timeout=30)


@pytest.mark.redis
def test_group_metrics_add_up_the_children_after_a_mixed_run(redis_url: str) -> None:
    process = TypedqProcess(
        "worker",
        "tests.obs_app:app",
        "--broker",
        redis_url,
        "--processes",
        "2",
        "--metrics-port",
        "0",
    )
    try:
        line = process.wait_for("serving the metrics of 2 worker processes")
        port = re.search(r":(\d+)/metrics", line)
        assert port is not None, line
        _wait_ready(process, 2)
        anyio.run(_mixed_run, redis_url)
        deadline = time.monotonic() + 30
        while True:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port.group(1)}/metrics", timeout=30
            ) as reply:
                samples = _samples(reply.read().decode())
            counted = sum(v for (name, _), v in samples.items() if name == "typedq_jobs_total")
            if (counted >= 15 and samples.get(("typedq_worker_processes", ())) == 2) or (
                time.monotonic() > deadline
            ):
                break
            time.sleep(0.05)
    finally:
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.text
        process.close()

    assert _value(samples, "typedq_worker_processes") == 2
    assert _value(samples, "typedq_worker_restarts_total") == 0
    expected = {
        ("ok", "fast"): {"completed": 5},
        ("flaky", "fast"): {"completed": 3, "retried": 3},
        ("broken", "slow"): {"failed": 2, "retried": 2},
    }
    for (task, queue), outcomes in expected.items():
        for outcome in ("completed", "failed", "retried", "cancelled", "lease_lost"):
            got = _value(samples, "typedq_jobs_total", task=task, queue=queue, outcome=outcome)
            assert got == outcomes.get(outcome, 0), (task, outcome)
        count = _value(samples, "typedq_job_duration_seconds_count", task=task, queue=queue)
        assert count == sum(outcomes.values())
    # Read from the broker by each child: reported once, not doubled.
    assert _value(samples, "typedq_queue_jobs", queue="fast", state="completed") == 8
    assert _value(samples, "typedq_queue_jobs", queue="slow", state="failed") == 2
    assert _value(samples, "typedq_worker_in_flight") == 0
    assert not [name for name, _ in samples if name.startswith("process_")]


@pytest.mark.redis
def test_a_killed_child_is_restarted_and_the_group_keeps_working(redis_url: str) -> None:
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", redis_url, "--processes", "2"
    )
    try:
        first, second = _child_pids(process, 2)
        _wait_ready(process, 2)
        os.kill(first, signal.SIGKILL)
        process.wait_for("was killed by SIGKILL")
        pids = _child_pids(process, 3)
        assert pids[2] not in (first, second)
        assert _alive(pids[2])
        assert _alive(second)
        _wait_ready(process, 3)
        anyio.run(_run_jobs, redis_url, 200)
    finally:
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.text
        process.close()
    assert "restarting it in 0.5s (restart 1" in process.text


@pytest.mark.redis
def test_a_child_restarted_during_an_outage_waits_and_the_group_survives() -> None:
    # Issue 24 defect 5: the child restarted while Redis was down exited 2 (read as a user
    # mistake), and the supervisor took the healthy child and itself down with it.
    server = RedisProcess(appendonly=True)
    server.start()
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", server.url, "--processes", "2"
    )
    try:
        first, second = _child_pids(process, 2)
        _wait_ready(process, 2)
        server.kill()
        os.kill(first, signal.SIGKILL)
        process.wait_for("was killed by SIGKILL")
        third = _child_pids(process, 3)[2]
        line = process.wait_for("waiting for the broker")
        assert f"127.0.0.1:{server.port}" in line
        # The outage goes on for two tries of the restarted child (its connect backoff
        # starts at 0.5 s); nobody gives up. Redis is back before its third, at 1.5 s.
        time.sleep(1)
        assert process.proc.poll() is None, process.text
        assert _alive(second), process.text
        assert _alive(third), process.text
        server.start()
        process.wait_for("reached the broker", timeout=60)
        anyio.run(_run_jobs, server.url, 20)
        assert process.proc.poll() is None, process.text
        assert _alive(second), process.text
        assert _alive(third), process.text
    finally:
        process.proc.send_signal(signal.SIGTERM)
        code = process.wait()
        process.close()
        server.stop()
    assert code == 0, process.text
    assert "stopping every worker process" not in process.text
    assert "Traceback" not in process.text


@pytest.mark.redis
def test_sigterm_stops_every_child_gracefully(redis_url: str) -> None:
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", redis_url, "--processes", "2"
    )
    try:
        pids = _child_pids(process, 2)
        _wait_ready(process, 2)
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0, process.text
    finally:
        process.close()
    assert "SIGTERM: passing it on to 2 worker processes" in process.text
    assert process.text.count("shutting down gracefully") == 2
    assert "restarting" not in process.text
    assert not [pid for pid in pids if _alive(pid)]


@pytest.mark.redis
def test_a_childs_usage_error_stops_the_group_without_a_restart_loop() -> None:
    # Credentials Redis refuses: each child says so in one line and exits with 2.
    with redis_process(extra=("--user", "app", "on", ">right", "~*", "&*", "+@all")) as locked:
        url = f"redis://app:wrong@127.0.0.1:{locked.port}/0"
        process = TypedqProcess("worker", "tests.obs_app:app", "--broker", url, "--processes", "2")
        try:
            assert process.wait() == 2
        finally:
            process.close()
    assert "refused the credentials" in process.text
    assert "stopping every worker process instead of restarting" in process.text
    assert len(re.findall(r"worker process \d+ started", process.text)) == 2
    assert "Traceback" not in process.text


@pytest.mark.redis
def test_a_restarted_childs_status_2_does_not_stop_the_healthy_ones() -> None:
    # The command worked in that slot before: what changed is outside (here the password
    # was rotated), so the slot is restarted with backoff and the running child goes on.
    with redis_process(extra=("--user", "app", "on", ">right", "~*", "&*", "+@all")) as locked:
        url = f"redis://app:right@127.0.0.1:{locked.port}/0"
        process = TypedqProcess("worker", "tests.obs_app:app", "--broker", url, "--processes", "2")
        try:
            first, second = _child_pids(process, 2)
            _wait_ready(process, 2)
            assert _command(locked.port, "ACL", "SETUSER", "app", "resetpass", ">new") == b"+OK\r\n"
            os.kill(first, signal.SIGKILL)
            process.wait_for("refused the credentials")
            # The supervisor's decision is in this line: restart the slot (not stop all).
            line = process.wait_for("exited with status 2")
            assert "restarting it in" in line, process.text
            assert process.proc.poll() is None, process.text
            assert _alive(second), process.text
        finally:
            process.proc.send_signal(signal.SIGTERM)
            process.wait()
            process.close()
    assert "stopping every worker process" not in process.text
    assert "Traceback" not in process.text


def test_children_that_give_up_on_the_broker_are_restarted_until_it_answers() -> None:
    # --wait-for-broker bounds each child's wait: it exits 75 (transient) and the
    # supervisor restarts it with backoff, instead of stopping the group as for a mistake.
    server = RedisProcess(appendonly=True)
    process = TypedqProcess(
        "worker",
        "tests.obs_app:app",
        "--broker",
        server.url,
        "--processes",
        "2",
        "--wait-for-broker",
        "0.3",
    )
    try:
        process.wait_for("gave up waiting for the broker (status 75)")
        _child_pids(process, 3)  # one restarted at least
        assert process.proc.poll() is None, process.text
        server.start()
        _wait_ready(process, 2)
        anyio.run(_run_jobs, server.url, 20)
        assert process.proc.poll() is None, process.text
    finally:
        process.proc.send_signal(signal.SIGTERM)
        code = process.wait()
        process.close()
        server.stop()
    assert code in (0, 130), process.text  # 130: a child was waiting when SIGTERM came
    assert "stopping every worker process" not in process.text
    assert "Traceback" not in process.text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "2"], "--processes needs a broker the processes share"),
        (["--broker", "redis://127.0.0.1:1/0", "--processes", "0"], "--processes must be >= 1"),
    ],
)
def test_bad_processes_options_are_one_line(args: list[str], message: str) -> None:
    process = TypedqProcess("worker", "tests.obs_app:app", *args)
    try:
        assert process.wait() == 2
    finally:
        process.close()
    errors = [line for line in process.lines if line.startswith("typedq: error:")]
    assert len(errors) == 1, process.text
    assert message in errors[0]
    assert "Traceback" not in process.text


@pytest.mark.redis
def test_children_stop_when_the_supervisor_is_killed(redis_url: str) -> None:
    process = TypedqProcess(
        "worker", "tests.obs_app:app", "--broker", redis_url, "--processes", "2"
    )
    try:
        pids = _child_pids(process, 2)
        _wait_ready(process, 2)
        process.proc.send_signal(signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 30
        while [pid for pid in pids if _alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)]
        assert process.text.count("shutting down gracefully") == 2
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        process.close()


def test_merge_sums_series_and_takes_shared_gauges_once() -> None:
    child = """\
# HELP typedq_jobs_total Attempts by outcome
# TYPE typedq_jobs_total counter
typedq_jobs_total{outcome="completed",queue="q",task="t"} %d
# HELP typedq_queue_jobs Jobs per state
# TYPE typedq_queue_jobs gauge
typedq_queue_jobs{queue="q",state="waiting"} 7
# HELP typedq_worker_in_flight Jobs held now
# TYPE typedq_worker_in_flight gauge
typedq_worker_in_flight %d
# HELP process_cpu_seconds_total CPU
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 1.5
"""
    families = {f.name: f for f in merge_expositions([child % (3, 1), child % (4, 2)])}
    assert "process_cpu_seconds" not in families
    assert "process_cpu_seconds_total" not in families
    jobs = [s for s in families["typedq_jobs"].samples if s.name == "typedq_jobs_total"]
    assert [(s.labels, s.value) for s in jobs] == [
        ({"outcome": "completed", "queue": "q", "task": "t"}, 7.0)
    ]
    (waiting,) = families["typedq_queue_jobs"].samples
    assert waiting.value == 7.0
    (in_flight,) = families["typedq_worker_in_flight"].samples
    assert in_flight.value == 3.0
