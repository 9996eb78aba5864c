"""Redis broker regressions of issue 7: re-sent scripts answer as their first copy,
claims are idempotent per claim, stale queue entries never move a job, odd numbers
never poison a settle batch, and the shared decisions (retry tokens, duplicates in a
batch, FIFO across the batches of one enqueue_many).

Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest

from tests import redis_support
from tests.redis_support import (
    STALL_SOCKET_TIMEOUT,
    Item,
    message,
    raw_redis,
    with_socket_timeout,
)
from typedq import App, JobState, QueueFull
from typedq.broker.base import (
    CancelOutcome,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    RetryOutcome,
)
from typedq.broker.redis import RedisBroker
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@contextlib.asynccontextmanager
async def broker_at(url: str, name: str = "rel", **settings: Any) -> AsyncIterator[RedisBroker]:
    async with redis_support.broker_at(url, name, deadline=60, **settings) as broker:
        yield broker


@contextlib.contextmanager
def tokens(monkeypatch: pytest.MonkeyPatch, *values: str) -> Iterator[None]:
    """The request tokens the broker makes next, in order (a re-send reuses one)."""
    it = iter(values)
    for where in ("enqueue", "leases"):  # the modules whose scripts take a request token
        monkeypatch.setattr(f"typedq.broker.redis.{where}._request_token", lambda: next(it))
    try:
        yield
    finally:
        monkeypatch.undo()


async def claim_all(broker: RedisBroker, queue: str = "q", batch: int = 1) -> list[str]:
    """Ids in claim order, claiming ``batch`` at a time until nothing is left."""
    order: list[str] = []
    while jobs := await broker.claim([queue], batch, worker_id="w", lease=30):
        order += [j.message.id for j in jobs]
    return order


# -- defect 1: a claim is idempotent per claim, not per worker ------------------------


async def test_a_resent_claim_after_a_sibling_claim_returns_its_own_jobs(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message(f"j{i}") for i in range(20)])
        with tokens(monkeypatch, "c1c1c1c1", "c2c2c2c2"):
            first = await broker.claim(["q"], 3, worker_id="w", lease=30)
            second = await broker.claim(["q"], 3, worker_id="w", lease=30)
        assert [c.message.id for c in first] == ["j0", "j1", "j2"]
        assert [c.message.id for c in second] == ["j3", "j4", "j5"]
        # The first claim's reply was lost and redis-py sends it again, after the second
        # claim of the same worker ran: it must hand back the first claim's jobs.
        with tokens(monkeypatch, "c1c1c1c1"):
            again = await broker.claim(["q"], 3, worker_id="w", lease=30)
        assert [(c.message.id, c.token, c.attempt) for c in again] == [
            (c.message.id, c.token, c.attempt) for c in first
        ]
        assert (await broker.counts("q"))[JobState.ACTIVE] == 6
        # The same through complete_and_claim's pipelined claim.
        with tokens(monkeypatch, "c3c3c3c3"):
            done, refill = await broker.complete_and_claim(
                [Completion(c.message.id, c.token, b"") for c in first],
                ["q"],
                2,
                worker_id="w",
                lease=30,
            )
        assert done == [FinishOutcome.OK] * 3
        assert [c.message.id for c in refill] == ["j6", "j7"]
        await broker.claim(["q"], 1, worker_id="w", lease=30)  # a sibling claim meanwhile
        with tokens(monkeypatch, "c3c3c3c3", "c1c1c1c1"):
            assert [c.token for c in await broker.claim(["q"], 2, worker_id="w", lease=30)] == [
                c.token for c in refill
            ]
            # The first claim's jobs are finished: its re-send returns nothing, claims nothing.
            assert await broker.claim(["q"], 3, worker_id="w", lease=30) == []
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 3 + 2 + 1
        assert counts[JobState.WAITING] == 20 - 3 - 3 - 2 - 1


@pytest.mark.slow
async def test_two_claims_of_one_worker_resent_after_a_stall_orphan_nothing(redis_url: str) -> None:
    """DEBUG SLEEP past the socket timeout with two claims of one worker in flight:
    redis-py re-sends both after both first copies ran; each re-send must hand back
    its own first copy's jobs (a record per worker made one of them claim more)."""
    async with (
        broker_at(with_socket_timeout(redis_url)) as broker,
        raw_redis(redis_url, socket_timeout=30) as raw,
    ):
        await broker.enqueue([message(f"j{i}") for i in range(20)])
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(broker.counts, "q")
        await raw.config_resetstat()
        claims: list[list[str]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(raw.execute_command, "DEBUG", "SLEEP", str(STALL_SOCKET_TIMEOUT + 1))
            await anyio.sleep(0.1)

            async def claim() -> None:
                jobs = await broker.claim(["q"], 3, worker_id="w", lease=60)
                claims.append([j.message.id for j in jobs])

            tg.start_soon(claim)
            tg.start_soon(claim)
        stats = await raw.info("commandstats")
        assert int(stats["cmdstat_fcall"]["calls"]) == 4  # both claims were re-sent
        active = await broker.list_jobs("q", JobState.ACTIVE)
        returned = [i for ids in claims for i in ids]
        assert len(returned) == 6
        # Every claimed job is one the worker knows of: nothing sits claimed unseen.
        assert sorted(active) == sorted(returned)


@pytest.mark.slow
async def test_client_kill_loop_runs_every_job_once_without_stalls(redis_url: str) -> None:
    """CLIENT KILL TYPE normal every 200 ms while a worker drains 1,200 jobs with
    max_stalls=0: a stall would fail a job as `stalled` without running it."""
    app = App("ckill", broker=redis_url, lease=10.0, max_stalls=0)
    ran: dict[str, int] = {}

    @app.task
    async def work(item: Item) -> Item:
        key = str(item.n)
        ran[key] = ran.get(key, 0) + 1
        await anyio.sleep(0.02)  # about 3 s in all: some 15 kills land mid-run
        return item

    total = 1200
    kills = 0
    async with app, raw_redis(redis_url) as admin:
        broker = app.broker
        jobs = await work.enqueue_many([Item(n=i) for i in range(total)])

        kill: Any = admin.execute_command  # untyped in redis-py

        async def killer() -> None:
            nonlocal kills
            while True:
                await anyio.sleep(0.2)
                kills += int(await kill("CLIENT", "KILL", "TYPE", "normal"))

        with anyio.fail_after(180):
            async with app.worker(concurrency=8), anyio.create_task_group() as tg:
                tg.start_soon(killer)
                # Polling is fine: the worker changes the state, under connection kills.
                while True:
                    with contextlib.suppress(Exception):
                        counts = await broker.counts(DEFAULT_QUEUE)
                        if counts[JobState.COMPLETED] + counts[JobState.FAILED] >= total:
                            break
                    await anyio.sleep(0.2)
                tg.cancel_scope.cancel()
        counts = await broker.counts(DEFAULT_QUEUE)
        records = []
        for start in range(0, total, 500):
            records += await broker.get([j.id for j in jobs[start : start + 500]])
    assert kills > 10
    assert counts[JobState.FAILED] == 0
    assert counts[JobState.COMPLETED] == total
    assert all(r is not None and r.state is JobState.COMPLETED for r in records)
    assert sum(r.stalls for r in records if r is not None) == 0
    assert sorted(ran, key=int) == [str(i) for i in range(total)]
    assert set(ran.values()) == {1}


# -- defect 11: re-sent scripts return the first answer ---------------------------------


async def test_a_resent_enqueue_answers_created_for_what_it_created(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("old")])
        batch = [message("old"), message("a"), message("b"), message("a")]
        with tokens(monkeypatch, "e1e1e1e1", "e1e1e1e1", "e2e2e2e2"):
            first = await broker.enqueue(batch)
            again = await broker.enqueue(batch)  # the same call, re-sent
            other = await broker.enqueue(batch)  # a new call: everything exists
        assert [o.created for o in first] == [False, True, True, False]
        assert again == first
        assert not any(o.created for o in other)
        assert (await broker.counts("q"))[JobState.WAITING] == 3


