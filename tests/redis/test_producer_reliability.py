"""Producer-side reliability (issue 7), on every broker (``broker_url``).

- Defect 6: non-finite or out-of-range numbers are refused at the producer with a clear
  ``InvalidOption``, and one bad call never fails the calls coalesced with it (the
  batcher re-sends a failed batch item by item).
- Defect 7 / D-broker-batches: a partly refused ``enqueue_many`` raises
  ``PartialEnqueue`` saying exactly which jobs were stored; re-sending the others is
  safe (fixed ids). D-fifo: one ``enqueue_many`` is claimed in input order across chunks.
- Defect 9 / D-ids: key-derived ids are ``<task>:<key>``, so two tasks never share one;
  ``order:123`` is a valid job id on every broker.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, cast

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis

from tests.support import TEST_DEADLINE, In, Out, count
from typedq import App, InvalidOption, JobState, PartialEnqueue, QueueFull
from typedq.broker.base import JobMessage
from typedq.broker.redis.keys import Keys
from typedq.options import MAX_PRIORITY, MIN_PRIORITY

pytestmark = pytest.mark.anyio


async def waiting(app: App, queue: str = "default") -> int:
    return count(await app.broker.counts(queue), JobState.WAITING)


# -- defect 6: numbers -----------------------------------------------------------------


async def test_bad_numbers_are_refused_and_store_nothing(broker_url: str, app_name: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    bad: list[dict[str, Any]] = [
        {"delay": math.nan},
        {"eta": math.inf},
        {"delay": -5},
        {"priority": 2**64},
        {"retries": -1},
        {"timeout": math.inf},
    ]
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            for options in bad:
                with pytest.raises(InvalidOption, match=f"{next(iter(options))}="):
                    await echo.enqueue(In(1), **options)
                if next(iter(options)) in ("delay", "eta", "priority"):
                    with pytest.raises(InvalidOption):
                        await echo.enqueue_many([In(1), In(2)], **options)
            assert not any((await app.broker.counts("default")).values())


async def test_priority_bounds_are_stored_exactly(broker_url: str, app_name: str) -> None:
    """The extreme priorities survive the broker (Lua doubles) and order the claims."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            low = await echo.enqueue(In(1), priority=MIN_PRIORITY)
            mid = await echo.enqueue(In(2))
            high = await echo.enqueue(In(3), priority=MAX_PRIORITY)
            records = await app.broker.get([low.id, high.id])
            assert [r.message.priority for r in records if r] == [MIN_PRIORITY, MAX_PRIORITY]
            claimed = await app.broker.claim(["default"], 3, worker_id="w", lease=60)
            assert [c.message.id for c in claimed] == [high.id, mid.id, low.id]


