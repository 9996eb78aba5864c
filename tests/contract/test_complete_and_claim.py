"""complete_and_claim: the slots a worker frees are refilled in the same round trip."""

from __future__ import annotations

import pytest

from tests.support import claim_one, connected, count, msg, one
from typedq import JobState
from typedq.broker.base import Completion, FinishOutcome

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def test_completes_first_then_claims_up_to_the_limit(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        first, second, third, fourth = (msg() for _ in range(4))
        await broker.enqueue([first, second, third, fourth])
        claimed = await claim_one(broker)
        assert claimed.message.id == first.id
        outcomes, jobs = await broker.complete_and_claim(
            [Completion(first.id, claimed.token, b"\xc0")], ["q"], 2, worker_id="w1", lease=30
        )
        assert outcomes == [FinishOutcome.OK]
        assert [j.message.id for j in jobs] == [second.id, third.id]  # FIFO, at most 2
        assert (await one(broker, first.id)).state is JobState.COMPLETED
        counts = await broker.counts("q")
        assert count(counts, JobState.ACTIVE) == 2
        assert count(counts, JobState.WAITING) == 1


async def test_a_stale_completion_is_refused_and_the_claim_still_happens(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        job, other = msg(), msg()
        await broker.enqueue([job, other])
        claimed = await claim_one(broker)
        outcomes, jobs = await broker.complete_and_claim(
            [Completion(job.id, "not-the-token", b"\xc0")], ["q"], 1, worker_id="w1", lease=30
        )
        assert outcomes == [FinishOutcome.LEASE_LOST]
        assert [j.message.id for j in jobs] == [other.id]
        assert (await one(broker, job.id)).state is JobState.ACTIVE
        # Re-sending the real completion later still works once.
        assert await broker.complete([Completion(job.id, claimed.token, b"\xc0")]) == [
            FinishOutcome.OK
        ]


async def test_limit_zero_only_completes(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        job, other = msg(), msg()
        await broker.enqueue([job, other])
        claimed = await claim_one(broker)
        outcomes, jobs = await broker.complete_and_claim(
            [Completion(job.id, claimed.token, b"\xc0")], ["q"], 0, worker_id="w1", lease=30
        )
        assert outcomes == [FinishOutcome.OK]
        assert jobs == []
        assert (await one(broker, other.id)).state is JobState.WAITING
