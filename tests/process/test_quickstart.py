"""The quickstart runs end to end, unchanged, on the embedded broker and on Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_harness import RedisProcess, flushall

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = [
    "-> Receipt(receipt_id='R-7', total_cents=1007)",
    "all 10,000 done",
    "succeeded on attempt 3",
    "failed with reason=domain_error: CardDeclined(customer_id=13",
    "cancelled while running (attempt 1) -> status cancelled",
    "done: the worker shut down gracefully",
]


def run_quickstart(broker: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        cwd=ROOT,
        env={**os.environ, "TYPEDQ_BROKER": broker},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_quickstart_on_the_embedded_broker() -> None:
    result = run_quickstart("")
    assert result.returncode == 0, result.stderr
    for line in EXPECTED:
        assert line in result.stdout
    # Its worker runs in its process: no warning about the embedded broker (issue 29).
    assert "memory://" not in result.stderr
    # A retried attempt is one line, not a traceback (issue 29): only the final failure
    # of the declined card carries one.
    assert result.stderr.count("Traceback (most recent call last)") <= 1, result.stderr


@pytest.mark.redis
def test_quickstart_on_redis_unchanged(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    result = run_quickstart(redis_server.url)
    assert result.returncode == 0, result.stderr
    for line in EXPECTED:
        assert line in result.stdout