async def test_one_bad_enqueue_does_not_fail_its_neighbours(broker_url: str, app_name: str) -> None:
    """50 concurrent enqueues, one with ``delay=nan``: 49 stored, the bad one told why."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    errors: dict[int, BaseException] = {}
    stored: dict[int, str] = {}

    async def one(i: int) -> None:
        try:
            job = await echo.enqueue(In(i), delay=math.nan if i == 25 else 0)
        except Exception as exc:
            errors[i] = exc
        else:
            stored[i] = job.id

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
            assert sorted(errors) == [25]
            assert isinstance(errors[25], InvalidOption)
            assert "delay=nan" in str(errors[25])
            assert sorted(stored) == [i for i in range(50) if i != 25]
            assert await waiting(app) == 49


async def test_a_broker_rejection_fails_only_its_own_call(
    broker_url: str, app_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A hand-made envelope the broker itself rejects (past every producer check),
    coalesced with 49 good ones: the batcher re-sends the batch item by item."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    errors: dict[int, BaseException] = {}
    created: dict[int, bool] = {}
    # The order the calls reach the batcher (trio starts tasks in a random order; the
    # call hands its item over before its first await).
    submitted: list[int] = []

    async def one(i: int) -> None:
        payload = msgspec.msgpack.encode(In(i)) if i != 25 else cast(bytes, object())
        message = JobMessage(id=f"order:{i}", task="echo", queue="default", payload=payload)
        submitted.append(i)
        try:
            created[i] = (await app.client.enqueue(message)).created
        except Exception as exc:
            errors[i] = exc

    caplog.set_level(logging.WARNING, logger="typedq.batching")
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            async with anyio.create_task_group() as tg:
                for i in range(50):
                    tg.start_soon(one, i)
            assert sorted(errors) == [25]
            assert isinstance(errors[25], TypeError | msgspec.EncodeError)
            assert created == {i: True for i in range(50) if i != 25}
            assert await waiting(app) == 49
            # Re-sent one by one in order: FIFO holds for the 49.
            claimed = await app.broker.claim(["default"], 50, worker_id="w", lease=60)
            assert [c.message.id for c in claimed] == [f"order:{i}" for i in submitted if i != 25]
    assert "re-sending them one by one" in caplog.text


async def test_hand_built_envelopes_are_checked_by_the_client(
    broker_url: str, app_name: str
) -> None:
    app = App(app_name, broker=broker_url)
    good = JobMessage(id="ok", task="echo", queue="default", payload=b"")
    bad = JobMessage(id="bad", task="echo", queue="default", payload=b"", priority=2**64)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            with pytest.raises(InvalidOption, match=r"job 'bad' of task 'echo': priority="):
                await app.client.enqueue(bad)
            with pytest.raises(InvalidOption):
                await app.client.enqueue_many([good, bad])
            assert not any((await app.broker.counts("default")).values())


# -- defect 7: a partly refused enqueue_many --------------------------------------------


async def test_partly_refused_enqueue_many_says_exactly_what_was_stored(
    broker_url: str, app_name: str
) -> None:
    """Chunks of 500; at max_queue_length=700 the middle chunk is refused, the last fits."""
    app = App(app_name, broker=broker_url, max_queue_length=700)
    runs: Counter[int] = Counter()
    drained = anyio.Event()
    target = 600

    @app.task
    async def record(x: In) -> None:
        runs[x.n] += 1
        if sum(runs.values()) >= target:
            drained.set()

    with anyio.fail_after(TEST_DEADLINE * 3):
        async with app:
            with pytest.raises(PartialEnqueue) as info:
                await record.enqueue_many(In(i) for i in range(1_100))
            exc = info.value
            assert isinstance(exc.__cause__, QueueFull)
            assert [type(e) for e in exc.errors] == [QueueFull]
            assert exc.stored == [*range(500), *range(1_000, 1_100)]
            assert exc.not_stored == list(range(500, 1_000))
            assert [j.id for j in exc.jobs] == [exc.messages[i].id for i in exc.stored]
            assert all(j.created for j in exc.jobs)
            assert [m.id for m in exc.unsent] == [exc.messages[i].id for i in exc.not_stored]
            assert "\n" not in str(exc)
            assert "stored 600 of 1100" in str(exc)
            # What it says is what the broker holds.
            held = await app.broker.get([j.id for j in exc.jobs])
            assert all(r is not None and r.state is JobState.WAITING for r in held)
            assert await app.broker.get([m.id for m in exc.unsent]) == [None] * 500
            assert await waiting(app) == 600

            # Drain, then re-send only the not-stored ones: each stored once.
            async with app.worker(concurrency=32):
                await drained.wait()
            outcomes = await app.client.enqueue_many(exc.unsent)
            assert [o.id for o in outcomes] == [m.id for m in exc.unsent]
            assert all(o.created for o in outcomes)
            # Re-sending everything again stores nothing twice (and never hits the bound:
            # only created jobs count toward it).
            again = await app.client.enqueue_many(exc.messages)
            assert not any(o.created for o in again)
            target = 1_100
            drained = anyio.Event()
            async with app.worker(concurrency=32):
                await drained.wait()
    assert runs == Counter(range(1_100))  # every input ran exactly once


async def test_enqueue_many_is_claimed_in_input_order_across_chunks(
    broker_url: str, app_name: str
) -> None:
    """D-fifo: 1,234 jobs (three chunks) of equal priority come out in input order."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await echo.enqueue_many(In(i) for i in range(1_234))
            claimed: list[str] = []
            while len(claimed) < len(jobs):
                batch = await app.broker.claim(["default"], 200, worker_id="w", lease=60)
                assert batch
                claimed += [c.message.id for c in batch]
            assert claimed == [j.id for j in jobs]


# -- defect 9: ids ----------------------------------------------------------------------


async def test_dedup_ids_of_two_tasks_never_collide(broker_url: str, app_name: str) -> None:
    """Task ``a`` with key ``b.c`` and task ``a.b`` with key ``c``: two jobs, both run."""
    app = App(app_name, broker=broker_url)

    @app.task(name="a", key=lambda x: "b.c")
    async def first(x: In) -> Out:
        return Out(x.n + 100)

    @app.task(name="a.b", key=lambda x: "c")
    async def second(x: In) -> Out:
        return Out(x.n + 200)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            one = await first.enqueue(In(1))
            two = await second.enqueue(In(2))
            assert (one.id, two.id) == ("a:b.c", "a.b:c")
            assert one.created
            assert two.created
            assert not (await first.enqueue(In(3))).created  # the same key still dedupes
            async with app.worker(concurrency=2):
                assert await one.result(timeout=TEST_DEADLINE) == Out(101)
                assert await two.result(timeout=TEST_DEADLINE) == Out(202)


async def test_a_job_id_with_colons_works(broker_url: str, app_name: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await echo.enqueue(In(7), job_id="order:123")
            assert job.id == "order:123"
            assert job.created
            assert not (await echo.enqueue(In(8), job_id="order:123")).created
            assert await echo.job("order:123").status() is JobState.WAITING
            if broker_url.startswith("redis://"):
                raw = aioredis.Redis.from_url(broker_url)
                try:
                    # Waiting: a field of the queue's waiting index (no key of its own).
                    index = Keys(app_name).index("default", "order:123")
                    assert await raw.hexists(index, "order:123")
                finally:
                    await raw.aclose()
            async with app.worker(concurrency=1):
                assert await job.result(timeout=TEST_DEADLINE) == Out(7)
            assert await echo.job("order:123").status() is JobState.COMPLETED
            if broker_url.startswith("redis://"):
                raw = aioredis.Redis.from_url(broker_url)
                try:
                    # Claimed, the job is a key: the id ends it, after the queue's hash tag.
                    assert await raw.exists(f"tq:{{{app_name}:default}}order:123") == 1
                    assert not await raw.hexists(index, "order:123")
                finally:
                    await raw.aclose()
