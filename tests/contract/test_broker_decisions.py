"""Broker contract: the answers both brokers must agree on (issue 7, defects 8 and 10).

Each test pins one shared decision (see the reliability notes) on every broker:

- D-stale: a job never changes its claim position through a stale queue entry;
- D-retry-token: after ``retry()`` every earlier token answers LEASE_LOST;
- D-dup-in-batch: a repeated id in one batch is created once and never causes QueueFull;
- D-fifo: one ``enqueue_many`` is claimed in input order, however it is chunked.
"""

from __future__ import annotations

import time

import anyio
import pytest

from tests.support import TEST_DEADLINE, claim_one, connected, count, msg, one, sleep_until
from typedq import App, JobState, QueueFull
from typedq.broker.base import (
    Broker,
    CancelOutcome,
    Completion,
    Failure,
    FinishOutcome,
    Release,
    RetryOutcome,
    new_claim_id,
)

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

#: A lease token no claim ever handed out.
STRANGER = "not-a-claim-token"


async def claim_all(broker: Broker, limit: int = 1000) -> list[str]:
    """Ids of every claimable job of queue ``q``, in claim order (several claims)."""
    ids: list[str] = []
    while batch := await broker.claim(["q"], 100, worker_id="w", lease=60):
        ids.extend(c.message.id for c in batch)
        assert len(ids) <= limit, "claimed more jobs than were enqueued"
    return ids


# -- D-stale ----------------------------------------------------------------------


@pytest.mark.parametrize("how", ["remove", "cancel-then-remove"])
async def test_reused_scheduled_id_waits_for_its_own_run_at(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        (first,) = await broker.enqueue([msg(job_id="s", delay=0.3)])
        assert first.created
        if how == "cancel-then-remove":
            assert await broker.cancel("s") is CancelOutcome.CANCELLED
        assert await broker.remove(["s"]) == [True]
        started = time.time()
        (again,) = await broker.enqueue([msg(job_id="s", delay=3600)])
        assert again.created
        # Past the old job's run_at: its queue entry must not make the new job due.
        await sleep_until(started + 0.3, margin=0.3)
        assert await broker.claim(["q"], 10, worker_id="w", lease=60) == []
        record = await one(broker, "s")
        assert record.state is JobState.SCHEDULED
        assert record.run_at >= started + 3000
        assert count(await broker.counts("q"), JobState.SCHEDULED) == 1


@pytest.mark.parametrize(("old", "new"), [(0, -5), (5, 0), (0, 0), (-5, 5), (0, 5)])
@pytest.mark.parametrize("how", ["remove", "cancel-then-remove"])
async def test_reused_waiting_id_is_claimed_where_a_fresh_job_would_be(
    app_name: str, broker_url: str, how: str, old: int, new: int
) -> None:
    async with connected(app_name, broker_url) as broker:
        # Enqueue order a, x (old), b, x (new), c: each in its own call.
        await broker.enqueue([msg(job_id="a")])
        await broker.enqueue([msg(job_id="x", priority=old)])
        await broker.enqueue([msg(job_id="b")])
        if how == "cancel-then-remove":
            assert await broker.cancel("x") is CancelOutcome.CANCELLED
        assert await broker.remove(["x"]) == [True]
        (again,) = await broker.enqueue([msg(job_id="x", priority=new)])
        assert again.created
        await broker.enqueue([msg(job_id="c")])
        fresh = [("a", 0), ("b", 0), ("x", new), ("c", 0)]  # in enqueue order
        expected = [job_id for job_id, _ in sorted(fresh, key=lambda jp: -jp[1])]  # stable
        assert await claim_all(broker) == expected
        assert count(await broker.counts("q"), JobState.ACTIVE) == 4


async def test_retried_cancelled_job_goes_to_the_back(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        for job_id in ("a", "x", "b"):
            await broker.enqueue([msg(job_id=job_id)])
        assert await broker.cancel("x") is CancelOutcome.CANCELLED
        await broker.enqueue([msg(job_id="c")])
        assert await broker.retry(["x"]) == [RetryOutcome.RETRIED]
        # A retried job is waiting at the tail of its level, not at its old place.
        assert await claim_all(broker) == ["a", "b", "c", "x"]


async def test_reused_id_is_claimed_once(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="x", priority=3)])
        assert await broker.remove(["x"]) == [True]
        await broker.enqueue([msg(job_id="x", priority=3)])
        first = await claim_one(broker)
        assert first.message.id == "x"
        assert first.attempt == 1
        assert await broker.complete([Completion("x", first.token, b"")]) == [FinishOutcome.OK]
        # No leftover entry hands the finished job out again.
        assert await broker.claim(["q"], 10, worker_id="w", lease=60) == []
        assert (await one(broker, "x")).state is JobState.COMPLETED


