"""Broker contract, history: every attempt's FailureRecord on the job record, and the
per-queue per-minute throughput rollups (``Broker.history``) the dashboard charts.

Runs once per broker against the :class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

import time

import pytest

from tests.support import claim_one, connected, msg, one
from typedq import JobState
from typedq.broker.base import ERROR_HISTORY, HISTORY_MINUTES, Completion, Failure

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def test_every_failed_attempt_keeps_its_record_oldest_first(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        m = msg()
        await broker.enqueue([m])
        for attempt in range(3):
            job = await claim_one(broker)
            last = attempt == 2
            await broker.fail(
                [
                    Failure(
                        id=m.id,
                        token=job.token,
                        error=f"err-{attempt}".encode(),
                        retry_delay=None if last else 0.0,
                    )
                ]
            )
        record = await one(broker, m.id)
        assert record.state is JobState.FAILED
        assert record.errors == (b"err-0", b"err-1", b"err-2")
        assert record.error == b"err-2"
        # A retry clears the job's error but keeps the history of its attempts.
        await broker.retry([m.id])
        record = await one(broker, m.id)
        assert record.error is None
        assert record.errors == (b"err-0", b"err-1", b"err-2")


async def test_the_error_history_is_bounded(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        m = msg()
        await broker.enqueue([m])
        for attempt in range(ERROR_HISTORY + 3):
            job = await claim_one(broker)
            error = f"err-{attempt}".encode()
            await broker.fail([Failure(id=m.id, token=job.token, error=error, retry_delay=0.0)])
        record = await one(broker, m.id)
        assert record.errors == tuple(f"err-{i}".encode() for i in range(3, ERROR_HISTORY + 3))


async def test_a_job_that_never_failed_has_no_error_history(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        m = msg()
        await broker.enqueue([m])
        assert (await one(broker, m.id)).errors == ()
        job = await claim_one(broker)
        await broker.complete([Completion(m.id, job.token, b"\xc0")])
        assert (await one(broker, m.id)).errors == ()


async def test_history_counts_completions_failures_and_retries_per_queue(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        ok = [msg(queue="a") for _ in range(3)]
        bad = msg(queue="a")
        other = msg(queue="b")
        await broker.enqueue([*ok, bad, other])
        jobs = await broker.claim(["a"], 4, worker_id="w", lease=30)
        done = [Completion(j.message.id, j.token, b"\xc0") for j in jobs if j.message.id != bad.id]
        await broker.complete(done)
        (b,) = [j for j in jobs if j.message.id == bad.id]
        await broker.fail([Failure(id=bad.id, token=b.token, error=b"x", retry_delay=0.0)])
        b = await claim_one(broker, "a")
        await broker.fail([Failure(id=bad.id, token=b.token, error=b"y")])
        before = time.time()
        a_rows, b_rows, none_rows = await broker.history(["a", "b", "none"], minutes=5)
        assert len(a_rows) == len(b_rows) == len(none_rows) == 5
        # Oldest first, one per minute, the current minute last.
        assert [r.minute for r in a_rows] == [a_rows[0].minute + 60 * i for i in range(5)]
        assert a_rows[-1].minute <= before < a_rows[-1].minute + 120
        assert sum(r.completed for r in a_rows) == 3
        assert sum(r.failed for r in a_rows) == 1
        assert sum(r.retried for r in a_rows) == 1
        assert all(r.completed == r.failed == r.retried == 0 for r in b_rows + none_rows)


async def test_history_refuses_a_window_past_its_bound(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        assert len((await broker.history(["q"], minutes=HISTORY_MINUTES))[0]) == HISTORY_MINUTES
        with pytest.raises(ValueError, match="minutes must be 1 to 1440"):
            await broker.history(["q"], minutes=HISTORY_MINUTES + 1)
        assert await broker.history([]) == []
