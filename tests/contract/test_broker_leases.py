"""Broker contract, worker side: leases, fencing, retries, release, cancel, stalls, progress.

Leases here are short real durations (0.2 s) so expiry is tested against the broker's
own clock, never a mocked one.
"""

from __future__ import annotations

import time

import anyio
import msgspec
import pytest
from anyio.abc import TaskStatus

from tests.support import (
    TEST_DEADLINE,
    In,
    Out,
    claim_one,
    connected,
    count,
    msg,
    one,
    sleep_until,
)
from typedq import App, FailureReason, FailureRecord, JobCancelled, JobFailed, JobState
from typedq.broker.base import (
    CancelOutcome,
    Completion,
    Failure,
    FinishOutcome,
    LeaseStatus,
    Release,
)
from typedq.job import decode_failure

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

LEASE = 0.2


def record_bytes(message: str = "boom", attempt: int = 1) -> bytes:
    return msgspec.msgpack.encode(
        FailureRecord(
            reason=FailureReason.ERROR,
            error_type="ValueError",
            message=message,
            attempt=attempt,
            retryable=True,
        )
    )


async def expire(seconds: float = LEASE) -> None:
    """Let leases of ``seconds`` run out (the one place a plain sleep is the point)."""
    await anyio.sleep(seconds * 1.5 + 0.05)


# -- renew -------------------------------------------------------------------------


async def test_renew_answers_ok_lost_and_cancel_requested(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="a"), msg(job_id="b"), msg(job_id="c")])
        a, b, c = await broker.claim(["q"], 3, worker_id="w", lease=10)
        statuses = await broker.renew(
            [(a.message.id, a.token), (b.message.id, "not-the-token"), ("ghost", "t")], 10
        )
        assert statuses == [LeaseStatus.OK, LeaseStatus.LOST, LeaseStatus.LOST]

        assert await broker.cancel("b") is CancelOutcome.REQUESTED
        statuses = await broker.renew([(a.message.id, a.token), (b.message.id, b.token)], 10)
        assert statuses == [LeaseStatus.OK, LeaseStatus.CANCEL_REQUESTED]

        await broker.complete([Completion("c", c.token, b"")])
        assert await broker.renew([("c", c.token)], 10) == [LeaseStatus.LOST]
        assert await broker.renew([], 10) == []


async def test_renew_keeps_the_lease_alive(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, lease=LEASE) as broker:
        await broker.enqueue([msg()])
        claimed = await claim_one(broker, lease=LEASE)
        lease = (claimed.message.id, claimed.token)
        for _ in range(6):  # 0.42 s in all, twice the lease
            await anyio.sleep(LEASE / 3)
            assert await broker.renew([lease], LEASE) == [LeaseStatus.OK]
        assert await broker.recover_stalled() == 0
        assert (await one(broker, claimed.message.id)).state is JobState.ACTIVE
        # Without renewals the lease runs out.
        await expire()
        assert await broker.recover_stalled() == 1
        assert await broker.renew([lease], LEASE) == [LeaseStatus.LOST]


async def test_recovery_leaves_the_callers_own_jobs_alone(app_name: str, broker_url: str) -> None:
    """A worker's reaper passes the jobs it runs: a lease it renewed late (its loop was
    blocked) must not make it recover, and run a second time, its own job."""
    async with connected(app_name, broker_url, lease=LEASE) as broker:
        await broker.enqueue([msg(job_id="mine"), msg(job_id="theirs")])
        mine = await claim_one(broker, lease=LEASE)
        theirs = await claim_one(broker, lease=LEASE, worker_id="w2")
        assert {mine.message.id, theirs.message.id} == {"mine", "theirs"}
        await expire()
        assert await broker.recover_stalled(holding=[mine.message.id]) == 1
        assert (await one(broker, mine.message.id)).state is JobState.ACTIVE
        assert (await one(broker, theirs.message.id)).state is JobState.WAITING
        # The late renewal still holds, and the lease is the caller's again.
        assert await broker.renew([(mine.message.id, mine.token)], 10) == [LeaseStatus.OK]
        assert await broker.recover_stalled() == 0
        # Another worker's pass (it does not hold the job) recovers an expired lease.
        await broker.renew([(mine.message.id, mine.token)], LEASE)
        await expire()
        assert await broker.recover_stalled() == 1
        assert (await one(broker, mine.message.id)).state is JobState.WAITING