# -- D-retry-token ----------------------------------------------------------------


@pytest.mark.parametrize("end", ["failed", "cancelled"])
async def test_token_from_before_retry_is_lease_lost(
    app_name: str, broker_url: str, end: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="r")])
        old = await claim_one(broker)
        failure = Failure(id="r", token=old.token, error=b"\x90", cancelled=end == "cancelled")
        assert await broker.fail([failure]) == [FinishOutcome.OK]
        # Before the retry a re-send is recognised as such.
        assert await broker.fail([failure]) == [FinishOutcome.ALREADY_FINISHED]
        assert await broker.retry(["r"]) == [RetryOutcome.RETRIED]

        stale_complete = Completion("r", old.token, b"stale")
        assert await broker.complete([stale_complete]) == [FinishOutcome.LEASE_LOST]
        assert await broker.fail([failure]) == [FinishOutcome.LEASE_LOST]
        assert await broker.release([Release("r", old.token)]) == [FinishOutcome.LEASE_LOST]
        record = await one(broker, "r")
        assert record.state is JobState.WAITING
        assert record.attempt == 0

        # Still LEASE_LOST while the new attempt runs, and it does not disturb it.
        new = await claim_one(broker)
        assert new.attempt == 1
        assert await broker.complete([stale_complete]) == [FinishOutcome.LEASE_LOST]
        assert await broker.complete([Completion("r", new.token, b"ok")]) == [FinishOutcome.OK]
        assert await broker.complete([stale_complete]) == [FinishOutcome.LEASE_LOST]
        assert await broker.complete([Completion("r", new.token, b"ok")]) == [
            FinishOutcome.ALREADY_FINISHED
        ]
        done = await one(broker, "r")
        assert done.state is JobState.COMPLETED
        assert done.result == b"ok"


# -- D-dup-in-batch ---------------------------------------------------------------


async def test_repeated_id_in_a_batch_at_max_queue_length(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=3) as broker:
        await broker.enqueue([msg(job_id="old")])
        batch = [msg(job_id=i) for i in ("a", "b", "a", "old", "b", "a")]
        outcomes = await broker.enqueue(batch)  # 2 created: exactly at the bound
        assert [(o.id, o.created) for o in outcomes] == [
            ("a", True),
            ("b", True),
            ("a", False),
            ("old", False),
            ("b", False),
            ("a", False),
        ]
        assert count(await broker.counts("q"), JobState.WAITING) == 3
        # The first occurrence is the one stored.
        assert (await one(broker, "a")).message == batch[0]
        # Now full: a batch creating one more job is refused whole.
        with pytest.raises(QueueFull):
            await broker.enqueue([msg(job_id="c"), msg(job_id="c")])
        assert await broker.get(["c"]) == [None]


async def test_repeated_id_alone_fills_one_slot(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=1) as broker:
        outcomes = await broker.enqueue([msg(job_id="d") for _ in range(5)])
        assert [o.created for o in outcomes] == [True, False, False, False, False]
        assert count(await broker.counts("q"), JobState.WAITING) == 1


# -- D-fifo -----------------------------------------------------------------------


