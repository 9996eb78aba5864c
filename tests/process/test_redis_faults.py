"""Fault tests for the Redis broker with real worker processes (``python -m typedq worker``).

Workers run :mod:`tests.redis_app`; its handler counts every execution in a ledger
(database 1 of the same redis-server), so "each job ran exactly once" is checked
from outside the workers, across SIGKILLs and Redis restarts.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator

import anyio
import pytest
import redis.asyncio as aioredis

from tests import redis_app
from tests.redis_harness import RedisProcess, flushall, redis_process
from tests.redis_support import STALL_SOCKET_TIMEOUT, with_socket_timeout
from tests.support import spawn_worker, stop_workers
from typedq import JobState, RedisDataLost
from typedq.broker.base import BrokerSettings, Completion, FinishOutcome, JobMessage
from typedq.broker.redis import RedisBroker
from typedq.task import DEFAULT_QUEUE

#: The worker processes' epoch-check interval in the data-loss test, seconds.
EPOCH_CHECK = 0.5

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]


def ledger_url(server: RedisProcess) -> str:
    return f"redis://127.0.0.1:{server.port}/1"


@contextlib.contextmanager
def workers(
    server: RedisProcess,
    count: int,
    *,
    concurrency: int,
    lease: float = 1.0,
    ledger: RedisProcess | None = None,
    epoch_check: float | None = None,
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes of tests.redis_app; stopped (SIGTERM, then KILL) after.

    :param ledger: the server whose db 1 counts executions (default: ``server``)
    :param epoch_check: the workers' epoch-check interval, seconds (None: typedq's 2 s)
    """
    env = {
        "TYPEDQ_TEST_LEDGER": ledger_url(ledger or server),
        "TYPEDQ_TEST_LEASE": str(lease),
    }
    if epoch_check is not None:
        env["_TYPEDQ_TEST_EPOCH_CHECK"] = str(epoch_check)
    procs = []
    for i in range(count):
        log_path = server.dir / f"worker-{i}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:  # the child keeps its own descriptor
            procs.append(
                spawn_worker(
                    "tests.redis_app:app",
                    server.url,
                    concurrency=concurrency,
                    grace=2,
                    env=env,
                    output=log,
                )
            )
    try:
        yield procs
    finally:
        stop_workers(procs)


@contextlib.asynccontextmanager
async def producer(
    server: RedisProcess, ledger_server: RedisProcess | None = None
) -> AsyncIterator[aioredis.Redis]:
    """tests.redis_app's app connected to ``server`` here, and the ledger connection."""
    redis_app.app.use_broker(server.url)
    ledger = aioredis.Redis.from_url(ledger_url(ledger_server or server))
    try:
        async with redis_app.app:
            yield ledger
    finally:
        await ledger.aclose()


async def wait_completed(total: int, deadline: float) -> None:
    broker = redis_app.app.broker
    with anyio.fail_after(deadline):
        # Polling from the test is fine: other processes change the state.
        while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total:  # noqa: ASYNC110
            await anyio.sleep(0.1)


