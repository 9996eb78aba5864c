"""Broker contract: a page of a state's jobs (issue 24, defect 6).

On a queue that does not change, paging a state with ``list_jobs`` offsets or with
``page_jobs`` cursors lists every job exactly once, in the state's order, every page
full but the last. Redis keeps stale entries in its waiting lists (a cancelled job's,
a retried job's old one); its offsets counted them, so a caller advancing by the page's
length saw duplicates and short pages while more jobs existed (927 waiting jobs paged
by 1000 gave 1,556 ids, 927 distinct).
"""

from __future__ import annotations

import pytest

from tests.support import connected, msg
from typedq import JobState
from typedq.broker.base import Broker, Completion, Failure

pytestmark = pytest.mark.anyio

LIMITS = (1, 7, 100, 1000)


async def walk_offsets(broker: Broker, state: JobState, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    offset = 0
    while True:
        page = await broker.list_jobs("q", state, offset=offset, limit=limit)
        if not page:
            return pages
        pages.append(page)
        offset += len(page)


async def walk_cursors(broker: Broker, state: JobState, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor: str | None = None
    while True:
        page = await broker.page_jobs("q", state, cursor=cursor, limit=limit)
        pages.append(page.ids)
        if page.cursor is None:
            return pages
        assert len(page.ids) == limit, "a page with a cursor after it is full"
        cursor = page.cursor


def check_pages(pages: list[list[str]], expected: list[str], limit: int) -> None:
    flat = [job_id for page in pages for job_id in page]
    assert len(flat) == len(set(flat)), "a job listed twice"
    assert flat == expected
    assert all(len(page) == limit for page in pages[:-1]), "a short page before the end"


async def check_state(broker: Broker, state: JobState, jobs: set[str]) -> None:
    everything = await broker.list_jobs("q", state, limit=1000)
    assert set(everything) == jobs
    assert len(everything) == len(jobs)
    for limit in LIMITS:
        check_pages(await walk_offsets(broker, state, limit), everything, limit)
        check_pages(await walk_cursors(broker, state, limit), everything, limit)


async def test_pages_hold_every_waiting_job_once(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        messages = [msg(priority=(0, 5, -3)[i % 3]) for i in range(980)]
        await broker.enqueue(messages)
        # Cancelling waiting jobs leaves stale entries in Redis's waiting lists;
        # retrying some of them puts a second entry of the same id behind the first.
        cancelled = [m.id for m in messages[::9]]
        for job_id in cancelled:
            await broker.cancel(job_id)
        retried = cancelled[::2]
        await broker.retry(retried)
        waiting = {m.id for m in messages} - set(cancelled) | set(retried)
        assert len(waiting) > 900
        await check_state(broker, JobState.WAITING, waiting)
        await check_state(broker, JobState.CANCELLED, set(cancelled) - set(retried))


async def test_pages_of_scheduled_and_finished_jobs(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        later = [msg(delay=3600.0 + i) for i in range(130)]
        await broker.enqueue(later)
        await broker.cancel(later[5].id)
        await check_state(broker, JobState.SCHEDULED, {m.id for m in later} - {later[5].id})

        now = [msg() for _ in range(60)]
        await broker.enqueue(now)
        claimed = await broker.claim(["q"], 60, worker_id="w", lease=30)
        assert len(claimed) == 60
        await check_state(broker, JobState.ACTIVE, {c.message.id for c in claimed})
        done, failed = claimed[:35], claimed[35:]
        await broker.complete([Completion(c.message.id, c.token, b"") for c in done])
        await broker.fail([Failure(id=c.message.id, token=c.token, error=b"") for c in failed])
        await check_state(broker, JobState.COMPLETED, {c.message.id for c in done})
        await check_state(broker, JobState.FAILED, {c.message.id for c in failed})


async def test_an_empty_state_and_a_bad_cursor(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        page = await broker.page_jobs("q", JobState.WAITING)
        assert (page.ids, page.cursor) == ([], None)
        with pytest.raises(ValueError, match="invalid page cursor 'x'"):
            await broker.page_jobs("q", JobState.WAITING, cursor="x")