async def test_enqueue_many_is_claimed_in_input_order(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            # Large enough to go in several chunks; equal priority, so input order rules.
            messages = [msg(job_id=f"f{i:05d}-{(i * 7919) % 2500}") for i in range(2_500)]
            outcomes = await app.client.enqueue_many(messages)
            assert [o.id for o in outcomes] == [m.id for m in messages]
            assert all(o.created for o in outcomes)
            assert await claim_all(app.broker, limit=2_500) == [m.id for m in messages]


# -- hand-backs keep their place; finishes of unclaimed jobs ------------------------


@pytest.mark.parametrize("how", ["release", "release-then-recover"])
async def test_jobs_handed_back_one_call_at_a_time_keep_their_order(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        for job_id in ("a", "b", "c"):
            await broker.enqueue([msg(job_id=job_id)])
        short = 0.001 if how == "release-then-recover" else 60
        claimed = await broker.claim(["q"], 2, worker_id="w", lease=60)
        assert [c.message.id for c in claimed] == ["a", "b"]
        a, b = claimed
        # `a` comes back first, then `b` in another call (a release, or a recovery of
        # an expired lease): both must be claimed before `c`, oldest first.
        assert await broker.release([Release("a", a.token)]) == [FinishOutcome.OK]
        if how == "release":
            assert await broker.release([Release("b", b.token)]) == [FinishOutcome.OK]
        else:
            assert await broker.renew([("b", b.token)], short) is not None
            await anyio.sleep(0.05)
            assert await broker.recover_stalled() == 1
        assert await claim_all(broker) == ["a", "b", "c"]


async def test_a_finish_of_a_job_never_claimed_is_lease_lost(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="x"), msg(job_id="later", delay=3600)])
        for job_id in ("x", "later"):
            assert await broker.complete([Completion(job_id, STRANGER, b"")]) == [
                FinishOutcome.LEASE_LOST
            ]
            assert await broker.fail([Failure(id=job_id, token=STRANGER, error=b"")]) == [
                FinishOutcome.LEASE_LOST
            ]
            assert await broker.release([Release(job_id, STRANGER)]) == [FinishOutcome.LEASE_LOST]
        assert await broker.complete([Completion("missing", STRANGER, b"")]) == [
            FinishOutcome.NOT_FOUND
        ]
        assert count(await broker.counts("q"), JobState.WAITING) == 1
        assert count(await broker.counts("q"), JobState.SCHEDULED) == 1


# -- claims are idempotent per claim (defect 1) --------------------------------------


async def test_a_claim_resent_with_its_id_returns_its_own_jobs(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id=f"j{i}") for i in range(6)])
        first_id, second_id = new_claim_id(), new_claim_id()
        first = await broker.claim(["q"], 2, worker_id="w", lease=60, claim_id=first_id)
        # A sibling claim of the same worker runs in between (complete_and_claim, say).
        second = await broker.claim(["q"], 2, worker_id="w", lease=60, claim_id=second_id)
        assert [c.message.id for c in first] == ["j0", "j1"]
        assert [c.message.id for c in second] == ["j2", "j3"]
        # The first claim's answer was lost: re-sent with its id, it returns its own
        # jobs with the same tokens, and claims nothing new.
        again = await broker.claim(["q"], 2, worker_id="w", lease=60, claim_id=first_id)
        assert [(c.message.id, c.token, c.attempt) for c in again] == [
            (c.message.id, c.token, c.attempt) for c in first
        ]
        # Once one of them is finished, a re-send returns only what is still held.
        assert await broker.complete([Completion("j0", first[0].token, b"")]) == [FinishOutcome.OK]
        again = await broker.claim(["q"], 2, worker_id="w", lease=60, claim_id=first_id)
        assert [c.message.id for c in again] == ["j1"]
        assert count(await broker.counts("q"), JobState.WAITING) == 2
        assert count(await broker.counts("q"), JobState.ACTIVE) == 3
        # A malformed id is refused before anything is claimed.
        with pytest.raises(ValueError, match="claim id"):
            await broker.claim(["q"], 1, worker_id="w", lease=60, claim_id="j0:{x}")
        assert count(await broker.counts("q"), JobState.WAITING) == 2


async def test_a_call_over_several_queues_refused_for_one_stores_nothing(
    app_name: str, broker_url: str
) -> None:
    """Issue 24: a call storing jobs in several queues of which one is full is refused
    whole. Redis Cluster (each queue on its own slot, stored by its own script) stored
    the other queues' jobs; found by the combined model check."""
    async with connected(app_name, broker_url, max_queue_length=1) as broker:
        await broker.enqueue([msg(queue="b", job_id="b1")])
        batch = [msg(queue=f"a{i}", job_id=f"a{i}") for i in range(5)]
        with pytest.raises(QueueFull, match="'b' holds 1 pending jobs; adding 1"):
            await broker.enqueue([*batch, msg(queue="b", job_id="b2")])
        assert await broker.get([m.id for m in batch] + ["b2"]) == [None] * 6
        # An id the full queue already holds is not created again: the call passes.
        outcomes = await broker.enqueue([*batch, msg(queue="b", job_id="b1")])
        assert [o.created for o in outcomes] == [True] * 5 + [False]
