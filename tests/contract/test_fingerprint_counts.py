"""Broker contract, counting jobs by fingerprint (capability ``FingerprintCounts``,
``typedq verify``'s exact counts): ``count_fingerprints`` pages a queue's state and
answers how many of its jobs carry each ``(task, fingerprint)``, exactly, in every state
(waiting however they are stored: plain, handed back, fair, parked by a limit;
scheduled and retrying; active; final), whatever the page size.

Runs once per broker against the :class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

from collections import Counter

import msgspec
import pytest

from tests.support import connected, msg
from typedq import JobState
from typedq.broker.base import Broker, Completion, Failure, JobMessage, Release
from typedq.broker.capabilities import FingerprintCounts, supports
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

LIMITS = (1, 2, 3, 1000)


def job(
    task: str,
    fingerprint: str,
    *,
    queue: str = "q",
    priority: int = 0,
    delay: float = 0.0,
    fair_key: str = "",
) -> JobMessage:
    return msgspec.structs.replace(
        msg(queue=queue, task=task, priority=priority, delay=delay),
        fingerprint=fingerprint,
        fair_key=fair_key,
        fair_weight=1 if fair_key else 0,
    )


async def count_state(
    broker: Broker, state: JobState, limit: int, queue: str = "q"
) -> Counter[tuple[str, str]]:
    """Every page of ``state`` summed; checks each page's bounds and its job count."""
    total: Counter[tuple[str, str]] = Counter()
    cursor: str | None = None
    for _ in range(10_000):
        page = await broker.count_fingerprints(queue, state, cursor=cursor, limit=limit)
        assert 0 <= page.jobs <= limit
        assert page.jobs == sum(page.counts.values())
        assert all(n > 0 for n in page.counts.values())
        total.update(page.counts)
        if page.cursor is None:
            return total
        cursor = page.cursor
    raise AssertionError("the pages never ended")


async def check_counts(
    broker: Broker, expected: dict[JobState, dict[tuple[str, str], int]], queue: str = "q"
) -> None:
    for state in JobState:
        want = Counter(expected.get(state, {}))
        for limit in LIMITS:
            assert await count_state(broker, state, limit, queue) == want, (state, limit)


async def test_every_state_is_counted_exactly_at_every_page_size(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        assert supports(broker, FingerprintCounts)
        first = [job("a", "f1") for _ in range(6)]
        await broker.enqueue(first)
        claimed = await broker.claim(["q"], 6, worker_id="w", lease=300)
        assert len(claimed) == 6
        done, failed, retrying, handed_back = claimed[0], claimed[1:3], claimed[3], claimed[4]
        await broker.complete([Completion(done.message.id, done.token, b"")])
        await broker.fail([Failure(id=c.message.id, token=c.token, error=b"") for c in failed])
        await broker.fail(
            [Failure(id=retrying.message.id, token=retrying.token, error=b"", retry_delay=3600)]
        )
        # Waiting again, as a job with a key of its own (on Redis a bare list entry).
        await broker.release([Release(handed_back.message.id, handed_back.token)])

        waiting = [job("a", "f1") for _ in range(7)]
        waiting += [job("a", "f0", priority=5) for _ in range(3)]
        waiting += [job("b", "") for _ in range(2)]
        later = [job("a", "f0", delay=3600) for _ in range(4)]
        await broker.enqueue(waiting + later)
        fair = [job("b", "f2", fair_key=k) for k in ("k1", "k1", "k2")]
        await broker.enqueue(fair)
        await broker.cancel(waiting[10].id)  # a ("b", "") job
        # Another queue's jobs are not this queue's.
        await broker.enqueue([job("a", "f1", queue="other") for _ in range(5)])

        await check_counts(
            broker,
            {
                JobState.WAITING: {
                    ("a", "f1"): 8,
                    ("a", "f0"): 3,
                    ("b", ""): 1,
                    ("b", "f2"): 3,
                },
                JobState.SCHEDULED: {("a", "f0"): 4, ("a", "f1"): 1},
                JobState.ACTIVE: {("a", "f1"): 1},
                JobState.COMPLETED: {("a", "f1"): 1},
                JobState.FAILED: {("a", "f1"): 2},
                JobState.CANCELLED: {("b", ""): 1},
            },
        )
        await check_counts(broker, {JobState.WAITING: {("a", "f1"): 5}}, queue="other")
        await check_counts(broker, {}, queue="empty")


async def test_jobs_parked_by_a_limit_are_counted_as_waiting(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        broker.set_limits({"r": LimitSpec(rate=1, per_us=60_000_000)})
        await broker.enqueue([job("r", "f1") for _ in range(4)] + [job("r", "f0")])
        (started,) = await broker.claim(["q"], 5, worker_id="w", lease=300)
        assert await broker.claim(["q"], 5, worker_id="w", lease=300) == []  # the rest parked
        parked: Counter[tuple[str, str]] = Counter({("r", "f1"): 4, ("r", "f0"): 1})
        parked[("r", started.message.fingerprint)] -= 1
        await check_counts(
            broker,
            {
                JobState.WAITING: dict(+parked),
                JobState.ACTIVE: {("r", started.message.fingerprint): 1},
            },
        )


async def test_a_bad_cursor_is_refused(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        for state in (JobState.WAITING, JobState.SCHEDULED, JobState.ACTIVE, JobState.FAILED):
            with pytest.raises(ValueError, match="invalid page cursor 'x'"):
                await broker.count_fingerprints("q", state, cursor="x")


async def test_jobs_that_left_and_came_back_are_counted_once(
    app_name: str, broker_url: str
) -> None:
    """Cancelling waiting jobs leaves stale entries in Redis's waiting lists, and
    retrying some of them puts a second entry of the same id behind the first (as in
    test_paging): each job is counted once, where it is."""
    async with connected(app_name, broker_url) as broker:
        messages = [job("a", ("f0", "f1")[i % 2], priority=(0, 5)[i % 3 == 0]) for i in range(200)]
        await broker.enqueue(messages)
        cancelled = messages[::9]
        for m in cancelled:
            await broker.cancel(m.id)
        retried = cancelled[:10]
        await broker.retry([m.id for m in retried])
        waiting: Counter[tuple[str, str]] = Counter()
        for m in messages:
            if m not in cancelled or m in retried:
                waiting[(m.task, m.fingerprint)] += 1
        gone = Counter((m.task, m.fingerprint) for m in cancelled if m not in retried)
        for limit in (1, 7, 1000):
            assert await count_state(broker, JobState.WAITING, limit) == waiting
            assert await count_state(broker, JobState.CANCELLED, limit) == gone