async def test_a_resent_cancel_answers_cancelled(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a"), message("b")])
        with tokens(monkeypatch, "x1x1x1x1", "x1x1x1x1", "x2x2x2x2"):
            assert await broker.cancel("a") is CancelOutcome.CANCELLED
            assert await broker.cancel("a") is CancelOutcome.CANCELLED  # re-sent
            assert await broker.cancel("a") is CancelOutcome.ALREADY_FINAL  # a new call
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert job.message.id == "b"
        with tokens(monkeypatch, "x3x3x3x3", "x3x3x3x3"):
            assert await broker.cancel("b") is CancelOutcome.REQUESTED
            assert await broker.complete([Completion("b", job.token, b"")]) == [FinishOutcome.OK]
            assert await broker.cancel("b") is CancelOutcome.REQUESTED  # re-sent
        counts = await broker.counts("q")
        assert counts[JobState.CANCELLED] == 1
        assert counts[JobState.COMPLETED] == 1


@pytest.mark.slow
async def test_replies_lost_in_a_server_stall_are_answered_as_the_first_time(
    redis_url: str,
) -> None:
    """DEBUG SLEEP past the socket timeout: redis-py sends cancel and enqueue again
    after their first copies ran; the answers are still CANCELLED and created=True."""
    async with (
        broker_at(with_socket_timeout(redis_url)) as broker,
        raw_redis(redis_url, socket_timeout=30) as raw,
    ):
        await broker.enqueue([message("victim")])
        fresh = [message(f"n{i}") for i in range(10)]
        # Open pooled connections first, so both scripts are sent before the stall.
        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(broker.counts, "q")
        await raw.config_resetstat()
        results: dict[str, Any] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(raw.execute_command, "DEBUG", "SLEEP", str(STALL_SOCKET_TIMEOUT + 1))
            await anyio.sleep(0.1)

            async def cancel() -> None:
                results["cancel"] = await broker.cancel("victim", queue="q")

            async def enqueue() -> None:
                results["enqueue"] = await broker.enqueue(fresh)

            tg.start_soon(cancel)
            tg.start_soon(enqueue)
        stats = await raw.info("commandstats")
        # Both scripts ran twice: the stall outlasted the socket timeout.
        assert int(stats["cmdstat_fcall"]["calls"]) == 4
        assert results["cancel"] is CancelOutcome.CANCELLED
        assert [o.created for o in results["enqueue"]] == [True] * 10
        counts = await broker.counts("q")
        assert counts[JobState.WAITING] == 10
        assert counts[JobState.CANCELLED] == 1


# -- defect 5: odd numbers never poison a settle batch ----------------------------------


async def test_a_non_finite_retry_delay_never_fails_its_batch(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message(f"j{i}") for i in range(4)])
        jobs = await broker.claim(["q"], 4, worker_id="w", lease=30)
        delays = [math.inf, math.nan, 1e300, None]
        outcomes = await broker.fail(
            [
                Failure(id=j.message.id, token=j.token, error=b"e", retry_delay=d)
                for j, d in zip(jobs, delays, strict=True)
            ]
        )
        assert outcomes == [FinishOutcome.OK] * 4
        records = await broker.get([j.message.id for j in jobs])
        states = [r.state if r is not None else None for r in records]
        # inf and 1e300: scheduled at the latest time there is; NaN: at once.
        assert states == [JobState.SCHEDULED, JobState.WAITING, JobState.SCHEDULED, JobState.FAILED]
        assert all(r is not None and r.error == b"e" for r in records)
        inf_record = records[0]
        assert inf_record is not None
        assert inf_record.run_at > time.time() + 50 * 365 * 86400


