"""The ``typedq`` command line, run as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _typedq(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TYPEDQ_BROKER": ""},
        check=False,
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("examples.quickstart:nope", "has no attribute 'nope'"),
        ("examples.quickstart", "expected MODULE:APP"),
        ("examples.quickstart:SendInvoice", "not a typedq.App"),
    ],
)
def test_worker_bad_target_is_one_clear_line(target: str, message: str) -> None:
    result = _typedq("worker", target)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_the_worker_command() -> None:
    result = _typedq("--help")
    assert result.returncode == 0
    assert "worker" in result.stdout


def test_sigterm_shuts_an_idle_worker_down_gracefully() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "typedq", "worker", "examples.quickstart:app", "-c", "4"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TYPEDQ_BROKER": ""},
    )
    assert proc.stderr is not None
    # Wait for the "started" log line instead of sleeping a guessed time.
    deadline = time.monotonic() + 20
    seen = ""
    while "started" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    assert "started" in seen, seen
    proc.send_signal(signal.SIGTERM)
    with proc.stderr:
        rest = proc.stderr.read()
    assert proc.wait(timeout=20) == 0
    assert "SIGTERM: shutting down gracefully" in rest
    assert "stopped" in rest