# -- fencing -----------------------------------------------------------------------


async def test_fencing_stale_resent_and_unknown(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, lease=LEASE) as broker:
        await broker.enqueue([msg(job_id="j")])
        first = await claim_one(broker, lease=LEASE)
        await expire()
        assert await broker.recover_stalled() == 1
        second = await claim_one(broker, lease=10, worker_id="w2")
        assert second.token != first.token
        assert second.attempt == 2
        assert second.stalls == 1

        # The stale owner is fenced off from every transition.
        assert await broker.complete([Completion("j", first.token, b"stale")]) == [
            FinishOutcome.LEASE_LOST
        ]
        assert await broker.fail([Failure(id="j", token=first.token, error=record_bytes())]) == [
            FinishOutcome.LEASE_LOST
        ]
        assert await broker.release([Release("j", first.token)]) == [FinishOutcome.LEASE_LOST]
        assert await broker.set_progress("j", first.token, b"\x01") is False
        record = await one(broker, "j")
        assert record.state is JobState.ACTIVE
        assert record.result is None
        assert record.worker_id == "w2"

        # The owner finishes; a re-send of the same finish changes nothing.
        assert await broker.complete([Completion("j", second.token, b"real")]) == [FinishOutcome.OK]
        assert await broker.complete([Completion("j", second.token, b"again")]) == [
            FinishOutcome.ALREADY_FINISHED
        ]
        assert await broker.complete([Completion("j", first.token, b"stale")]) == [
            FinishOutcome.LEASE_LOST
        ]
        record = await one(broker, "j")
        assert record.state is JobState.COMPLETED
        assert record.result == b"real"

        # Unknown jobs.
        assert await broker.complete([Completion("nope", "t", b"")]) == [FinishOutcome.NOT_FOUND]
        assert await broker.fail([Failure(id="nope", token=first.token, error=record_bytes())]) == [
            FinishOutcome.NOT_FOUND
        ]
        assert await broker.release([Release("nope", "t")]) == [FinishOutcome.NOT_FOUND]


async def test_fencing_in_one_batch(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="x"), msg(job_id="y")])
        x, _ = await broker.claim(["q"], 2, worker_id="w", lease=10)
        outcomes = await broker.complete(
            [
                Completion("x", x.token, b"x"),
                Completion("y", "wrong", b"y"),
                Completion("x", x.token, b"x"),
                Completion("zzz", "t", b""),
            ]
        )
        assert outcomes == [
            FinishOutcome.OK,
            FinishOutcome.LEASE_LOST,
            FinishOutcome.ALREADY_FINISHED,
            FinishOutcome.NOT_FOUND,
        ]
        assert (await one(broker, "y")).state is JobState.ACTIVE


async def test_resent_fail_is_already_finished(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="f")])
        claimed = await claim_one(broker)
        failure = Failure(id="f", token=claimed.token, error=record_bytes("final"))
        assert await broker.fail([failure]) == [FinishOutcome.OK]
        assert await broker.fail([failure]) == [FinishOutcome.ALREADY_FINISHED]
        assert await broker.complete([Completion("f", claimed.token, b"")]) == [
            FinishOutcome.ALREADY_FINISHED
        ]
        record = await one(broker, "f")
        assert record.state is JobState.FAILED
        assert decode_failure(record.error, "f").message == "final"
        assert count(await broker.counts("q"), JobState.FAILED) == 1


# -- fail with retry, release ---------------------------------------------------------