# -- defect 8: stale entries never move a job (D-stale) ---------------------------------


async def make_waiting(broker: RedisBroker, leave: str) -> None:
    """Jobs a, x, b waiting in that order (x as a job hash for 'retried-*')."""
    if leave.startswith("retried"):
        await broker.enqueue([message("x")])
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.fail([Failure(id="x", token=job.token, error=b"e")])
        await broker.enqueue([message("a")])
        assert await broker.retry(["x"]) == [RetryOutcome.RETRIED]
        await broker.enqueue([message("b")])
    else:
        await broker.enqueue([message("a"), message("x"), message("b")])
    assert await broker.list_jobs("q", JobState.WAITING) == ["a", "x", "b"]


@pytest.mark.parametrize("leave", ["cancel", "remove", "retried-cancel", "retried-remove"])
@pytest.mark.parametrize("priority", [-5, 0, 5])
async def test_a_reused_id_is_claimed_where_a_fresh_job_would_be(
    redis_url: str, leave: str, priority: int
) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await make_waiting(broker, leave)
        if leave.endswith("cancel"):
            assert await broker.cancel("x") is CancelOutcome.CANCELLED
        assert await broker.remove(["x"]) == [True]
        await broker.enqueue([message("x", priority=priority)])
        await broker.enqueue([message("c")])
        listed = await broker.list_jobs("q", JobState.WAITING)
        order = await claim_all(broker)
        # Every stale entry was consumed: nothing is left behind.
        assert await raw.exists(broker.keys.stale("q")) == 0
    expected = {-5: ["a", "b", "c", "x"], 0: ["a", "b", "x", "c"], 5: ["x", "a", "b", "c"]}
    assert listed == expected[priority]
    assert order == expected[priority]


