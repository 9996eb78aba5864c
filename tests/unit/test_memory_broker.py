"""Embedded-broker specifics that the contract suite does not cover."""

from __future__ import annotations

import bisect
import gc
import random

import anyio
import msgspec
import pytest

from typedq import App, Client, JobState, QueueFull, Retention
from typedq.broker.base import (
    BrokerSettings,
    CancelOutcome,
    Completion,
    FinishOutcome,
    JobMessage,
    Release,
)
from typedq.broker.memory import MemoryBroker, _WaitLine
from typedq.clock import VirtualClock
from typedq.testing import FakeClock

pytestmark = pytest.mark.anyio


class Ping(msgspec.Struct):
    n: int


async def test_one_broker_shared_by_two_clients_in_any_order() -> None:
    broker = MemoryBroker(BrokerSettings(namespace="shared"))
    app = App("shared", broker=broker)

    @app.task
    async def double(ping: Ping) -> Ping:
        return Ping(n=ping.n * 2)

    producer = Client(broker, name="shared")
    # The worker's app connects first, then the producer: the second connect must not
    # replace the wake-up events the running worker waits on.
    async with app, app.worker(concurrency=2):
        async with producer:
            message = double.message(Ping(n=21))
            (outcome,) = await producer.enqueue_many([message])
            assert outcome.created
            result = await double.job(outcome.id).result(timeout=5)
            assert result == Ping(n=42)
        # The producer closed; the app's connection still works.
        job = await double.enqueue(Ping(n=1))
        assert await job.result(timeout=5) == Ping(n=2)


async def test_close_is_idempotent() -> None:
    broker = MemoryBroker()
    await broker.connect()
    await broker.close()
    await broker.close()  # a second close does nothing
    await broker.connect()
    assert await broker.get(["nope"]) == [None]
    await broker.close()


async def test_reused_scheduled_id_ignores_the_old_heap_entry() -> None:
    """Issue 7, defect 8: the old entry of a removed job must not make its successor due."""
    clock = FakeClock(start=1_000_000.0)
    broker = MemoryBroker(clock=clock)
    await broker.connect()
    try:
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=0.5)])
        assert await broker.remove(["s"]) == [True]
        await broker.enqueue([JobMessage(id="s", task="t", queue="q", payload=b"", delay=3600)])
        clock.advance(1)
        assert not broker.has_due_jobs()
        assert await broker.claim(["q"], 10, worker_id="w", lease=60) == []
        (record,) = await broker.get(["s"])
        assert record is not None
        assert record.state is JobState.SCHEDULED
        assert record.run_at == 1_000_000.0 + 3600
        clock.advance(3600)
        assert broker.has_due_jobs()
        (claimed,) = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert claimed.message.id == "s"
    finally:
        await broker.close()


async def test_entries_never_outlive_many_incarnations_of_an_id() -> None:
    """Remove and re-create one id many times: only the live job is ever claimable."""
    broker = MemoryBroker()
    await broker.connect()
    try:
        for n in range(50):
            message = JobMessage(id="x", task="t", queue="q", payload=bytes([n]), priority=n % 3)
            await broker.enqueue([message])
            if n % 2:
                assert await broker.cancel("x") is CancelOutcome.CANCELLED
            assert await broker.remove(["x"]) == [True]
        last = JobMessage(id="x", task="t", queue="q", payload=b"last", priority=-1)
        await broker.enqueue([last, JobMessage(id="y", task="t", queue="q", payload=b"")])
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert claimed[0].message.id == "y"
        assert [c.message.payload for c in claimed] == [b"", b"last"]
    finally:
        await broker.close()


def _entry(priority: int, order: int, version: int) -> tuple[int, int, int, str]:
    return (-priority, order, version, f"j{order}")


def test_wait_line_gives_entries_best_first_whatever_the_push_order() -> None:
    """Priority levels with a FIFO and a heap for out-of-order entries: the line must
    always give the smallest entry, as the one heap it replaces did."""
    rng = random.Random(7)
    line = _WaitLine()
    # The model: every entry pushed and not popped, kept sorted (so its first is the
    # smallest); a list searched by min() made this test ~10 s of the unit tier.
    model: list[tuple[int, int, int, str]] = []
    order = version = 0
    for _ in range(20_000):
        action = rng.random()
        if action < 0.45:  # a new job: the highest order yet
            order += 1
            version += 1
            entry = _entry(rng.choice((-1, 0, 0, 0, 5)), order, version)
        elif action < 0.55:  # at the head of its level (a released flow step)
            version += 1
            entry = _entry(rng.choice((0, 5)), -version, version)
        elif action < 0.65 and order:  # back at an old place (handed back)
            version += 1
            entry = _entry(rng.choice((-1, 0, 5)), rng.randint(1, order), version)
        else:
            best = line.peek()
            taken = line.pop()
            assert best == taken == (model[0] if model else None)
            if taken is not None:
                del model[0]
            continue
        line.push(entry)
        bisect.insort(model, entry)
        assert bool(line) == bool(model)
    assert sorted(line) == model
    while model:
        assert line.pop() == model.pop(0)
    assert not line
    assert line.pop() is None
    assert line.peek() is None


async def test_stored_jobs_stay_out_of_the_cyclic_gc() -> None:
    """A full collection must not walk every stored job (it did: 100k jobs made each full
    pass ~10x longer); a job refers to nothing that refers back to it."""
    broker = MemoryBroker()
    await broker.connect()
    try:
        await broker.enqueue(
            [JobMessage(id=f"j{i}", task="t", queue="q", payload=b"") for i in range(3)]
        )
        (claimed, *_) = await broker.claim(["q"], 1, worker_id="w", lease=60)
        await broker.complete([Completion(claimed.message.id, claimed.token, b"r")])
        jobs = [broker.table.jobs[f"j{i}"] for i in range(3)]
        assert [job.state for job in jobs] == [
            JobState.COMPLETED,
            JobState.WAITING,
            JobState.WAITING,
        ]
        assert not any(gc.is_tracked(job) for job in jobs)
    finally:
        await broker.close()