async def test_fail_with_retry_delay_then_final(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="r")])
        first = await claim_one(broker)
        before = time.time()
        outcome = await broker.fail(
            [Failure(id="r", token=first.token, error=record_bytes("one"), retry_delay=0.2)]
        )
        assert outcome == [FinishOutcome.OK]
        record = await one(broker, "r")
        assert record.state is JobState.SCHEDULED
        assert before + 0.1 <= record.run_at <= time.time() + 0.3
        assert record.attempt == 1
        assert decode_failure(record.error, "r").message == "one"  # the last retried error
        assert await broker.claim(["q"], 5, worker_id="w", lease=10) == []

        await sleep_until(record.run_at)
        second = await claim_one(broker)
        assert second.attempt == 2
        assert second.token != first.token

        # retry_delay=0: waiting again at once.
        await broker.fail(
            [Failure(id="r", token=second.token, error=record_bytes("two"), retry_delay=0)]
        )
        assert (await one(broker, "r")).state is JobState.WAITING
        third = await claim_one(broker)
        assert third.attempt == 3

        # retry_delay=None: failed for good.
        await broker.fail([Failure(id="r", token=third.token, error=record_bytes("three", 3))])
        record = await one(broker, "r")
        assert record.state is JobState.FAILED
        assert record.attempt == 3
        assert decode_failure(record.error, "r").message == "three"
        assert await broker.claim(["q"], 5, worker_id="w", lease=10) == []
        counts = await broker.counts("q")
        assert count(counts, JobState.FAILED) == 1
        assert count(counts, JobState.ACTIVE) == 0


async def test_release_hands_back_without_spending_an_attempt(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="first"), msg(job_id="second")])
        claimed = await claim_one(broker)
        assert claimed.message.id == "first"
        assert await broker.release([Release("first", claimed.token)]) == [FinishOutcome.OK]
        record = await one(broker, "first")
        assert record.state is JobState.WAITING
        assert record.attempt == 0
        assert await broker.release([Release("first", claimed.token)]) == [
            FinishOutcome.ALREADY_FINISHED
        ]
        # It keeps its place in line and runs as attempt 1 again.
        again = await claim_one(broker)
        assert again.message.id == "first"
        assert again.attempt == 1
        assert await broker.renew([("first", claimed.token)], 10) == [LeaseStatus.LOST]
        counts = await broker.counts("q")
        assert count(counts, JobState.ACTIVE) == 1
        assert count(counts, JobState.WAITING) == 1


# -- cancel ------------------------------------------------------------------------


async def test_cancel_waiting_and_scheduled(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="w"), msg(job_id="s", delay=60)])
        assert await broker.cancel("w") is CancelOutcome.CANCELLED
        assert await broker.cancel("s") is CancelOutcome.CANCELLED
        for job_id in ("w", "s"):
            record = await one(broker, job_id)
            assert record.state is JobState.CANCELLED
            assert decode_failure(record.error, job_id).reason is FailureReason.CANCELLED
            assert record.finished_at > 0
        assert await broker.claim(["q"], 5, worker_id="w", lease=10) == []
        assert await broker.cancel("w") is CancelOutcome.ALREADY_FINAL
        assert await broker.cancel("ghost") is CancelOutcome.NOT_FOUND
        counts = await broker.counts("q")
        assert count(counts, JobState.CANCELLED) == 2
        assert count(counts, JobState.WAITING) == 0
        assert count(counts, JobState.SCHEDULED) == 0
        # A cancelled job's wait ends at once.
        with anyio.fail_after(1):
            finished = await broker.wait_finished("s", 30)
        assert finished is not None
        assert finished.state is JobState.CANCELLED


async def test_cancel_through_the_job_handle(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            waiting = await double.enqueue(In(1))
            scheduled = await double.enqueue(In(2), delay=60)
            assert await scheduled.status() is JobState.SCHEDULED
            assert await waiting.cancel() is True
            assert await scheduled.cancel() is True
            assert await waiting.cancel() is False  # already final
            for job in (waiting, scheduled):
                assert await job.status() is JobState.CANCELLED
                with pytest.raises(JobCancelled) as caught:
                    await job.result(timeout=5)
                assert caught.value.reason is FailureReason.CANCELLED
                assert isinstance(caught.value, JobFailed)
            info = await waiting.info()
            assert info.error is not None
            assert info.error.reason is FailureReason.CANCELLED


async def test_cancel_active_is_requested(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="a"), msg(job_id="b")])
        a, b = await broker.claim(["q"], 2, worker_id="w", lease=10)
        assert await broker.cancel_requests(["a", "b"]) == []

        woke = anyio.Event()

        async def listener(*, task_status: TaskStatus[None]) -> None:
            await broker.wait_cancel_requests(10, task_status=task_status)
            woke.set()

        async with anyio.create_task_group() as tg:
            await tg.start(listener)  # armed: subscribed, so the request below wakes it
            assert not woke.is_set()
            assert await broker.cancel("a") is CancelOutcome.REQUESTED
            with anyio.fail_after(2):
                await woke.wait()

        record = await one(broker, "a")
        assert record.state is JobState.ACTIVE  # still running until its worker confirms
        assert record.cancel_requested is True
        assert await broker.cancel_requests(["a", "b", "ghost"]) == ["a"]
        assert await broker.renew([("a", a.token), ("b", b.token)], 10) == [
            LeaseStatus.CANCEL_REQUESTED,
            LeaseStatus.OK,
        ]
        assert await broker.cancel("a") is CancelOutcome.REQUESTED  # asking twice is fine

        # The worker confirms by failing it as cancelled.
        outcome = await broker.fail(
            [Failure(id="a", token=a.token, error=record_bytes("cancelled"), cancelled=True)]
        )
        assert outcome == [FinishOutcome.OK]
        assert (await one(broker, "a")).state is JobState.CANCELLED
        assert await broker.cancel_requests(["a"]) == []
        assert await broker.cancel("a") is CancelOutcome.ALREADY_FINAL