async def test_stale_entries_across_levels_and_several_claims(redis_url: str) -> None:
    """One id left its level twice and came back at other levels; several queues."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message("a"), message("x"), message("b")])
        await broker.enqueue([message("o", queue="other")])
        assert await broker.remove(["x"]) == [True]
        await broker.enqueue([message("x", priority=3)])
        assert await broker.cancel("x") is CancelOutcome.CANCELLED
        assert await broker.remove(["x"]) == [True]
        await broker.enqueue([message("x")])  # level 0 again, behind its stale entry
        await broker.enqueue([message("c")])
        assert await broker.list_jobs("q", JobState.WAITING) == ["a", "b", "x", "c"]
        order: list[str] = []
        while jobs := await broker.claim(["q", "other"], 2, worker_id="w", lease=30):
            order += [j.message.id for j in jobs]
        # o was enqueued after b, before the new x: the stale x entry changes nothing.
        assert order == ["a", "b", "o", "x", "c"]
        assert await raw.exists(broker.keys.stale("q")) == 0
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 4
        assert counts[JobState.WAITING] == 0


async def test_purging_waiting_jobs_consumes_stale_entries(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message("a"), message("x"), message("b")])
        assert await broker.cancel("x") is CancelOutcome.CANCELLED
        assert await broker.remove(["x"]) == [True]
        await broker.enqueue([message("x")])
        assert await broker.purge("q", [JobState.WAITING]) == 3
        assert await raw.exists(broker.keys.stale("q")) == 0
        # The id is used again: claimed once, in its place.
        await broker.enqueue([message("y"), message("x"), message("z")])
        assert await claim_all(broker, batch=10) == ["y", "x", "z"]


# -- defect 10: the brokers agree (D-retry-token, D-dup-in-batch, D-fifo) ----------------


async def test_tokens_from_before_a_retry_answer_lease_lost(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a")])
        (old,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        failure = Failure(id="a", token=old.token, error=b"e")
        assert await broker.fail([failure]) == [FinishOutcome.OK]
        # Re-sent before any retry: the same answer as a duplicate.
        assert await broker.fail([failure]) == [FinishOutcome.ALREADY_FINISHED]
        assert await broker.retry(["a"]) == [RetryOutcome.RETRIED]
        assert await broker.complete([Completion("a", old.token, b"")]) == [
            FinishOutcome.LEASE_LOST
        ]
        assert await broker.fail([failure]) == [FinishOutcome.LEASE_LOST]
        (new,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert await broker.complete([Completion("a", new.token, b"r")]) == [FinishOutcome.OK]
        assert await broker.complete([Completion("a", old.token, b"")]) == [
            FinishOutcome.LEASE_LOST
        ]
        assert await broker.complete([Completion("a", new.token, b"r")]) == [
            FinishOutcome.ALREADY_FINISHED
        ]


async def test_duplicates_in_a_batch_never_count_against_the_bound(redis_url: str) -> None:
    async with broker_at(redis_url, max_queue_length=3) as broker:
        outcomes = await broker.enqueue(
            [message("a"), message("a"), message("b"), message("c"), message("b")]
        )
        assert [o.created for o in outcomes] == [True, False, True, True, False]
        with pytest.raises(QueueFull):
            await broker.enqueue([message("d"), message("d")])
        # Only duplicates of stored jobs: nothing is created, nothing is refused.
        assert [o.created for o in await broker.enqueue([message("a"), message("a")])] == [
            False,
            False,
        ]


async def test_enqueue_batches_keep_input_order(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        ids = [f"j{i:05d}" for i in range(5000)]
        batches = [[message(i) for i in ids[s : s + 500]] for s in range(0, 5000, 500)]
        await raw.config_resetstat()
        results = await broker.enqueue_batches(batches)
        stats = await raw.info("commandstats")
        # One pipeline: ten scripts, each its batch's whole answer (and, before it, the
        # epoch of the queue: its first use by this broker).
        assert int(stats["cmdstat_fcall"]["calls"]) == 10 + 1
        for batch, result in zip(batches, results, strict=True):
            assert isinstance(result, list)
            assert [(o.id, o.created) for o in result] == [(m.id, True) for m in batch]
        assert await claim_all(broker, batch=700) == ids
        # More batches than one pipeline holds, after a script cache flush: still in order.
        many = [[message(f"k{b:03d}-{i}") for i in range(3)] for b in range(100)]
        await raw.function_flush()
        results = await broker.enqueue_batches([*many[:50], [], *many[50:]])
        assert results[50] == []
        assert await claim_all(broker, batch=64) == [m.id for batch in many for m in batch]


async def test_enqueue_batches_refuse_a_full_batch_alone(redis_url: str) -> None:
    async with broker_at(redis_url, max_queue_length=100) as broker:
        batches = [
            [message(f"{name}{i}") for i in range(size)]
            for name, size in (("a", 40), ("b", 40), ("c", 40), ("d", 20))
        ]
        results = await broker.enqueue_batches(batches)
        assert isinstance(results[2], QueueFull)
        assert "max_queue_length=100" in str(results[2])
        for n in (0, 1, 3):
            result = results[n]
            assert isinstance(result, list)
            assert all(o.created for o in result)
        stored = [m.id for n in (0, 1, 3) for m in batches[n]]
        assert await claim_all(broker, batch=100) == stored
        assert await broker.get([m.id for m in batches[2]]) == [None] * 40


async def test_a_reused_scheduled_id_waits_for_its_new_run_time(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=0.2)])
        assert await broker.remove(["s"]) == [True]
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=3600)])
        await anyio.sleep(0.4)
        assert await broker.claim(["q"], 10, worker_id="w", lease=30) == []
        (record,) = await broker.get(["s"])
        assert record is not None
        assert record.state is JobState.SCHEDULED
        assert record.run_at > time.time() + 3000