async def test_a_settle_batch_larger_than_the_bound_keeps_the_newest() -> None:
    broker = MemoryBroker(BrokerSettings(retention=Retention(completed_max=3)))
    await broker.connect()
    try:
        ids = [f"j{i}" for i in range(10)]
        await broker.enqueue([JobMessage(id=i, task="t", queue="q", payload=b"") for i in ids])
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=60)
        completions = [Completion(c.message.id, c.token, b"") for c in claimed]
        assert await broker.complete(completions) == [FinishOutcome.OK] * 10
        assert (await broker.counts("q"))[JobState.COMPLETED] == 3
        assert [r is not None for r in await broker.get(ids)] == [False] * 7 + [True] * 3
        # Re-sent completions of the kept jobs are recognised, the dropped ones are gone.
        again = await broker.complete(completions[6:])
        assert again == [FinishOutcome.NOT_FOUND] + [FinishOutcome.ALREADY_FINISHED] * 3
        (minute,) = (await broker.history(["q"], 1))[0]
        assert minute.completed == 10
    finally:
        await broker.close()


async def test_enqueue_batches_answers_each_batch() -> None:
    broker = MemoryBroker(BrokerSettings(max_queue_length=3))
    await broker.connect()
    try:

        def batch(*ids: str) -> list[JobMessage]:
            return [JobMessage(id=i, task="t", queue="q", payload=b"") for i in ids]

        first, full, last = await broker.enqueue_batches(
            [batch("a", "b"), batch("c", "d"), batch("e")]
        )
        assert isinstance(first, list)
        assert [o.id for o in first] == ["a", "b"]
        assert isinstance(full, QueueFull)  # the batch that did not fit, alone
        assert isinstance(last, list)
        assert [o.id for o in last] == ["e"]
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert [c.message.id for c in claimed] == ["a", "b", "e"]
    finally:
        await broker.close()


async def test_handed_back_jobs_return_to_their_place_among_newer_ones() -> None:
    broker = MemoryBroker()
    await broker.connect()
    try:
        ids = ["a", "b", "c", "d", "e"]
        await broker.enqueue([JobMessage(id=i, task="t", queue="q", payload=b"") for i in ids])
        a, b, c = await broker.claim(["q"], 3, worker_id="w", lease=60)
        # a goes back before d (the head of the line), c between the head and the tail.
        assert await broker.release([Release(a.message.id, a.token)]) == [FinishOutcome.OK]
        assert await broker.release([Release(c.message.id, c.token)]) == [FinishOutcome.OK]
        await broker.enqueue([JobMessage(id="f", task="t", queue="q", payload=b"")])
        assert await broker.release([Release(b.message.id, b.token)]) == [FinishOutcome.OK]
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=60)
        assert [j.message.id for j in claimed] == ["a", "b", "c", "d", "e", "f"]
    finally:
        await broker.close()


async def test_a_virtual_clock_moves_leases_and_due_times_alike() -> None:
    """Given a Clock, the broker reads all its time through it: a lease ends when the
    clock's monotonic time passes it, with no real time passing."""
    clock = VirtualClock(start=1_000.0)
    broker = MemoryBroker(clock=clock)
    await broker.connect()
    try:
        await broker.enqueue([JobMessage(id="j", task="t", queue="q", payload=b"", delay=5)])
        assert await broker.claim(["q"], 1, worker_id="w", lease=30) == []
        clock.advance_nowait(5)
        (claimed,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert claimed.message.id == "j"
        (record,) = await broker.get(["j"])
        assert record is not None
        assert record.started_at == 1_005.0
        assert await broker.recover_stalled() == 0
        clock.advance_nowait(31)
        assert await broker.recover_stalled() == 1
        assert (await broker.counts("q"))[JobState.WAITING] == 1
    finally:
        await broker.close()


async def test_a_bare_callable_clock_is_wall_time_only() -> None:
    """A ``() -> float`` (FakeClock) moves delays and timestamps; leases keep real time."""
    clock = FakeClock(2_000.0)
    broker = MemoryBroker(clock=clock)
    await broker.connect()
    try:
        await broker.enqueue([JobMessage(id="j", task="t", queue="q", payload=b"")])
        await broker.claim(["q"], 1, worker_id="w", lease=30)
        clock.advance(3600)
        assert await broker.recover_stalled() == 0  # an hour of wall time: lease still held
        assert broker.clock.time() == 5_600.0
    finally:
        await broker.close()


async def test_waits_for_due_jobs_follow_a_virtual_clock() -> None:
    """A worker waiting for a delayed job wakes when the virtual clock reaches its due
    time, not after that many real seconds."""
    clock = VirtualClock(start=1_000.0)
    broker = MemoryBroker(clock=clock)
    await broker.connect()
    try:
        await broker.enqueue([JobMessage(id="j", task="t", queue="q", payload=b"", delay=30)])
        with anyio.fail_after(5):  # real seconds: far less than the job's 30 s delay
            async with anyio.create_task_group() as group:
                group.start_soon(broker.wait_for_jobs, ["q"], 60.0)
                await anyio.wait_all_tasks_blocked()
                assert clock.sleepers == 1
                await clock.advance(30)
        (claimed,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert claimed.message.id == "j"
    finally:
        await broker.close()
