"""The PostgreSQL broker's schema registry and fingerprint counts beyond the contract:
the stored message read in SQL in every msgpack form its first fields take (ids and
names of every length, payloads from empty to toasted), the counting pages' cursors
shared with ``page_jobs``, and two processes recording one schema at once (a
throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import os
from collections import Counter

import anyio
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE
from typedq import JobState
from typedq.broker.base import BrokerSettings, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.schemas import COUNT_PAGE_MAX
from typedq.broker.schemas import SchemaRecord

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.url


def job(job_id: str, task: str, fingerprint: str, payload: bytes, **fields: object) -> JobMessage:
    message = JobMessage(id=job_id, task=task, queue="q", payload=payload, fingerprint=fingerprint)
    return msgspec.structs.replace(message, **fields)


async def counted(
    broker: PostgresBroker, state: JobState, limit: int
) -> tuple[Counter[tuple[str, str]], list[str | None]]:
    """Every page of ``state`` summed, and the cursors the pages answered."""
    total: Counter[tuple[str, str]] = Counter()
    cursors: list[str | None] = []
    cursor: str | None = None
    while True:
        page = await broker.count_fingerprints("q", state, cursor=cursor, limit=limit)
        assert page.jobs == sum(page.counts.values()) <= limit
        total.update(page.counts)
        cursors.append(page.cursor)
        if page.cursor is None:
            return total, cursors
        cursor = page.cursor


async def test_every_message_form_is_read(pg_url: str, app_name: str) -> None:
    """Ids and task names as fixstr and str 8, payloads empty, bin 8, bin 16, bin 32
    and large enough to be stored out of line (TOAST, incompressible), fingerprints
    empty or not, a message with every later field set: each counted by its task and
    fingerprint, at every page size."""
    long_task = "task-" + "x" * 100
    long_id = "id-" + "y" * 190
    payloads = [b"", b"\x01" * 40, b"\x02" * 300, b"\x03" * 70_000, os.urandom(3_000_000)]
    messages = [
        job(f"j{i}", "t", "f1" if i % 2 else "", payload) for i, payload in enumerate(payloads)
    ]
    messages += [
        job(long_id, long_task, "0123456789abcdef", b"\x04" * 500, priority=3),
        job("full", "t", "f2", b"", rate_key="r", max_retries=2, trace_context="x" * 300),
        job("later", long_task, "f3", os.urandom(100_000), delay=600),
    ]
    broker = PostgresBroker(pg_url, BrokerSettings(namespace=app_name))
    with anyio.fail_after(TEST_DEADLINE):
        await broker.connect()
        try:
            await broker.enqueue(messages)
            waiting = Counter(
                {("t", ""): 3, ("t", "f1"): 2, (long_task, "0123456789abcdef"): 1, ("t", "f2"): 1}
            )
            for limit in (1, 3, 1000):
                assert (await counted(broker, JobState.WAITING, limit))[0] == waiting
            scheduled, _ = await counted(broker, JobState.SCHEDULED, 1000)
            assert scheduled == Counter({(long_task, "f3"): 1})
        finally:
            await broker.close()


async def test_counting_pages_are_page_jobs_pages(pg_url: str, app_name: str) -> None:
    """The pages count what ``page_jobs`` lists, with the same cursors, so one walk may
    switch between them; a page is bounded by COUNT_PAGE_MAX whatever the limit asked."""
    broker = PostgresBroker(pg_url, BrokerSettings(namespace=app_name))
    with anyio.fail_after(TEST_DEADLINE):
        await broker.connect()
        try:
            await broker.enqueue(
                [job(f"p{i:03}", "t", f"f{i % 3}", b"", priority=i % 4) for i in range(50)]
            )
            await broker.enqueue(
                [job(f"d{i:03}", "t", "f", b"", delay=600 + i % 5) for i in range(20)]
            )
            for state, pages in ((JobState.WAITING, 8), (JobState.SCHEDULED, 3)):
                _, cursors = await counted(broker, state, 7)
                listed: list[str | None] = []
                cursor: str | None = None
                while True:
                    listing = await broker.page_jobs("q", state, cursor=cursor, limit=7)
                    listed.append(listing.cursor)
                    if listing.cursor is None:
                        break
                    cursor = listing.cursor
                assert cursors == listed
                assert len(cursors) == pages
            # Places between and beyond the stored ones (a cursor this broker did not
            # make, but page_jobs reads): the same jobs follow them.
            for place in ("w-1.5:0:a", "w-2:-5:a", "w1e300:0:a", "w-1e300:0:a"):
                ids = (await broker.page_jobs("q", JobState.WAITING, cursor=place, limit=100)).ids
                here = await broker.count_fingerprints(
                    "q", JobState.WAITING, cursor=place, limit=100
                )
                assert here.jobs == len(ids), place
            await broker.enqueue(
                [job(f"m{i:05}", "t", "f", b"") for i in range(COUNT_PAGE_MAX + 1)]
            )
            big = await broker.count_fingerprints("q", JobState.WAITING, limit=10**6)
            assert big.jobs == COUNT_PAGE_MAX
            assert big.cursor is not None
        finally:
            await broker.close()


async def test_two_processes_recording_one_schema_keep_one(pg_url: str, app_name: str) -> None:
    """Processes that record the same pair at once: exactly one is told it kept its
    record, and that record is the one kept."""
    brokers = [PostgresBroker(pg_url, BrokerSettings(namespace=app_name)) for _ in range(4)]
    kept: dict[int, list[bool]] = {}

    async def record(i: int) -> None:
        kept[i] = await brokers[i].record_schemas(
            [SchemaRecord(task="t", fingerprint="f", input_schema=str(i), output_schema="{}")]
        )

    with anyio.fail_after(TEST_DEADLINE):
        for broker in brokers:
            await broker.connect()
        try:
            async with anyio.create_task_group() as tg:
                for i in range(len(brokers)):
                    tg.start_soon(record, i)
            winners = [i for i, flags in kept.items() if flags == [True]]
            assert len(winners) == 1
            assert sorted(flags for flags in kept.values()) == [[False]] * 3 + [[True]]
            (stored,) = await brokers[0].schema_records()
            assert stored.input_schema == str(winners[0])
        finally:
            for broker in brokers:
                await broker.close()