async def runs(ledger: aioredis.Redis) -> dict[str, int]:
    return {_str(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}


def _str(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def test_two_worker_processes_run_each_job_exactly_once(
    redis_server: RedisProcess,
) -> None:
    flushall(redis_server.port)
    total = 10_000
    with workers(redis_server, 2, concurrency=32, lease=5.0) as procs:
        async with producer(redis_server) as ledger:
            jobs = await redis_app.work.enqueue_many([redis_app.Work(n=i) for i in range(total)])
            await wait_completed(total, 120)
            executed = await runs(ledger)
            assert all(p.poll() is None for p in procs)
    assert len(executed) == total
    assert set(executed) == {j.id for j in jobs}
    assert set(executed.values()) == {1}
    # Both processes took part.
    pids = {line.split()[1] for line in await _started(redis_server)}
    assert len(pids) == 2


async def _started(server: RedisProcess) -> list[str]:
    ledger = aioredis.Redis.from_url(ledger_url(server))
    try:
        return [_str(b) for b in await ledger.lrange("started", 0, -1)]
    finally:
        await ledger.aclose()


async def test_sigkilled_worker_jobs_rerun_elsewhere_once(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    # 100 jobs of 0.2 s on 2 x 8 slots: the kill lands with a backlog left (~1 s of it),
    # which the survivor drains while the victim's jobs wait out their lease.
    total = 100
    with workers(redis_server, 2, concurrency=8, lease=1.0) as procs:
        victim, survivor = procs
        async with producer(redis_server) as ledger:
            await redis_app.work.enqueue_many(
                [redis_app.Work(n=i, sleep=0.2) for i in range(total)]
            )
            with anyio.fail_after(20):
                while not any(  # noqa: ASYNC110 -- the victim is another process
                    line.endswith(f" {victim.pid}") for line in await _started(redis_server)
                ):
                    await anyio.sleep(0.02)
            await anyio.sleep(0.1)  # mid-job: the victim holds leases on running handlers
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            await wait_completed(total, 60)
            executed = await runs(ledger)
            started = [line.split() for line in await _started(redis_server)]
            ends = {_str(k): int(v) for k, v in (await ledger.hgetall("ends")).items()}
            records = await redis_app.app.broker.get(list(executed))
            assert survivor.poll() is None
    on_victim = {job_id for job_id, pid in started if pid == str(victim.pid)}
    assert len(executed) == total
    twice = {job_id for job_id, n in executed.items() if n == 2}
    assert set(executed.values()) <= {1, 2}
    # Only jobs the killed worker was running ran again; each one exactly once more.
    assert twice
    assert twice <= on_victim
    for record in records:
        assert record is not None
        assert record.state is JobState.COMPLETED
        if record.message.id in twice:
            assert record.stalls == 1
            assert record.attempt == 2
            assert ends.get(record.message.id, 0) >= 1


async def test_workers_resume_after_a_redis_restart(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    # The ledger lives on the session server, which stays up: only the broker restarts.
    with (
        redis_process(appendonly=True) as server,
        workers(server, 1, concurrency=8, ledger=redis_server) as procs,
    ):
        async with producer(server, redis_server) as ledger:
            await redis_app.work.enqueue_many([redis_app.Work(n=i) for i in range(300)])
            await wait_completed(300, 30)
            server.kill(signal.SIGTERM)  # a clean restart: AOF flushed
            await anyio.sleep(1.0)
            server.start()
            # Same clients, same worker process: no restart of anything but Redis.
            with anyio.fail_after(30):
                while True:
                    try:
                        await redis_app.work.enqueue_many(
                            [redis_app.Work(n=i) for i in range(300, 600)]
                        )
                        break
                    except Exception:  # BrokerUnavailable while it comes back
                        await anyio.sleep(0.2)
            await wait_completed(600, 30)
            executed = await runs(ledger)
            assert procs[0].poll() is None
            # AOF kept the epoch key: nobody reports a loss of data.
            broker = redis_app.app.broker
            assert isinstance(broker, RedisBroker)
            assert await broker.check_epoch()
            assert broker.data_lost is None
            assert not lost_data_lines(server)
    assert len(executed) == 600
    assert set(executed.values()) == {1}


def lost(broker: RedisBroker) -> RedisDataLost | None:
    """``broker.data_lost``, read afresh (it changes behind mypy's narrowing)."""
    return broker.data_lost


def lost_data_lines(server: RedisProcess) -> list[str]:
    """The "Redis lost its data" lines in the logs of the workers of ``server``."""
    return [
        line
        for path in sorted(server.dir.glob("worker-*.log"))
        for line in path.read_text(errors="replace").splitlines()
        if "lost its data" in line
    ]


async def test_redis_restart_without_persistence_is_reported_once(
    redis_server: RedisProcess, caplog: pytest.LogCaptureFixture
) -> None:
    """RELIABILITY B2: Redis restarts empty (no AOF, no RDB). Producer and worker each
    report RedisDataLost once, with a clear text, and keep working with the new epoch."""
    flushall(redis_server.port)
    with (
        redis_process(appendonly=False) as server,
        # Epoch checks every 0.5 s (the recovery pass's period with the 1 s lease), not 2 s.
        workers(server, 1, concurrency=8, ledger=redis_server, epoch_check=EPOCH_CHECK) as procs,
    ):
        async with producer(server, redis_server) as ledger:
            broker = redis_app.app.broker
            assert isinstance(broker, RedisBroker)
            await redis_app.work.enqueue_many([redis_app.Work(n=i) for i in range(100)])
            await wait_completed(100, 30)
            assert broker.data_lost is None
            server.kill()
            server.start()
            with anyio.fail_after(30):
                while True:
                    try:
                        later = await redis_app.work.enqueue_many(
                            [redis_app.Work(n=i) for i in range(100, 200)]
                        )
                        break
                    except Exception:  # BrokerUnavailable while it comes back
                        await anyio.sleep(0.2)
            # The worker notices on a recovery pass; the producer before an enqueue
            # (at most every EPOCH_CHECK_INTERVAL) or when asked.
            with anyio.fail_after(20):
                while not lost_data_lines(server):  # noqa: ASYNC110 -- another process
                    await anyio.sleep(0.1)
            if lost(broker) is None:
                assert not await broker.check_epoch()
            assert isinstance(lost(broker), RedisDataLost)
            text = str(lost(broker))
            assert "lost its data" in text
            assert "typedq:{rfault}:epoch" in text
            assert "vanished" in text or "changed" in text
            assert "appendonly yes" in text
            # Jobs enqueued after the loss run on the same worker process.
            for job in later:
                await job.result(timeout=30)
            executed = await runs(ledger)
            assert await broker.check_epoch()
            # Two more of the worker's epoch checks at least: no second report.
            await anyio.sleep(2 * EPOCH_CHECK + 0.5)
            assert procs[0].poll() is None
            (line,) = lost_data_lines(server)
            assert "ERROR" in line
            assert "was flushed (FLUSHALL/FLUSHDB)" in line
    assert len(executed) == 200
    assert set(executed.values()) == {1}
    errors = [r for r in caplog.records if "lost its data" in r.getMessage()]
    assert len(errors) == 1
    assert errors[0].levelname == "ERROR"


async def test_flushall_is_reported_once_by_every_client() -> None:
    with redis_process() as server:
        first = RedisBroker(server.url, BrokerSettings(namespace="ep"))
        second = RedisBroker(server.url, BrokerSettings(namespace="ep"))
        other_app = RedisBroker(server.url, BrokerSettings(namespace="ep2"))
        for broker in (first, second, other_app):
            await broker.connect()
        raw = aioredis.Redis.from_url(server.url)
        try:
            assert await first.check_epoch()
            await first.enqueue([JobMessage(id="a", task="t", queue="q", payload=b"")])
            await raw.flushall()
            assert not await first.check_epoch()
            assert isinstance(first.data_lost, RedisDataLost)
            assert "has vanished" in str(first.data_lost)
            # The first client wrote a new epoch; the second sees it changed.
            assert not await second.check_epoch()
            assert "has changed to" in str(second.data_lost)
            assert not await other_app.check_epoch()
            # Once per loss: the new epoch is adopted and the broker carries on.
            report = first.data_lost
            assert await first.check_epoch()
            assert await second.check_epoch()
            assert first.data_lost is report
            assert await first.get(["a"]) == [None]
            await first.enqueue([JobMessage(id="b", task="t", queue="q", payload=b"")])
            (job,) = await second.claim(["q"], 1, worker_id="w", lease=30)
            assert job.message.id == "b"
            # FLUSHDB of another database is no loss of ours; a second flush of ours is.
            other_db = aioredis.Redis.from_url(f"redis://127.0.0.1:{server.port}/1")
            try:
                await other_db.flushdb()
            finally:
                await other_db.aclose()
            assert await first.check_epoch()
            await raw.flushdb()
            assert not await first.check_epoch()
            assert first.data_lost is not report
        finally:
            await raw.aclose()
            for broker in (first, second, other_app):
                await broker.close()


async def test_producers_notice_on_enqueue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("typedq.broker.redis.health.EPOCH_CHECK_INTERVAL", 0.0)
    with redis_process() as server:
        broker = RedisBroker(server.url, BrokerSettings(namespace="ep"))
        await broker.connect()
        raw = aioredis.Redis.from_url(server.url)
        try:
            await broker.enqueue([JobMessage(id="a", task="t", queue="q", payload=b"")])
            assert broker.data_lost is None
            await raw.flushall()
            outcome = await broker.enqueue([JobMessage(id="b", task="t", queue="q", payload=b"")])
            assert outcome[0].created
            assert isinstance(lost(broker), RedisDataLost)
            assert await raw.get(broker.keys.epoch) is not None
        finally:
            await raw.aclose()
            await broker.close()


async def test_function_flush_with_worker_processes(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    with workers(redis_server, 2, concurrency=16):
        async with producer(redis_server) as ledger:
            raw = aioredis.Redis.from_url(redis_server.url)
            try:
                for start in range(0, 2000, 200):
                    await redis_app.work.enqueue_many(
                        [redis_app.Work(n=i) for i in range(start, start + 200)]
                    )
                    await raw.function_flush()
                    await anyio.sleep(0.05)
                await wait_completed(2000, 60)
            finally:
                await raw.aclose()
            executed = await runs(ledger)
    assert len(executed) == 2000
    assert set(executed.values()) == {1}


async def test_server_stall_longer_than_the_socket_timeout(redis_server: RedisProcess) -> None:
    """DEBUG SLEEP past the client's socket timeout: the client re-sends every script
    (its automatic retry); each must take effect once."""
    flushall(redis_server.port)
    broker = RedisBroker(with_socket_timeout(redis_server.url), BrokerSettings(namespace="stall"))
    await broker.connect()
    raw = aioredis.Redis.from_url(redis_server.url, socket_timeout=30)
    try:
        first = [JobMessage(id=f"a{i}", task="t", queue="q", payload=b"") for i in range(50)]
        second = [JobMessage(id=f"b{i}", task="t", queue="q", payload=b"") for i in range(50)]
        await broker.enqueue(first)
        claimed = await broker.claim(["q"], 20, worker_id="w", lease=60)
        # Open pooled connections first, so each script is sent before the stall
        # (a command waiting for a new connection is only sent once, after it).
        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(broker.counts, "q")
        await raw.config_resetstat()
        async with anyio.create_task_group() as tg:
            tg.start_soon(raw.execute_command, "DEBUG", "SLEEP", str(STALL_SOCKET_TIMEOUT + 1))
            await anyio.sleep(0.1)
            results: dict[str, object] = {}

            async def enqueue() -> None:
                results["enqueue"] = await broker.enqueue(second)

            async def claim() -> None:
                results["claim"] = await broker.claim(["q"], 30, worker_id="w2", lease=60)

            async def complete() -> None:
                results["complete"] = await broker.complete(
                    [Completion(c.message.id, c.token, b"ok") for c in claimed]
                )

            tg.start_soon(enqueue)
            tg.start_soon(claim)
            tg.start_soon(complete)
        stats = await raw.info("commandstats")
        # Three scripts, each sent twice: the stall outlasted the socket timeout.
        assert int(stats["cmdstat_fcall"]["calls"]) == 6
        counts = await broker.counts("q")
        assert sum(counts.values()) == 100
        assert counts[JobState.COMPLETED] == 20
        outcomes = results["complete"]
        assert isinstance(outcomes, list)
        assert set(outcomes) <= {FinishOutcome.OK, FinishOutcome.ALREADY_FINISHED}
        again = results["claim"]
        assert isinstance(again, list)
        # The re-sent claim handed back the same 30 jobs instead of 30 more.
        assert counts[JobState.ACTIVE] == len(again) == 30
    finally:
        await raw.aclose()
        await broker.close()
