"""examples/workflows.py runs end to end, unchanged, on the embedded broker and on Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.redis_harness import RedisProcess, flushall

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = [
    "Stored(doc_id='doc-5', words=5)",
    "5 thumbs, first img0-64.png",
    "Album(urls=['img0-64.png', 'img1-64.png', 'img2-64.png', 'img3-64.png', 'img4-64.png'])",
    "flow failed: cannot resize scan.bmp",
    "Album(urls=['img0-64.png', 'img1-64.png', '(failed)'])",
]


def run_example(broker: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "examples/workflows.py"],
        cwd=ROOT,
        env={**os.environ, "TYPEDQ_BROKER": broker, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_workflows_example_on_the_embedded_broker() -> None:
    result = run_example("")
    assert result.returncode == 0, result.stderr
    for line in EXPECTED:
        assert line in result.stdout


@pytest.mark.redis
def test_workflows_example_on_redis_unchanged(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    result = run_example(redis_server.url)
    assert result.returncode == 0, result.stderr
    for line in EXPECTED:
        assert line in result.stdout
