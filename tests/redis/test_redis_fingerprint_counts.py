"""Counting jobs by fingerprint on Redis (list.lua's counting mode) beyond the contract:
the stored bodies the script reads by their first msgpack fields, in every form a job
is stored in, and records of older layouts or of bytes typedq did not write.

Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from tests.redis_support import broker_at, raw_redis
from typedq import JobState
from typedq.broker.base import JobMessage
from typedq.broker.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


def job(job_id: str, fingerprint: str, *, delay: float = 0.0, **fields: object) -> JobMessage:
    return msgspec.structs.replace(
        JobMessage(id=job_id, task="t", queue="q", payload=b"\x91\x01" * 200, delay=delay),
        fingerprint=fingerprint,
        **fields,
    )


async def counted(broker: RedisBroker, state: JobState, limit: int = 1000) -> Counter[object]:
    total: Counter[object] = Counter()
    cursor: str | None = None
    while True:
        page = await broker.count_fingerprints("q", state, cursor=cursor, limit=limit)
        total.update(page.counts)
        if page.cursor is None:
            return total
        cursor = page.cursor


async def test_every_body_form_is_read(redis_url: str) -> None:
    """The usual body (3 fields, or 2 without a fingerprint), a long one (limit keys,
    priority: more fields after the fingerprint), a fair job's 16 fields, a payload
    past 255 bytes (bin 16) and a long task name (str 8)."""
    long_task = "task-" + "x" * 40
    async with broker_at(redis_url, "forms") as broker:
        await broker.enqueue(
            [
                job("a", "f1"),
                job("b", ""),
                job("c", "f1", priority=3, rate_key="r", max_retries=2),
                job("d", "f2", fair_key="k", fair_weight=2),
                msgspec.structs.replace(job("e", "f3"), task=long_task),
                job("f", "f1", delay=600),
                msgspec.structs.replace(job("g", "f3", delay=600), task=long_task),
            ]
        )
        waiting = {("t", "f1"): 2, ("t", ""): 1, ("t", "f2"): 1, (long_task, "f3"): 1}
        assert await counted(broker, JobState.WAITING) == Counter(waiting)
        assert await counted(broker, JobState.WAITING, limit=1) == Counter(waiting)
        scheduled = {("t", "f1"): 1, (long_task, "f3"): 1}
        assert await counted(broker, JobState.SCHEDULED) == Counter(scheduled)


async def test_old_records_and_foreign_bytes(redis_url: str) -> None:
    """A record written before bodies holds the whole JobMessage (its task second, the
    fingerprint fifth): counted by them. Bytes typedq did not write are counted under
    no task, so the total still holds every job."""
    async with broker_at(redis_url, "old") as broker:
        await broker.enqueue([job(i, "f1", delay=600) for i in ("a", "b", "c")])
        k = broker.keys
        async with raw_redis(redis_url) as raw:
            stored = await raw.get(k.job("q", "a"))
            assert isinstance(stored, bytes)
            # The record's text header, 's|<order>|<enqueued_at>|<priority>|<run_at>|'.
            header = b"|".join(stored.split(b"|", 5)[:5]) + b"|"
            legacy = msgspec.msgpack.encode(msgspec.structs.replace(job("b", "f0"), task="old"))
            await raw.set(k.job("q", "b"), header + legacy)
            await raw.set(k.job("q", "c"), header + b"\xc1not msgpack")
        assert await counted(broker, JobState.SCHEDULED) == Counter(
            {("t", "f1"): 1, ("old", "f0"): 1, ("", ""): 1}
        )
        (record,) = await broker.get(["b"], queue="q")
        assert record is not None
        assert record.message.fingerprint == "f0"