async def test_cancel_requested_job_is_not_retried_or_released(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            retry = await work.enqueue(In(1))
            release = await work.enqueue(In(2))
            r1, r2 = await broker.claim(["default"], 2, worker_id="w", lease=10)
            assert await retry.cancel() is True
            assert await release.cancel() is True
            # An attempt that fails after cancel() is not run again ...
            await broker.fail(
                [Failure(id=retry.id, token=r1.token, error=record_bytes(), retry_delay=0)]
            )
            # ... and a job handed back at shutdown after cancel() does not come back.
            await broker.release([Release(release.id, r2.token)])
            for job in (retry, release):
                assert await job.status() is JobState.CANCELLED
                # Either way the producer learns it was cancelled, from a readable record.
                with pytest.raises(JobCancelled):
                    await job.result(timeout=5)
                assert (await job.info()).error is not None
            assert await broker.claim(["default"], 5, worker_id="w", lease=10) == []


# -- stalls ------------------------------------------------------------------------


async def test_lease_expiry_recovers_then_fails_as_stalled(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url, lease=LEASE, max_stalls=1)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            job = await work.enqueue(In(1))
            first = await claim_one(broker, "default", lease=LEASE, worker_id="lost-1")
            assert await broker.recover_stalled() == 0  # the lease is still live
            await expire()
            assert await broker.recover_stalled() == 1
            record = await one(broker, job.id)
            assert record.state is JobState.WAITING
            assert record.stalls == 1

            second = await claim_one(broker, "default", lease=LEASE, worker_id="lost-2")
            assert second.attempt == 2
            assert second.stalls == 1
            assert second.token != first.token
            await expire()
            assert await broker.recover_stalled() == 1  # past max_stalls=1: failed
            record = await one(broker, job.id)
            assert record.state is JobState.FAILED
            assert record.stalls == 2
            assert await broker.recover_stalled() == 0

            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=5)
            failure = caught.value.record
            assert failure.reason is FailureReason.STALLED
            assert failure.error_type == "WorkerLost"
            assert failure.retryable is False
            assert failure.attempt == 2
            assert await broker.complete([Completion(job.id, second.token, b"")]) == [
                FinishOutcome.LEASE_LOST
            ]


async def test_recover_stalled_respects_limit(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, lease=LEASE) as broker:
        await broker.enqueue([msg() for _ in range(5)])
        await broker.claim(["q"], 5, worker_id="w", lease=LEASE)
        await expire()
        assert await broker.recover_stalled(limit=2) == 2
        assert await broker.recover_stalled(limit=100) == 3
        assert await broker.recover_stalled() == 0
        assert count(await broker.counts("q"), JobState.WAITING) == 5


