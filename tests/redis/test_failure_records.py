"""The records a broker writes itself are the same on both brokers.

The memory broker builds them in Python (:mod:`typedq.broker.records`); the Redis broker
in Lua (``failure_record`` in ``lua/common/bookkeeping.lua``). Each scenario below finalises
a job without a worker's record (a cancel before it ran, a cancel while it was handed back or
its worker was lost, a job past ``max_stalls``) on both, on a real redis-server, and
compares every field but the time.
"""

from __future__ import annotations

import time

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE, claim_one, connected, msg, one
from typedq import FailureRecord
from typedq.broker.base import Broker, CancelOutcome, JobState, Release
from typedq.broker.records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WORKER_LOST,
    broker_failure,
    cancelled_while,
    stalled_message,
)
from typedq.job import decode_failure

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Short real leases: expiry is the brokers' own clock, never a mocked one.
LEASE = 0.2


async def recover_one(broker: Broker) -> None:
    """Recover one job once its lease has run out (polled: the broker's clock decides)."""
    # Nothing to wait on but time: a lease ends by the broker's clock, with no event.
    while await broker.recover_stalled() == 0:  # noqa: ASYNC110
        await anyio.sleep(LEASE / 4)


async def final_record(broker: Broker, job_id: str, state: JobState) -> FailureRecord:
    record = await one(broker, job_id)
    assert record.state is state
    return msgspec.structs.replace(decode_failure(record.error, job_id), failed_at=0.0)


async def scenarios(app_name: str, url: str) -> dict[str, FailureRecord]:
    """Finalise one job per scenario on the broker at ``url``; their records by scenario."""
    records: dict[str, FailureRecord] = {}
    async with connected(app_name, url, max_stalls=0) as broker:
        await broker.enqueue([msg(job_id="waiting"), msg(job_id="scheduled", delay=3600)])
        for job_id in ("waiting", "scheduled"):
            assert await broker.cancel(job_id) is CancelOutcome.CANCELLED
            records[job_id] = await final_record(broker, job_id, JobState.CANCELLED)

        await broker.enqueue([msg(job_id="handed-back")])
        claimed = await claim_one(broker, worker_id="w-hand")
        assert await broker.cancel("handed-back") is CancelOutcome.REQUESTED
        await broker.release([Release("handed-back", claimed.token)])
        records["handed-back"] = await final_record(broker, "handed-back", JobState.CANCELLED)

        await broker.enqueue([msg(job_id="worker-lost")])
        await claim_one(broker, worker_id="w-lost", lease=LEASE)
        assert await broker.cancel("worker-lost") is CancelOutcome.REQUESTED
        await recover_one(broker)
        records["worker-lost"] = await final_record(broker, "worker-lost", JobState.CANCELLED)

        await broker.enqueue([msg(job_id="stalled")])
        await claim_one(broker, worker_id="w-stalled", lease=LEASE)
        await recover_one(broker)
        records["stalled"] = await final_record(broker, "stalled", JobState.FAILED)
    return records


async def test_lua_builds_the_same_records_as_the_memory_broker(
    app_name: str, redis_url: str
) -> None:
    with anyio.fail_after(TEST_DEADLINE):
        memory = await scenarios(app_name, "memory://")
        redis = await scenarios(app_name, redis_url)
    expected = {
        "waiting": broker_failure("cancelled", cancelled_while("waiting"), attempt=0, failed_at=0),
        "scheduled": broker_failure(
            "cancelled", cancelled_while("scheduled"), attempt=0, failed_at=0
        ),
        "handed-back": broker_failure(
            "cancelled", CANCELLED_ON_HAND_BACK, attempt=0, worker_id="w-hand", failed_at=0
        ),
        "worker-lost": broker_failure(
            "cancelled", CANCELLED_WORKER_LOST, attempt=1, worker_id="w-lost", failed_at=0
        ),
        "stalled": broker_failure(
            "stalled", stalled_message(1, 0), attempt=1, worker_id="w-stalled", failed_at=0
        ),
    }
    assert memory == expected
    assert redis == expected


async def test_the_records_carry_the_brokers_time(app_name: str, redis_url: str) -> None:
    before = time.time()
    for url in ("memory://", redis_url):
        async with connected(app_name, url) as broker:
            await broker.enqueue([msg(job_id="timed")])
            assert await broker.cancel("timed") is CancelOutcome.CANCELLED
            record = await one(broker, "timed")
            failed_at = decode_failure(record.error, "timed").failed_at
            # Generous: the same machine's clock, read by two processes.
            assert before - 5 <= failed_at <= time.time() + 5, url
