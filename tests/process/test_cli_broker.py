"""``typedq worker`` meeting its broker: unreachable at start, waiting for it, TLS to a
plain Redis, an outage during the run, the embedded broker by default, and the Redis
configuration warnings (once per process)."""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator

import pytest

from tests.cli_process import TypedqProcess
from tests.redis_harness import RedisProcess, free_port, redis_process
from typedq import App

pytestmark = [pytest.mark.redis]


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    with redis_process(appendonly=True) as process:
        yield process


def test_unreachable_broker_without_waiting_is_one_line_and_exit_75() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    process = TypedqProcess(
        "worker", "examples.quickstart:app", "--broker", url, "--wait-for-broker", "0"
    )
    try:
        # Transient, not a user mistake (2): a supervisor or systemd restarts it.
        assert process.wait() == 75
        errors = [line for line in process.lines if line.startswith("typedq: error:")]
        assert len(errors) == 1, process.text
        (error,) = errors
        assert "cannot reach the broker redis://:***@127.0.0.1:" in error
        assert "leave out --wait-for-broker 0" in error
        assert "hunter2" not in process.text
        assert "Traceback" not in process.text
    finally:
        process.close()


def test_wait_for_broker_logs_the_wait_once_then_gives_up() -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    process = TypedqProcess(
        "worker", "examples.quickstart:app", "--broker", url, "--wait-for-broker", "1"
    )
    try:
        assert process.wait() == 75
        line = process.wait_for("waiting for the broker at 127.0.0.1:")
        assert "for up to 1s (--wait-for-broker)" in line
        error = process.wait_for("typedq: error:")
        assert "gave up after" in error
        # Several tries, one line for the wait (its reason never changed), one to give up.
        assert "tries in" in error
        assert "gave up after 1 tries" not in error
        assert process.text.count("waiting for the broker") == 1, process.text
        assert "hunter2" not in process.text
        assert "Traceback" not in process.text
    finally:
        process.close()


def test_a_worker_waits_for_the_broker_by_default_and_starts_once_it_answers() -> None:
    server = RedisProcess(appendonly=True)
    process = TypedqProcess("worker", "examples.quickstart:app", "--broker", server.url)
    try:
        line = process.wait_for("waiting for the broker")
        assert f"127.0.0.1:{server.port}" in line
        assert "for as long as it takes" in line
        # Two tries (the backoff starts at 0.5 s), no new line, no exit; Redis is back
        # before the third, at 1.5 s.
        time.sleep(1)
        assert process.proc.poll() is None
        server.start()
        process.wait_for("reached the broker")
        process.wait_for("started")
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0
        assert process.text.count("waiting for the broker") == 1, process.text
    finally:
        process.close()
        server.stop()


def test_credentials_the_broker_refuses_are_a_user_mistake() -> None:
    with redis_process(extra=("--user", "app", "on", ">right", "~*", "&*", "+@all")) as locked:
        url = f"redis://app:wrong@127.0.0.1:{locked.port}/0"
        process = TypedqProcess("worker", "examples.quickstart:app", "--broker", url)
        try:
            assert process.wait() == 2
        finally:
            process.close()
    errors = [line for line in process.lines if line.startswith("typedq: error:")]
    assert len(errors) == 1, process.text
    assert "refused the credentials" in errors[0]
    assert "waiting for the broker" not in process.text
    assert "app:wrong@" not in process.text


@pytest.mark.slow
def test_worker_logs_reconnected_after_an_outage(server: RedisProcess) -> None:
    """An outage is told once when it begins and once when it ends (issue 29): its
    retries are DEBUG lines."""
    process = TypedqProcess(
        "worker", "examples.quickstart:app", "--broker", server.url, "--log-level", "DEBUG"
    )
    try:
        process.wait_for("started")
        server.kill()
        # Several retries (another process's log: polled) before Redis comes back.
        deadline = time.monotonic() + 60
        while process.text.count("claim failed") < 3:
            assert time.monotonic() < deadline, process.text
            time.sleep(0.05)
        server.start()
        line = process.wait_for("reconnected", timeout=60)
        assert "the broker answers again" in line
        assert "WARNING" in line
        warned = [ln for ln in process.lines if "WARNING typedq.worker" in ln]
        assert len([ln for ln in warned if "claim failed" in ln]) == 1, process.text
        assert len([ln for ln in warned if "lease renewal failed" in ln]) <= 1, process.text
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0
    finally:
        process.close()


def test_rediss_to_a_plain_redis_says_tls_handshake_failed(server: RedisProcess) -> None:
    # A plain Redis stays silent during the TLS handshake, so the connect times out (and is
    # retried) before the worker tells why: a short connect timeout (a redis-py option in
    # the URL's query overrides typedq's 2 s) keeps that wait under a second.
    url = f"rediss://127.0.0.1:{server.port}/0?socket_connect_timeout=0.2"
    process = TypedqProcess("worker", "examples.quickstart:app", "--broker", url)
    try:
        assert process.wait(timeout=60) == 2
        error = process.wait_for("typedq: error:")
        assert "TLS handshake with Redis at 127.0.0.1:" in error
        assert "plain text" in error
        assert "Timeout" not in error
    finally:
        process.close()


@pytest.mark.parametrize(
    ("args", "env", "warned"),
    [
        ((), {}, True),
        (("--broker", "memory://"), {}, False),
        ((), {"TYPEDQ_BROKER": "memory://"}, False),
    ],
    ids=["default", "explicit-flag", "explicit-env"],
)
def test_worker_on_the_default_memory_broker_warns(
    args: tuple[str, ...], env: dict[str, str], warned: bool
) -> None:
    process = TypedqProcess("worker", "examples.quickstart:app", *args, env=env)
    try:
        process.wait_for("started")
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0
        text = process.text
        assert ("no other process can enqueue jobs" in text) is warned, text
        if warned:
            assert "--broker redis://HOST:PORT/DB or set TYPEDQ_BROKER" in text
    finally:
        process.close()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_persistence_warning_once_per_process(
    caplog: pytest.LogCaptureFixture, anyio_backend: str
) -> None:
    with redis_process() as plain:  # appendonly no, no snapshot: no persistence
        app = App("once")
        app.use_broker(plain.url)
        with caplog.at_level(logging.WARNING, logger="typedq.broker.redis"):
            for _ in range(3):
                async with app:
                    pass
        warnings = [r for r in caplog.records if "runs without persistence" in r.getMessage()]
        assert len(warnings) == 1
