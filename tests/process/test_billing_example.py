"""The example pair, run against each other: ``examples/billing`` (a worker process) and
``examples/webapp`` (a producer process that imports only ``stubs/billing.py``).

Across processes this needs Redis (the embedded broker lives in one process); the
in-process variant shares one MemoryBroker between the stub's Producer and the App.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.support import TEST_DEADLINE
from typedq.broker.base import BrokerSettings
from typedq.broker.memory import MemoryBroker

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = [
    {"cents": 1007, "invoice": 7, "receipt": "R-1-7"},
    {"declined": "insufficient_funds", "invoice": 8},
    {"deduplicated": True, "job": "refund.R-1-7.500", "refund": "R-1-7"},
]

# The producer process checks that it never imported the handlers or their dependencies.
PRODUCER = """
import sys
from examples.webapp.service import main
status = main(sys.argv[1:])
leaked = [m for m in ("examples.billing.tasks", "examples.billing.payments") if m in sys.modules]
if leaked:
    sys.exit(f"the producer imported {leaked}")
sys.exit(status)
"""


def _check(lines: list[dict[str, object]]) -> None:
    assert lines[:3] == EXPECTED
    statement = lines[3]
    assert str(statement["statement"]).startswith("s3://statements/2024-05/1-")
    assert statement["lines"] == 11


@pytest.mark.redis
def test_webapp_and_billing_worker_processes_on_redis(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    env = {**os.environ, "TYPEDQ_BROKER": redis_server.url}
    worker = subprocess.Popen(
        [sys.executable, "-m", "typedq", "worker", "examples.billing.tasks:app", "-c", "8"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert worker.stderr is not None
    try:
        producer = subprocess.run(
            [sys.executable, "-c", PRODUCER, "--broker", redis_server.url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TYPEDQ_BROKER": ""},
            check=False,
        )
        assert producer.returncode == 0, producer.stderr
        _check([json.loads(line) for line in producer.stdout.splitlines()])
    finally:
        worker.send_signal(signal.SIGTERM)
        with worker.stderr:
            log = worker.stderr.read()
        assert worker.wait(timeout=30) == 0, log
    # Same models on both sides: no fingerprint mismatch was logged.
    assert "differs from the worker's" not in log


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_webapp_against_billing_in_one_process() -> None:
    import stubs.billing as stub
    from examples.billing.tasks import app
    from examples.webapp import service

    broker = MemoryBroker(BrokerSettings(namespace="billing"))
    app.use_broker(broker)
    stub.app.use_broker(broker)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            # The producer connects first: see tests/redis/test_producer.py `running`.
            async with stub.app, app, app.worker(concurrency=4):
                lines = [
                    await service.checkout(1, 7),
                    await service.checkout(13, 8),
                    await service.refund_receipt("R-1-7", 500),
                    await service.statement(1, "2024-05"),
                ]
    finally:
        app.use_broker("memory://")
        stub.app.use_broker("memory://")
    _check(lines)
