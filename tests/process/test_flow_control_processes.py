"""Debounce across producer processes on Redis (typedq.flowcontrol): two processes
enqueue edits of one document at once; every enqueue lands on one job, which runs once
with the last edit Redis saw."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest
import redis

from tests.flow_control_app import Edit, app, render
from tests.redis_harness import RedisProcess
from tests.support import ROOT

pytestmark = [pytest.mark.anyio, pytest.mark.redis, pytest.mark.slow, pytest.mark.asyncio_only]

BARRIER_DB = 14


@pytest.fixture
def url(redis_url: str) -> Iterator[str]:
    """conftest's ``redis_url``, and after the test the module's app back on the embedded
    broker (the test points it at Redis)."""
    yield redis_url
    app.use_broker("memory://")


def producer(url: str, barrier: str, name: str, n: int) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "tests.flow_control_app", url, barrier, name, str(n)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TYPEDQ_BROKER", None)
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE)


async def test_debounce_collapses_enqueues_of_two_producer_processes(
    url: str, redis_server: RedisProcess
) -> None:
    barrier = f"redis://127.0.0.1:{redis_server.port}/{BARRIER_DB}"
    procs = [producer(url, barrier, name, 40) for name in ("a", "b")]
    lines: list[str] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        lines += out.decode().split()
    ids, created = lines[0::2], lines[1::2]
    assert len(ids) == 80
    assert len(set(ids)) == 1  # one job for all 80 enqueues
    assert created.count("1") == 1
    (job_id,) = set(ids)
    app.use_broker(url)
    async with app:
        (record,) = await app.broker.get([job_id])
        assert record is not None
        last = render.input.decode(record.message.payload)
        assert last in (Edit("doc-1", "a-39"), Edit("doc-1", "b-39"))
        async with app.worker():
            with anyio.fail_after(30):
                result = await render.job(job_id).result(timeout=30)
        assert result == last
        counts = await app.broker.counts("render")
        assert sum(counts.values()) == 1  # it ran once; no other job was made
    redis.Redis.from_url(barrier).flushdb()
