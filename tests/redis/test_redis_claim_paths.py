"""claim.lua's paths that a worker's steady state (one queue, one settle group) does not
take: a settle section over several queues (several settle groups), a claim that
compares the heads of several queues, and a re-sent settle-and-claim (its claim record).

Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

import pytest

from tests.redis_support import broker_at, message
from typedq.broker.base import Completion, FinishOutcome, JobState

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


async def test_a_settle_over_two_queues_then_a_claim_over_both(redis_url: str) -> None:
    """Completions in two queues (two settle groups) are settled, each queue's counts
    exact, and the claim takes the best head across both queues (priority, then age)."""
    async with broker_at(redis_url, "paths") as broker:
        await broker.enqueue([message("a1", queue="qa"), message("b1", queue="qb")])
        await broker.enqueue([message("a2", queue="qa"), message("b3", queue="qb")])
        await broker.enqueue([message("b2", queue="qb", priority=5), message("a3", queue="qa")])
        first = await broker.claim(["qa"], 1, worker_id="w", lease=30)
        second = await broker.claim(["qb"], 2, worker_id="w", lease=30)
        assert [j.message.id for j in first] == ["a1"]
        assert [j.message.id for j in second] == ["b2", "b1"]
        done = [Completion(j.message.id, j.token, b"\xc0") for j in first + second]
        stale = Completion("a2", "not-its-token", b"\xc0")
        outcomes, jobs = await broker.complete_and_claim(
            [*done, stale], ["qa", "qb"], 2, worker_id="w", lease=30
        )
        assert outcomes == [FinishOutcome.OK] * 3 + [FinishOutcome.LEASE_LOST]
        # Equal priority: the older head first (a2, then b3 of the same enqueue, then a3).
        assert [j.message.id for j in jobs] == ["a2", "b3"]
        assert [j.message.queue for j in jobs] == ["qa", "qb"]
        for got in await broker.get(["a1"], queue="qa") + await broker.get(["b1", "b2"]):
            assert got is not None
            assert got.state is JobState.COMPLETED
        qa, qb = await broker.counts("qa"), await broker.counts("qb")
        assert (qa[JobState.COMPLETED], qa[JobState.ACTIVE], qa[JobState.WAITING]) == (1, 1, 1)
        assert (qb[JobState.COMPLETED], qb[JobState.ACTIVE], qb[JobState.WAITING]) == (2, 1, 0)


async def test_a_resent_settle_and_claim_answers_as_before(redis_url: str) -> None:
    """The same settle-and-claim sent twice (same claim id: a lost reply): the second
    answers the completion ALREADY_FINISHED and hands back the same jobs and tokens,
    claiming nothing more and counting nothing twice."""
    async with broker_at(redis_url, "paths") as broker:
        await broker.enqueue([message(f"j{i}") for i in range(5)])
        (held,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        done = [Completion(held.message.id, held.token, b"\xc0")]
        claim_id = "0123456789abcdef"
        outcomes, jobs = await broker.complete_and_claim(
            done, ["q"], 2, worker_id="w", lease=30, claim_id=claim_id
        )
        again, jobs_again = await broker.complete_and_claim(
            done, ["q"], 2, worker_id="w", lease=30, claim_id=claim_id
        )
        assert outcomes == [FinishOutcome.OK]
        assert again == [FinishOutcome.ALREADY_FINISHED]
        assert [j.message.id for j in jobs] == ["j1", "j2"]
        assert [(j.message.id, j.token) for j in jobs_again] == [
            (j.message.id, j.token) for j in jobs
        ]
        counts = await broker.counts("q")
        got = (counts[JobState.COMPLETED], counts[JobState.ACTIVE], counts[JobState.WAITING])
        assert got == (1, 2, 2)
