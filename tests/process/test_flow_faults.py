"""Workflows on Redis and PostgreSQL with real worker processes SIGKILLed mid-flow.

The hand-off to the next step (and the fan-in counter) runs inside the completion
script of the step (on PostgreSQL: in its transaction, by the schema's triggers), so
there is no moment "between steps" where a killed worker can
lose a flow: either the completion reached Redis (and the next step exists, waiting),
or it did not (and the step re-runs by lease). Workers run :mod:`tests.flow_app`,
whose handlers count every execution in a ledger (database 1), so "nothing lost, the
callback ran once" is checked from outside the workers.
"""

from __future__ import annotations

import contextlib
import itertools
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import redis.asyncio as aioredis

from tests import flow_app
from tests.flow_app import Work
from tests.pg_harness import PgCluster
from tests.redis_harness import RedisProcess, flushall
from tests.support import spawn_worker, stop_workers

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

_schemas = itertools.count()


@pytest.fixture(
    params=["redis", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def flow_broker(request: pytest.FixtureRequest, redis_server: RedisProcess) -> str:
    """The workers' and the producer's broker: the session redis-server (its database 0;
    the ledger is database 1), or a fresh schema of the session PostgreSQL cluster."""
    flushall(redis_server.port)
    if request.param == "redis":
        return redis_server.url
    pg: PgCluster = request.getfixturevalue("pg_cluster")
    return f"{pg.url}?schema=flowfault_{next(_schemas)}"


def _ledger_url(server: RedisProcess) -> str:
    return f"redis://127.0.0.1:{server.port}/1"


@contextlib.contextmanager
def _workers(server: RedisProcess, url: str, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = {"TYPEDQ_TEST_LEDGER": _ledger_url(server), "TYPEDQ_TEST_LEASE": "1.0"}
    procs = []
    for i in range(count):
        log_path = server.dir / f"flow-worker-{i}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:
            procs.append(
                spawn_worker("tests.flow_app:app", url, concurrency=8, grace=2, env=env, output=log)
            )
    try:
        yield procs
    finally:
        stop_workers(procs)


@contextlib.asynccontextmanager
async def _producer(server: RedisProcess, url: str) -> AsyncIterator[aioredis.Redis]:
    flow_app.app.use_broker(url)
    ledger = aioredis.Redis.from_url(_ledger_url(server))
    try:
        async with flow_app.app:
            yield ledger
    finally:
        await ledger.aclose()


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def _kill_once_started(ledger: aioredis.Redis, victim: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``victim`` while it runs handlers (after it started one)."""
    with anyio.fail_after(20):
        while not any(  # noqa: ASYNC110 -- the victim is another process
            _str(line).endswith(f" {victim.pid}") for line in await ledger.lrange("started", 0, -1)
        ):
            await anyio.sleep(0.02)
    # Handlers sleep 0.2 s: the victim is still running the ones it just started.
    await anyio.sleep(0.1)
    victim.send_signal(signal.SIGKILL)
    victim.wait()


async def _runs(ledger: aioredis.Redis) -> tuple[dict[str, int], set[str]]:
    runs = {_str(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    started = [_str(line).split() for line in await ledger.lrange("started", 0, -1)]
    return runs, {job_id for job_id, _ in started}


async def test_chains_survive_a_sigkilled_worker(
    redis_server: RedisProcess, flow_broker: str
) -> None:
    chain = flow_app.step.then(flow_app.step).then(flow_app.step).then(flow_app.step)
    with _workers(redis_server, flow_broker, 2) as (victim, survivor):
        async with _producer(redis_server, flow_broker) as ledger:
            jobs = [await chain.enqueue(Work(n=100 * i, sleep=0.2)) for i in range(40)]
            await _kill_once_started(ledger, victim)
            with anyio.fail_after(60):
                results = [await job.result() for job in jobs]
            runs, _ = await _runs(ledger)
            victim_ids = {
                _str(line).split()[0]
                for line in await ledger.lrange("started", 0, -1)
                if _str(line).endswith(f" {victim.pid}")
            }
            assert survivor.poll() is None
    assert results == [Work(n=100 * i + 4, sleep=0.2) for i in range(40)]
    every_step = {f"{job.id}.{k}" for job in jobs for k in range(3)} | {job.id for job in jobs}
    assert set(runs) == every_step  # every step ran, none was lost or made up
    twice = {job_id for job_id, n in runs.items() if n > 1}
    assert set(runs.values()) <= {1, 2}
    assert twice  # the kill hit running steps, which ran again elsewhere
    assert twice <= victim_ids  # only what the killed worker was running ran again


#: Members per fan-in: 10 fan-ins of 12 keep both workers' 16 slots busy well past the kill
#: (~1.5 s of 0.2 s members), which is what the test needs of the count.
MEMBERS = 12


async def test_fan_ins_survive_a_sigkilled_worker(
    redis_server: RedisProcess, flow_broker: str
) -> None:
    with _workers(redis_server, flow_broker, 2) as (victim, survivor):
        async with _producer(redis_server, flow_broker) as ledger:
            jobs = [
                await flow_app.square.map(Work(n=f + i, sleep=0.2) for i in range(MEMBERS))
                .then(flow_app.gather)
                .enqueue()
                for f in range(10)
            ]
            await _kill_once_started(ledger, victim)
            with anyio.fail_after(60):
                results = [await job.result() for job in jobs]
            runs, _ = await _runs(ledger)
            callbacks = {_str(k): int(v) for k, v in (await ledger.hgetall("callbacks")).items()}
            victim_ids = {
                _str(line).split()[0]
                for line in await ledger.lrange("started", 0, -1)
                if _str(line).endswith(f" {victim.pid}")
            }
            assert survivor.poll() is None
    assert results == [
        Work(n=sum((f + i) ** 2 for i in range(MEMBERS)) * 1000 + MEMBERS) for f in range(10)
    ]
    members = {f"{job.id}.m{i}" for job in jobs for i in range(MEMBERS)}
    assert set(runs) == members | {job.id for job in jobs}
    twice = {job_id for job_id, n in runs.items() if n > 1}
    assert set(runs.values()) <= {1, 2}
    assert twice  # the kill hit running members, which ran again elsewhere
    assert twice <= victim_ids
    # Each callback was made runnable once: it ran once, or twice only if the killed
    # worker was running it.
    assert set(callbacks) == {job.id for job in jobs}
    assert all(n == 1 or job_id in victim_ids for job_id, n in callbacks.items())
