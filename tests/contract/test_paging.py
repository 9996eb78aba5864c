"""Broker contract: a page of a state's jobs (issue 24, defect 6).

On a queue that does not change, paging a state with ``list_jobs`` offsets or with
``page_jobs`` cursors lists every job exactly once, in the state's order, every page
full but the last. Redis keeps stale entries in its waiting lists (a cancelled job's,
a retried job's old one); its offsets counted them, so a caller advancing by the page's
length saw duplicates and short pages while more jobs existed (927 waiting jobs paged
by 1000 gave 1,556 ids, 927 distinct).

While jobs move, a cursor names a place in the state's order, not a count: jobs leaving
or arriving before it (claims, an operator acting on the pages listed so far) do not
make the walk miss or repeat a job that stays in the state.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import pytest

from tests.support import connected, msg
from typedq import JobState
from typedq.broker.base import Broker, Completion, Failure
from typedq.limits import LimitSpec
from typedq.options import MAX_PRIORITY, MIN_PRIORITY

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

LIMITS = (1, 7, 100, 1000)
#: Offset pages of one job are walked on states of at most this many jobs. Each
#: ``list_jobs`` call passes its offset's entries again (O(offset) on Redis), so pages of
#: one over the 927 waiting jobs were ~430,000 entry steps: ~4.5 s of the server's time
#: on Redis and again on Cluster. Those jobs are still walked by offsets of 7, 100 and 1000
#: (a stale entry counted in an offset fails every page size above 1) and by cursors of
#: every size; the smaller states by offsets of one too.
OFFSET_WALK_OF_ONE_UP_TO = 200


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
        if limit > 1 or len(jobs) <= OFFSET_WALK_OF_ONE_UP_TO:
            check_pages(await walk_offsets(broker, state, limit), everything, limit)
        check_pages(await walk_cursors(broker, state, limit), everything, limit)


async def test_pages_hold_every_waiting_job_once(app_name: str, broker_url: str) -> None:
    # The queue: 927 waiting jobs across priorities, some due by a past eta,
    # beside delayed jobs of the same queue and priorities (scheduled, not waiting).
    past = time.time() - 60
    # About 2,000 listing calls (walks of every page size, by offset and by cursor): a few
    # seconds on a quiet box, over the usual 20 s bound at a load of 15.
    async with connected(app_name, broker_url, deadline=120) as broker:
        messages = [
            msg(priority=(0, 5, -3)[i % 3], eta=past if i % 4 == 0 else 0.0) for i in range(1000)
        ]
        later = [msg(priority=(0, 5, -3)[i % 3], delay=3600.0 + i % 7) for i in range(200)]
        await broker.enqueue(messages[:500] + later + messages[500:])
        # Cancelling waiting jobs leaves stale entries in Redis's waiting lists;
        # retrying some of them puts a second entry of the same id behind the first.
        cancelled = [m.id for m in messages[::9]]
        for job_id in cancelled:
            await broker.cancel(job_id)
        retried = cancelled[:39]
        await broker.retry(retried)
        waiting = {m.id for m in messages} - set(cancelled) | set(retried)
        assert len(waiting) == 927
        await check_state(broker, JobState.WAITING, waiting)
        await check_state(broker, JobState.CANCELLED, set(cancelled) - set(retried))
        await check_state(broker, JobState.SCHEDULED, {m.id for m in later})


async def test_pages_of_jobs_at_the_edges_of_the_priority_range(
    app_name: str, broker_url: str
) -> None:
    """Jobs at MIN_PRIORITY and MAX_PRIORITY are paged like any (PostgreSQL negated the
    int4 priority for a page's place: -(-2**31) is out of range, the page failed)."""
    async with connected(app_name, broker_url) as broker:
        levels = (MIN_PRIORITY, MAX_PRIORITY, 0, MIN_PRIORITY + 1, MAX_PRIORITY - 1)
        messages = [msg(priority=levels[i % 5]) for i in range(25)]
        await broker.enqueue(messages)
        everything = await broker.list_jobs("q", JobState.WAITING, limit=1000)
        by_level = sorted(range(25), key=lambda i: (-levels[i % 5], i))
        assert everything == [messages[i].id for i in by_level]
        await check_state(broker, JobState.WAITING, {m.id for m in messages})


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
        for state, cursor in [
            (JobState.SCHEDULED, "x|y"),
            (JobState.FAILED, "1e999|y"),
            (JobState.ACTIVE, "1|"),
            (JobState.COMPLETED, ""),
        ]:
            with pytest.raises(ValueError, match="invalid page cursor"):
                await broker.page_jobs("q", state, cursor=cursor)


async def walk_acting(
    broker: Broker, state: JobState, limit: int, act: Callable[[list[str]], Awaitable[None]]
) -> list[str]:
    """Every id the cursors list, calling ``act`` with each page before the next."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        page = await broker.page_jobs("q", state, cursor=cursor, limit=limit)
        seen += page.ids
        await act(page.ids)
        if page.cursor is None:
            return seen
        cursor = page.cursor


@pytest.mark.parametrize("claims", [5, 20])
async def test_claims_between_pages_move_no_waiting_job_past_the_cursor(
    app_name: str, broker_url: str, claims: int
) -> None:
    # Workers claim from the head of the state (what was listed first) while an operator
    # pages; with claims=20 per page of 7 they overtake the cursor's own job. Main's
    # cursor counted entries from the head, so each claim skipped an unlisted job.
    async with connected(app_name, broker_url) as broker:
        messages = [msg(priority=(0, 5, -3)[i % 3]) for i in range(300)]
        await broker.enqueue(messages)
        claimed: set[str] = set()

        async def claim(_: list[str]) -> None:
            if len(claimed) >= 150:
                return
            got = await broker.claim(["q"], claims, worker_id="w", lease=300)
            claimed.update(c.message.id for c in got)

        seen = await walk_acting(broker, JobState.WAITING, 7, claim)
        assert len(seen) == len(set(seen)), "a job listed twice"
        stayed = {m.id for m in messages} - claimed
        assert stayed, "some jobs stayed waiting throughout"
        assert stayed <= set(seen), f"{len(stayed - set(seen))} waiting jobs never listed"


async def test_acting_on_each_page_lists_every_job_once(app_name: str, broker_url: str) -> None:
    # What Inspector.act_on_state does: act on a page, then ask for the next. The acted-on
    # jobs leave the state before the cursor; main's cursors counted them and skipped as
    # many jobs that had not been listed yet.
    async with connected(app_name, broker_url) as broker:
        waiting = [msg(priority=(0, 5, -3)[i % 3]) for i in range(200)]
        later = [msg(delay=3600.0 + i % 17) for i in range(130)]
        await broker.enqueue(waiting + later)

        async def purge_waiting(ids: list[str]) -> None:
            assert all(await broker.remove(ids, states=[JobState.WAITING]))

        seen = await walk_acting(broker, JobState.WAITING, 7, purge_waiting)
        assert sorted(seen) == sorted(m.id for m in waiting)
        assert await broker.list_jobs("q", JobState.WAITING) == []

        async def cancel(ids: list[str]) -> None:
            for job_id in ids:
                await broker.cancel(job_id)

        seen = await walk_acting(broker, JobState.SCHEDULED, 7, cancel)
        assert sorted(seen) == sorted(m.id for m in later)

        # Finished jobs: each page retried (it leaves ``failed``) while new failures
        # arrive at the front of the state, before the cursor.
        fresh = [msg() for _ in range(200)]
        await broker.enqueue(fresh)
        claimed = await broker.claim(["q"], 200, worker_id="w", lease=300)
        assert len(claimed) == 200
        first, spare = claimed[:150], claimed[150:]
        await broker.fail([Failure(id=c.message.id, token=c.token, error=b"") for c in first])

        async def retry_and_fail_more(ids: list[str]) -> None:
            await broker.retry(ids)
            more, spare[:] = spare[:2], spare[2:]
            await broker.fail([Failure(id=c.message.id, token=c.token, error=b"") for c in more])

        seen = await walk_acting(broker, JobState.FAILED, 7, retry_and_fail_more)
        assert len(seen) == len(set(seen)), "a job listed twice"
        assert {c.message.id for c in first} <= set(seen)


async def test_pages_pass_from_the_levels_to_the_jobs_a_limit_parked(
    app_name: str, broker_url: str
) -> None:
    # Waiting jobs a limit gate parked are listed after the priority levels (on Redis a
    # cursor then names a place in a gate's list); claims of free jobs between pages
    # take from the levels, before the cursor.
    async with connected(app_name, broker_url) as broker:
        broker.set_limits({"t": LimitSpec(rate=1, per_us=60_000_000)})
        gated = [msg(task="t") for _ in range(30)]
        await broker.enqueue(gated)
        assert len(await broker.claim(["q"], 30, worker_id="w", lease=300)) == 1  # 29 parked
        free = [msg(task="other", priority=i % 2) for i in range(40)]
        await broker.enqueue(free)
        waiting = {m.id for m in gated[1:] + free}
        await check_state(broker, JobState.WAITING, waiting)

        claimed: set[str] = set()

        async def claim(_: list[str]) -> None:
            got = await broker.claim(["q"], 3, worker_id="w", lease=300)
            claimed.update(c.message.id for c in got)

        seen = await walk_acting(broker, JobState.WAITING, 4, claim)
        assert len(seen) == len(set(seen)), "a job listed twice"
        assert waiting - claimed <= set(seen)


async def test_claims_from_a_gate_between_pages_overtaking_the_cursor(
    app_name: str, broker_url: str
) -> None:
    # A concurrency limit parks jobs; each slot freed between pages gives the gate's next
    # jobs back to a claim, which takes them past the cursor's own job.
    async with connected(app_name, broker_url) as broker:
        broker.set_limits({"t": LimitSpec(concurrency=6)})
        jobs = [msg(task="t") for _ in range(40)]
        await broker.enqueue(jobs)
        active = await broker.claim(["q"], 40, worker_id="w", lease=300)
        assert len(active) == 6
        claimed = {c.message.id for c in active}

        async def finish_and_claim(_: list[str]) -> None:
            if len(claimed) >= 30:
                return
            await broker.complete([Completion(c.message.id, c.token, b"") for c in active])
            active[:] = await broker.claim(["q"], 40, worker_id="w", lease=300)
            claimed.update(c.message.id for c in active)

        seen = await walk_acting(broker, JobState.WAITING, 4, finish_and_claim)
        assert len(seen) == len(set(seen)), "a job listed twice"
        stayed = {m.id for m in jobs} - claimed
        assert stayed, "some jobs stayed parked throughout"
        assert stayed <= set(seen), f"{len(stayed - set(seen))} parked jobs never listed"
