"""RELIABILITY B6: Redis at maxmemory refuses whole batches with a clear error, never half."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import anyio
import msgspec
import pytest
import redis

from tests.redis_harness import RedisProcess
from typedq import App, BrokerError, JobContext, JobState, Retention, Retry
from typedq.broker.base import (
    BrokerSettings,
    CancelOutcome,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    LeaseStatus,
    Release,
    RetryOutcome,
)
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.scripts import library
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.fixture
def small_redis() -> Iterator[RedisProcess]:
    """Its own server: the test fills it to maxmemory."""
    server = RedisProcess()
    server.start()
    yield server
    server.stop()


class Blob(msgspec.Struct):
    data: str


async def test_enqueue_at_maxmemory_is_refused_whole_and_clearly(
    small_redis: RedisProcess,
) -> None:
    admin = redis.Redis(port=small_redis.port)
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + 2_000_000)
    app = App("oom", broker=small_redis.url)

    @app.task
    async def keep(blob: Blob) -> None:
        return None

    accepted: list[str] = []
    refused: list[str] = []
    error: BrokerError | None = None
    with anyio.fail_after(60):
        async with app:
            for batch in range(200):
                messages = [keep.message(Blob(data="x" * 2_000)) for _ in range(50)]
                try:
                    outcomes = await app.client.enqueue_many(messages)
                except BrokerError as exc:
                    error = exc
                    refused.extend(m.id for m in messages)
                    if batch > 0 and len(refused) >= 150:
                        break
                else:
                    accepted.extend(o.id for o in outcomes)
            assert error is not None, "Redis never reached maxmemory"
            assert "maxmemory" in str(error)
            assert accepted, "nothing fit before maxmemory"
            # All or nothing per batch: every accepted job is whole, no refused one exists.
            records = await app.broker.get(accepted + refused)
            assert all(r is not None for r in records[: len(accepted)])
            assert all(r is None for r in records[len(accepted) :])
            counts = await app.broker.counts("default")
            assert counts[JobState.WAITING] == len(accepted)
    admin.close()


def fill_to_maxmemory(port: int, headroom: int = 2_000_000) -> redis.Redis:
    """A client of the server, whose maxmemory is set ``headroom`` bytes above use.

    typedq's function library is loaded first (as the broker does at connect), so the
    headroom does not depend on its size."""
    admin = redis.Redis(port=port)
    if not admin.function_list(library=library().name):
        admin.function_load(library().source)
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used + headroom)
    return admin


def hold_over_the_limit(admin: redis.Redis, under: int = 200_000) -> None:
    """Set maxmemory ``under`` bytes below the memory used now: Redis refuses writes
    again even if it freed some since the fill."""
    used = int(admin.info("memory")["used_memory"])
    admin.config_set("maxmemory", used - under)


def job(job_id: str, size: int = 2_000) -> JobMessage:
    return JobMessage(id=job_id, task="t", queue="q", payload=b"x" * size)


async def fill(broker: RedisBroker, prefix: str) -> list[str]:
    """Enqueue batches of 50, then single jobs, until Redis refuses one for maxmemory;
    the ids stored, in order."""
    stored: list[str] = []
    for size in (50, 1):
        for b in range(10_000):
            messages = [job(f"{prefix}{size}-{b}-{i}") for i in range(size)]
            try:
                await broker.enqueue(messages)
            except BrokerError as exc:
                error = str(exc)
                break
            stored += [m.id for m in messages]
        else:
            raise AssertionError("Redis never reached maxmemory")
        assert "maxmemory" in error
    return stored


async def enqueue_refused(broker: RedisBroker) -> bool:
    try:
        await broker.enqueue([job(f"probe-{time.monotonic_ns()}")])
    except BrokerError as exc:
        error = str(exc)
    else:
        return False
    assert "maxmemory" in error
    return True


async def test_every_draining_operation_runs_at_maxmemory(small_redis: RedisProcess) -> None:
    """D-oom: at the limit, enqueue and progress are refused; claim, complete, fail
    (retry and for good), release, renew, recover, cancel, retry, remove and purge run."""
    admin = fill_to_maxmemory(small_redis.port)
    settings = BrokerSettings(namespace="oomops", max_stalls=5)
    broker = RedisBroker(small_redis.url, settings)
    await broker.connect()
    try:
        with anyio.fail_after(60):
            stored = await fill(broker, "j")
            assert len(stored) >= 100
            assert await enqueue_refused(broker)
            claimed = await broker.claim(["q"], 10, worker_id="w", lease=30)
            assert [c.message.id for c in claimed] == stored[:10]
            assert (
                await broker.renew([(c.message.id, c.token) for c in claimed], 30)
                == [LeaseStatus.OK] * 10
            )
            a, b, c, d, e, f, *_ = claimed
            # Keys that expired since the fill (short-lived markers) may have freed enough
            # to fall under the limit again: set it below what is used now, so the checks
            # below run at the limit, whatever Redis freed meanwhile.
            hold_over_the_limit(admin)
            with pytest.raises(BrokerError, match="maxmemory"):
                await broker.set_progress(a.message.id, a.token, b"50%")
            assert await broker.complete([Completion(a.message.id, a.token, b"ok")]) == [
                FinishOutcome.OK
            ]
            assert await broker.fail(
                [
                    Failure(id=b.message.id, token=b.token, error=b"err", retry_delay=0.0),
                    Failure(id=c.message.id, token=c.token, error=b"err"),
                ]
            ) == [FinishOutcome.OK, FinishOutcome.OK]
            assert await broker.release([Release(d.message.id, d.token)]) == [FinishOutcome.OK]
            assert await broker.cancel(e.message.id) is CancelOutcome.REQUESTED
            assert await broker.cancel(stored[20]) is CancelOutcome.CANCELLED
            assert await broker.retry([c.message.id]) == [RetryOutcome.RETRIED]
            assert await broker.remove([stored[21], f.message.id]) == [True, True]
            # Leases that expire are recovered at the limit too.
            short = await broker.claim(["q"], 3, worker_id="w2", lease=0.05)
            assert len(short) == 3
            await anyio.sleep(0.2)
            assert await broker.recover_stalled() == 3
            assert await broker.check_epoch()
            assert await enqueue_refused(broker)
            # Purge frees the memory; then enqueues are accepted again.
            assert await broker.purge("q", [JobState.WAITING]) > 0
            assert not await enqueue_refused(broker)
    finally:
        await broker.close()
        admin.close()


async def pending(broker: RedisBroker) -> int:
    counts = await broker.counts(DEFAULT_QUEUE)
    return counts[JobState.WAITING] + counts[JobState.SCHEDULED] + counts[JobState.ACTIVE]


async def test_a_worker_drains_a_full_redis_and_says_so(
    small_redis: RedisProcess, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 2: at maxmemory the worker still claims, completes, retries and recovers
    every job (retention frees the memory), enqueues are refused until then, and the
    worker logs one warning at the limit and one info line below it again."""
    monkeypatch.setattr("typedq.broker.redis.health.MEMORY_CHECK_INTERVAL", 0.2)
    caplog.set_level(logging.INFO, logger="typedq.broker.redis")
    app = App(
        "oomw",
        broker=small_redis.url,
        lease=2.0,
        max_stalls=5,
        retention=Retention(completed_max=10, failed_max=10),
    )
    ran: dict[int, int] = {}

    @app.task(retries=1)
    async def keep(blob: Blob, ctx: JobContext) -> None:
        n = int(blob.data.partition(":")[0])
        ran[n] = ran.get(n, 0) + 1
        if n % 10 == 0 and ctx.attempt == 1:
            raise Retry(delay=0)  # a failed attempt, run again: fail-with-retry at OOM

    total = 0
    with anyio.fail_after(120):
        async with app:
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            # The headroom is for jobs: set once the library is loaded (it counts against
            # maxmemory; its size must not eat into the margin below).
            admin = fill_to_maxmemory(small_redis.port)
            for size in (50, 1):
                while True:
                    blobs = [Blob(data=f"{total + i}:" + "x" * 2_000) for i in range(size)]
                    try:
                        await keep.enqueue_many(blobs)
                    except BrokerError as exc:
                        error = str(exc)
                        break
                    total += size
                assert "maxmemory" in error
                if size == 50:
                    # A worker died holding three jobs: their leases expire at the limit.
                    # (Claimed before the last fill: a claim may free a few bytes, which
                    # let the probe below in when it came after the fill.)
                    lost = await broker.claim([DEFAULT_QUEUE], 3, worker_id="dead", lease=0.05)
                    assert len(lost) == 3
            assert total >= 100
            assert await enqueue_refused(broker)
            async with app.worker(concurrency=8):
                # Polling is fine here: the worker changes the state.
                while await pending(broker):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                # Retention frees the memory of the finished jobs: enqueues come back
                # (within the test's deadline; the last settles' trims may still be on
                # their way when the counts reach zero).
                while await enqueue_refused(broker):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
                # The worker's recovery pass notices the memory came back.
                while not any("below maxmemory again" in r.message for r in caplog.records):  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            counts = await broker.counts(DEFAULT_QUEUE)
    assert sorted(ran) == list(range(total))
    # Jobs 0-2 were the dead worker's (attempt 1 spent there): the others with
    # n % 10 == 0 retried once.
    assert {n for n, runs in ran.items() if runs != 1} == {n for n in ran if n % 10 == 0 and n > 2}
    assert all(runs <= 2 for runs in ran.values())
    assert counts[JobState.FAILED] == 0
    warnings = [r for r in caplog.records if "is at maxmemory" in r.message]
    assert len(warnings) == 1
    assert warnings[0].levelno == logging.WARNING
    assert "enqueues are refused; workers keep draining" in warnings[0].message
    admin.close()