async def test_concurrent_recoverers_recover_each_job_once(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, lease=LEASE) as broker:
        messages = [msg() for _ in range(40)]
        await broker.enqueue(messages)
        assert len(await broker.claim(["q"], 40, worker_id="w", lease=LEASE)) == 40
        await expire()
        recovered: list[int] = []

        async def reaper() -> None:
            recovered.append(await broker.recover_stalled(limit=15))

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(reaper)
        assert sum(recovered) == 40
        records = await broker.get([m.id for m in messages])
        assert all(r is not None and r.state is JobState.WAITING for r in records)
        assert all(r is not None and r.stalls == 1 for r in records)
        again = await broker.claim(["q"], 100, worker_id="w", lease=10)
        assert len(again) == 40
        assert {c.attempt for c in again} == {2}


# -- progress and waiting -----------------------------------------------------------


async def test_set_progress_and_job_info(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            job = await work.enqueue(In(3), priority=4)
            info = await job.info()
            assert info.status is JobState.WAITING
            assert info.progress is None
            assert info.priority == 4
            assert info.task == "work"
            assert info.queue == "default"

            claimed = await claim_one(broker, "default")
            progress = msgspec.msgpack.encode({"done": 3, "of": 10})
            assert await broker.set_progress(job.id, claimed.token, progress) is True
            assert (await one(broker, job.id)).progress == progress
            info = await job.info()
            assert info.status is JobState.ACTIVE
            assert info.progress == {"done": 3, "of": 10}
            assert info.attempt == 1
            assert info.started_at >= info.enqueued_at

            assert await broker.set_progress(job.id, "other", b"\x00") is False
            assert await broker.set_progress("ghost", claimed.token, b"\x00") is False
            await broker.complete([Completion(job.id, claimed.token, work.output.encode(Out(3)))])
            assert await broker.set_progress(job.id, claimed.token, b"\x00") is False
            assert await job.result(timeout=5) == Out(3)
            assert (await job.info()).progress == {"done": 3, "of": 10}


async def test_wait_finished_returns_on_completion(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="w")])
        claimed = await claim_one(broker)
        got: list[object] = []
        both = anyio.Event()

        async def waiter(*, task_status: TaskStatus[None]) -> None:
            got.append(await broker.wait_finished("w", 30, task_status=task_status))
            if len(got) == 2:
                both.set()

        async with anyio.create_task_group() as tg:
            await tg.start(waiter)
            await tg.start(waiter)  # two waiters on one job, both armed
            assert got == []
            start = time.monotonic()
            await broker.complete([Completion("w", claimed.token, b"ok")])
            with anyio.fail_after(2):
                await both.wait()
            assert time.monotonic() - start < 1.0
        for record in got:
            assert record is not None
            assert getattr(record, "state", None) is JobState.COMPLETED
            assert getattr(record, "result", None) == b"ok"
        # Already final: at once.
        with anyio.fail_after(1):
            done = await broker.wait_finished("w", 30)
        assert done is not None
        assert done.state is JobState.COMPLETED


async def test_wait_finished_returns_on_failure(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="f")])
        claimed = await claim_one(broker)
        result: list[object] = []

        async def waiter(*, task_status: TaskStatus[None]) -> None:
            result.append(await broker.wait_finished("f", 30, task_status=task_status))

        with anyio.fail_after(2):
            async with anyio.create_task_group() as tg:
                await tg.start(waiter)
                assert result == []
                await broker.fail([Failure(id="f", token=claimed.token, error=record_bytes())])
        (record,) = result
        assert getattr(record, "state", None) is JobState.FAILED


async def test_wait_finished_timeout_and_unknown(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="slow")])
        start = time.monotonic()
        assert await broker.wait_finished("slow", 0.2) is None
        assert 0.15 <= time.monotonic() - start < 2
        # The job is untouched by the wait.
        assert (await one(broker, "slow")).state is JobState.WAITING
        with anyio.fail_after(1):
            assert await broker.wait_finished("ghost", 30) is None


async def test_cancel_requested_job_of_a_lost_worker_ends_cancelled(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url, lease=LEASE)

    @app.task
    async def work(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await work.enqueue(In(1))
            await claim_one(app.broker, "default", lease=LEASE, worker_id="lost")
            assert await job.cancel() is True  # requested; its worker never confirms
            await expire()
            assert await app.broker.recover_stalled() == 1
            assert await job.status() is JobState.CANCELLED  # not put back to run again
            with pytest.raises(JobCancelled):
                await job.result(timeout=5)
            assert await app.broker.claim(["default"], 5, worker_id="w", lease=10) == []
