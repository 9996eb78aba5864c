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


def small(job_id: str, fingerprint: str, *, delay: float = 0.0) -> JobMessage:
    """A job whose body is the usual one (a payload under 256 bytes)."""
    return msgspec.structs.replace(
        JobMessage(id=job_id, task="t", queue="q", payload=b"\x91\x01", delay=delay),
        fingerprint=fingerprint,
    )


async def index_reads(
    redis_url: str, broker: RedisBroker, limit: int
) -> tuple[Counter[object], int]:
    """The waiting jobs counted, and the HGETs Redis ran for it (commandstats counts the
    commands scripts call)."""
    async with raw_redis(redis_url) as raw:
        await raw.config_resetstat()
        total = await counted(broker, JobState.WAITING, limit=limit)
        stats = await raw.info("commandstats")
    return total, int(stats.get("cmdstat_hget", {}).get("calls", 0))


async def test_waiting_entries_are_read_without_the_index_while_the_lists_hold_only_jobs(
    redis_url: str,
) -> None:
    """While the waiting lists hold as many entries as the queue has waiting jobs, no
    entry is stale and the count reads none in the index (one HGET a call: the queue's
    count). A cancelled job's entry stays behind as '|' until a claim pops it: the count
    checks each entry meanwhile, and is exact either way."""
    async with broker_at(redis_url, "fast") as broker:
        jobs = [small(f"j{i:02}", f"f{i % 3}") for i in range(40)]
        await broker.enqueue(jobs)
        want = Counter(("t", f"f{i % 3}") for i in range(40))
        total, hgets = await index_reads(redis_url, broker, limit=7)
        assert total == want
        assert hgets <= 7  # 6 calls of 7 jobs: no index lookup per job

        await broker.cancel("j00")  # the head's entry becomes '|'
        want[("t", "f0")] -= 1
        total, hgets = await index_reads(redis_url, broker, limit=7)
        assert total == want
        assert hgets >= 39  # each entry checked

        (claimed,) = await broker.claim(["q"], 1, worker_id="w", lease=300)  # pops '|' too
        assert claimed.message.id == "j01"
        want[("t", "f1")] -= 1
        total, hgets = await index_reads(redis_url, broker, limit=7)
        assert total == want
        assert hgets <= 7


async def test_a_stale_entry_is_not_counted(redis_url: str) -> None:
    """Entries of jobs that are not waiting (bytes of a real entry under ids the index
    does not hold) make the lists longer than the queue's count: every entry is
    checked, and those are not counted, at every page size."""
    async with broker_at(redis_url, "stale") as broker:
        await broker.enqueue([small(f"j{i}", "f1") for i in range(10)])
        async with raw_redis(redis_url) as raw:
            level = broker.keys.waiting("q", 0)
            real = await raw.lindex(level, 3)
            assert isinstance(real, bytes)
            assert real.startswith(b"j6|")
            # At the head (RPUSH), its fingerprint another.
            await raw.rpush(level, b"ghost" + real[2:].replace(b"\xa2f1", b"\xa2f9"))
            await raw.lpush(level, b"ghost2" + real[2:])  # at the tail too
        for limit in (1, 3, 1000):
            assert await counted(broker, JobState.WAITING, limit=limit) == Counter(
                {("t", "f1"): 10}
            )


async def test_jobs_that_leave_mid_walk_are_not_counted(redis_url: str) -> None:
    """Pages resumed after jobs left (cancelled, removed, claimed from the head, a
    scheduled job's record gone as an expired key goes) and others came: the jobs that
    left before the walk reached them are not counted, the others once each."""
    async with broker_at(redis_url, "moving") as broker:
        waiting = [small(f"w{i:02}", f"f{i:02}") for i in range(30)]
        later = [small(f"s{i:02}", f"g{i:02}", delay=600) for i in range(30)]
        await broker.enqueue(waiting + later)
        totals: dict[JobState, Counter[object]] = {}
        cursors: dict[JobState, str | None] = {}
        for state in (JobState.WAITING, JobState.SCHEDULED):
            page = await broker.count_fingerprints("q", state, limit=10)
            assert page.jobs == 10
            assert page.cursor is not None
            totals[state], cursors[state] = Counter(page.counts), page.cursor

        await broker.cancel("w20")
        assert await broker.remove(["w25", "s20"], queue="q") == [True, True]
        await broker.cancel("s27")
        async with raw_redis(redis_url) as raw:
            assert await raw.delete(broker.keys.job("q", "s25")) == 1
        claimed = await broker.claim(["q"], 2, worker_id="w", lease=300)
        assert [c.message.id for c in claimed] == ["w00", "w01"]  # counted already
        await broker.enqueue([small("w30", "f30"), small("s30", "g30", delay=900)])

        for state in (JobState.WAITING, JobState.SCHEDULED):
            cursor = cursors[state]
            while cursor is not None:
                page = await broker.count_fingerprints("q", state, cursor=cursor, limit=10)
                totals[state].update(page.counts)
                cursor = page.cursor
        gone_w, gone_s = {20, 25}, {20, 25, 27}
        assert totals[JobState.WAITING] == Counter(
            {("t", f"f{i:02}"): 1 for i in range(31) if i not in gone_w}
        )
        assert totals[JobState.SCHEDULED] == Counter(
            {("t", f"g{i:02}"): 1 for i in range(31) if i not in gone_s}
        )


async def test_only_a_fast_walk_counts_more_than_500_jobs_a_call(redis_url: str) -> None:
    """A call counts up to its limit while it reads waiting entries with no index lookup;
    one that checks them (or reads job records) stops at 500 jobs, so that it stays
    a few milliseconds long. The pages still add up to every job."""
    async with broker_at(redis_url, "pages") as broker:
        await broker.enqueue([small(f"j{i:04}", "f1") for i in range(1200)])
        await broker.enqueue([small(f"s{i:04}", "f2", delay=600) for i in range(600)])
        page = await broker.count_fingerprints("q", JobState.WAITING, limit=1000)
        assert page.jobs == 1000
        assert (await broker.count_fingerprints("q", JobState.SCHEDULED, limit=1000)).jobs == 500
        await broker.cancel("j0600")
        page = await broker.count_fingerprints("q", JobState.WAITING, limit=1000)
        assert page.jobs == 500
        assert await counted(broker, JobState.WAITING, limit=1000) == Counter({("t", "f1"): 1199})
        assert await counted(broker, JobState.SCHEDULED, limit=1000) == Counter({("t", "f2"): 600})
