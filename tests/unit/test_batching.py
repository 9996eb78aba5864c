"""The Batcher: concurrent single submits coalesce into few sends; bulk sends run concurrently.

The send function is a fake that records every call, so the tests count round trips
instead of timing them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from typedq import BrokerUnavailable, NotConnected, QueueFull, RedisDataLost
from typedq.batching import SAME_FAILURES_BEFORE_GIVING_UP, Batcher

pytestmark = pytest.mark.anyio


class FakeSend:
    """Doubles each item, like a broker answering one result per item, after a round trip."""

    def __init__(self, latency: float = 0.005, fail_with: Exception | None = None) -> None:
        self.latency = latency
        self.fail_with = fail_with
        self.batches: list[list[int]] = []
        self.in_flight = 0
        self.peak_in_flight = 0

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            await anyio.sleep(self.latency)
            if self.fail_with is not None:
                raise self.fail_with
            return [item * 2 for item in items]
        finally:
            self.in_flight -= 1


@asynccontextmanager
async def running(
    send: Callable[[list[int]], Awaitable[list[int]]],
    *,
    max_batch: int = 500,
    max_in_flight: int = 4,
    inline: bool = False,
    max_callers: int | None = None,
) -> AsyncIterator[Batcher[int, int]]:
    batcher: Batcher[int, int] = Batcher(
        send,
        max_batch=max_batch,
        max_in_flight=max_in_flight,
        inline=inline,
        max_callers=max_callers,
    )
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await tg.start(batcher.run)
            yield batcher
            tg.cancel_scope.cancel()


@pytest.mark.parametrize("inline", [False, True])
async def test_concurrent_submits_coalesce(inline: bool) -> None:
    send = FakeSend()
    results: dict[int, int] = {}
    async with running(send, max_batch=500, inline=inline) as batcher:

        async def submit(i: int) -> None:
            results[i] = await batcher.submit(i)

        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(submit, i)

    assert results == {i: i * 2 for i in range(1000)}
    assert len(send.batches) <= 20  # 1,000 submits, a handful of round trips
    assert sorted(i for batch in send.batches for i in batch) == list(range(1000))
    assert max(len(batch) for batch in send.batches) <= 500


@pytest.mark.parametrize("inline", [False, True])
async def test_lone_submit_is_sent_at_once(inline: bool) -> None:
    send = FakeSend(latency=0)
    async with running(send, inline=inline) as batcher:
        with anyio.fail_after(0.5):  # not held back waiting for company
            assert await batcher.submit(21) == 42
        assert send.batches == [[21]]
        assert await batcher.submit(5) == 10
        assert send.batches == [[21], [5]]


@pytest.mark.parametrize("inline", [False, True])
async def test_max_batch_and_in_flight_limits(inline: bool) -> None:
    send = FakeSend(latency=0.01)
    async with (
        running(send, max_batch=7, max_in_flight=2, inline=inline) as batcher,
        anyio.create_task_group() as tg,
    ):
        for i in range(100):
            tg.start_soon(batcher.submit, i)
    assert max(len(batch) for batch in send.batches) <= 7
    assert send.peak_in_flight <= 2
    assert sum(len(batch) for batch in send.batches) == 100


@pytest.mark.parametrize("inline", [False, True])
async def test_errors_reach_every_waiter_and_the_batcher_recovers(inline: bool) -> None:
    send = FakeSend(fail_with=ConnectionError("broker down"))
    errors: list[BaseException] = []
    async with running(send, inline=inline) as batcher:

        async def submit(i: int) -> None:
            try:
                await batcher.submit(i)
            except ConnectionError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as tg:
            for i in range(50):
                tg.start_soon(submit, i)
        assert len(errors) == 50
        assert all(str(e) == "broker down" for e in errors)
        # The batcher keeps working once the send works again.
        send.fail_with = None
        assert await batcher.submit(3) == 6


async def test_submit_many_sends_chunks_concurrently() -> None:
    send = FakeSend(latency=0.05)
    async with running(send, max_batch=100, max_in_flight=4) as batcher:
        results = await batcher.submit_many(list(range(2_000)))
    assert results == [i * 2 for i in range(2_000)]  # in order
    assert len(send.batches) == 20
    assert all(len(batch) == 100 for batch in send.batches)
    assert send.peak_in_flight == 4  # concurrent, and bounded


async def test_submit_many_small_and_empty() -> None:
    send = FakeSend(latency=0)
    async with running(send, max_batch=100) as batcher:
        assert await batcher.submit_many([]) == []
        assert await batcher.submit_many([1, 2, 3]) == [2, 4, 6]
        assert await batcher.submit_many(list(range(10)), chunk=3) == [i * 2 for i in range(10)]
    assert send.batches[0] == [1, 2, 3]  # one chunk: sent as is
    # Chunks run concurrently, so they may reach the send in any order.
    assert sorted(send.batches[1:]) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


async def test_submit_many_raises_the_send_error_itself() -> None:
    """A failing chunk surfaces as its own exception (QueueFull, say), not a group."""
    send = FakeSend(latency=0.01, fail_with=ConnectionError("chunk refused"))
    async with running(send, max_batch=10) as batcher:
        with pytest.raises(ConnectionError, match="chunk refused"):
            await batcher.submit_many(list(range(50)))
        with pytest.raises(ConnectionError, match="chunk refused"):
            await batcher.submit_many(list(range(5)))


async def test_submit_before_run_or_after_stop() -> None:
    batcher: Batcher[int, int] = Batcher(FakeSend())
    with pytest.raises(NotConnected):
        await batcher.submit(1)
    async with running(FakeSend(latency=0)) as started:
        assert await started.submit(1) == 2
    with pytest.raises(NotConnected):
        await started.submit(1)


async def test_stopping_fails_in_flight_and_queued_items() -> None:
    """Nothing hangs when the batcher stops: every waiter gets NotConnected."""

    async def stuck(items: list[int]) -> list[int]:
        await anyio.sleep_forever()
        return items

    failures: list[BaseException] = []
    all_failed = anyio.Event()
    batcher: Batcher[int, int] = Batcher(stuck, max_in_flight=1)

    async def submit(i: int) -> None:
        try:
            await batcher.submit(i)
        except NotConnected as exc:  # not the batcher's own cancellation
            failures.append(exc)
            if len(failures) == 4:
                all_failed.set()

    with anyio.fail_after(10):
        async with anyio.create_task_group() as outer:
            async with anyio.create_task_group() as inner:
                await inner.start(batcher.run)
                outer.start_soon(submit, 1)  # in flight, never answered
                await anyio.sleep(0.05)
                outer.start_soon(submit, 2)  # waits for the one in-flight slot
                await anyio.sleep(0.05)
                for i in (3, 4):  # queued behind it
                    outer.start_soon(submit, i)
                await anyio.sleep(0.05)
                inner.cancel_scope.cancel()
            with anyio.fail_after(2):
                await all_failed.wait()
    assert len(failures) == 4


# -- one bad item never fails its neighbours (issue 7, defect 6) ----------------------


class PoisonSend(FakeSend):
    """Refuses any batch holding a negative item, as a broker refuses a malformed argument."""

    def __init__(self, error: type[Exception] = ValueError) -> None:
        super().__init__(latency=0.001)
        self.error = error

    async def __call__(self, items: list[int]) -> list[int]:
        self.batches.append(list(items))
        await anyio.sleep(self.latency)
        bad = [i for i in items if i < 0]
        if bad:
            raise self.error(f"bad item {bad[0]}")
        return [item * 2 for item in items]


async def submit_all(batcher: Batcher[int, int], items: list[int]) -> dict[int, int | Exception]:
    answers: dict[int, int | Exception] = {}

    async def one(i: int) -> None:
        try:
            answers[i] = await batcher.submit(i)
        except Exception as exc:
            answers[i] = exc

    async with anyio.create_task_group() as tg:
        for i in items:
            tg.start_soon(one, i)
    return answers


async def test_a_failed_batch_is_re_sent_item_by_item() -> None:
    send = PoisonSend()
    items = [*range(1, 26), -1, *range(26, 50)]
    async with running(send, max_in_flight=1) as batcher:
        answers = await submit_all(batcher, items)
    culprit = answers.pop(-1)
    assert isinstance(culprit, ValueError)
    assert str(culprit) == "bad item -1"
    assert answers == {i: i * 2 for i in items if i > 0}
    # The batch that failed, then its items one at a time, in their order.
    failed = next(b for b in send.batches if -1 in b and len(b) > 1)
    after = send.batches[send.batches.index(failed) + 1 :]
    assert after[: len(failed)] == [[i] for i in failed]


@pytest.mark.parametrize("error", [BrokerUnavailable, NotConnected, QueueFull, RedisDataLost])
async def test_batch_wide_errors_are_not_re_sent(error: type[Exception]) -> None:
    """The broker out of reach, a full queue, lost data: every item of the batch gets the
    error and nothing is re-sent (that would only multiply the load)."""
    send = PoisonSend(error)
    items = [*range(1, 10), -1, *range(10, 20)]
    async with running(send, max_in_flight=1) as batcher:
        answers = await submit_all(batcher, items)
    failed = [i for i, a in answers.items() if isinstance(a, error)]
    assert -1 in failed
    assert len(failed) > 1  # its neighbours share its fate
    assert -1 in send.batches[-1]  # the failed batch was the last send: no re-sends


async def test_a_lone_failing_item_is_not_re_sent() -> None:
    send = PoisonSend()
    async with running(send) as batcher:
        with pytest.raises(ValueError, match="bad item -3"):
            await batcher.submit(-3)
    assert send.batches == [[-3]]


async def test_a_refusal_of_everything_is_not_re_sent_item_by_item() -> None:
    """An unclassified error that every item gets alone (a read-only replica): after the
    first few singles fail exactly as the batch did, the rest fail without a send each."""
    send = FakeSend(latency=0.001, fail_with=RuntimeError("READONLY replica"))
    async with running(send, max_in_flight=1) as batcher:
        answers = await submit_all(batcher, list(range(100)))
    assert all(isinstance(a, RuntimeError) for a in answers.values())
    assert len(send.batches) <= 2 + 1 + SAME_FAILURES_BEFORE_GIVING_UP


async def test_a_culprit_first_in_its_batch_still_fails_alone() -> None:
    send = PoisonSend()
    items = [1, -1, *range(2, 40)]  # 1 goes alone; the batch starts with the culprit
    async with running(send, max_in_flight=1) as batcher:
        answers = await submit_all(batcher, items)
    assert [i for i, a in answers.items() if isinstance(a, Exception)] == [-1]


# -- senders, waiting callers and stopping (the deque-and-senders batcher) -------------


async def test_every_sender_is_used_when_batches_queue_up() -> None:
    """Work for several batches wakes several senders: up to max_in_flight at once."""
    send = FakeSend(latency=0.01)
    async with running(send, max_batch=5, max_in_flight=3) as batcher:
        answers = await submit_all(batcher, list(range(60)))
    assert answers == {i: i * 2 for i in range(60)}
    assert send.peak_in_flight == 3
    assert max(len(batch) for batch in send.batches) <= 5


async def test_items_submitted_while_busy_go_together_in_order() -> None:
    """With the one sender busy, items that arrive go as one batch once it frees, in order."""
    release = anyio.Event()
    batches: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        batches.append(list(items))
        if len(batches) == 1:
            await release.wait()
        return [i * 2 for i in items]

    answers: dict[int, int] = {}
    async with running(send, max_in_flight=1) as batcher:

        async def one(i: int) -> None:
            answers[i] = await batcher.submit(i)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            await wait_until(lambda: len(batches) == 1)
            for i in range(1, 8):
                tg.start_soon(one, i)
                # One at a time, so the order they arrive in is known (trio shuffles
                # tasks started together).
                await wait_until(partial(is_pending, batcher, i))
            release.set()
    assert batches == [[0], list(range(1, 8))]
    assert answers == {i: i * 2 for i in range(8)}


async def test_a_cancelled_caller_leaves_its_batch_mates_answered() -> None:
    """A caller that stops waiting does not disturb the others: its item is still sent
    (it may be in the broker's hands already) and its neighbours get their answers."""
    release = anyio.Event()
    send_calls: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        send_calls.append(list(items))
        await release.wait()
        return [i * 2 for i in items]

    answers: dict[int, int] = {}
    async with running(send, max_in_flight=1) as batcher:

        async def one(i: int) -> None:
            answers[i] = await batcher.submit(i)

        impatient = anyio.CancelScope()

        async def cancelled_caller() -> None:
            with impatient:
                await batcher.submit(3)

        async with anyio.create_task_group() as tg:
            for i in (1, 2):
                tg.start_soon(one, i)
            tg.start_soon(cancelled_caller)
            await wait_until(lambda: len(send_calls) == 1)
            impatient.cancel()
            await anyio.sleep(0.01)  # the cancelled caller is gone, the send goes on
            release.set()
    assert sorted(send_calls[0]) == [1, 2, 3]
    assert len(send_calls) == 1
    assert answers == {1: 2, 2: 4}


async def test_stopping_while_re_sending_keeps_the_answers_already_got() -> None:
    """Stopped half-way through a one-by-one re-send: the items answered keep their
    answer, the item being sent and those after it get NotConnected."""
    batches: list[list[int]] = []

    async def send(items: list[int]) -> list[int]:
        batches.append(list(items))
        if len(items) > 1:
            raise ValueError("one bad item")
        if len(batches) == 4:  # the third item re-sent alone never gets an answer
            await anyio.sleep_forever()
        return [i * 2 for i in items]

    answers: dict[int, int | Exception] = {}
    batcher: Batcher[int, int] = Batcher(send, max_in_flight=1)

    async def one(i: int) -> None:
        try:
            answers[i] = await batcher.submit(i)
        except Exception as exc:
            answers[i] = exc

    with anyio.fail_after(10):
        async with anyio.create_task_group() as outer, anyio.create_task_group() as inner:
            await inner.start(batcher.run)
            for i in range(1, 6):
                outer.start_soon(one, i)
            await anyio.sleep(0.05)
            inner.cancel_scope.cancel()
    first, second, *rest = batches[0]
    assert len(batches[0]) == 5
    assert answers[first] == first * 2
    assert answers[second] == second * 2
    assert all(isinstance(answers[i], NotConnected) for i in rest)


async def test_the_batcher_runs_again_after_a_stop() -> None:
    send = FakeSend(latency=0)
    batcher: Batcher[int, int] = Batcher(send, max_in_flight=2)
    for round_ in range(3):
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                await tg.start(batcher.run)
                answers = await submit_all(batcher, list(range(round_ * 10, round_ * 10 + 10)))
                assert answers == {i: i * 2 for i in range(round_ * 10, round_ * 10 + 10)}
                tg.cancel_scope.cancel()


def is_pending(batcher: Batcher[int, int], item: int) -> bool:
    return any(item in batch.items for batch in batcher._pending)


async def wait_until(condition: Callable[[], bool]) -> None:
    """Yield to the other tasks until ``condition`` holds (the test's fail_after bounds it)."""
    while not condition():
        await anyio.lowlevel.checkpoint()


async def test_inline_lone_item_is_sent_by_its_caller_and_others_batch_up() -> None:
    """inline=True: a caller that finds nothing in flight sends its item in its own task;
    items arriving meanwhile go to the senders, within max_in_flight in all."""
    senders: list[int] = []
    send = FakeSend(latency=0.02)

    async def recording(items: list[int]) -> list[int]:
        senders.append(anyio.get_current_task().id)
        return await send(items)

    async with running(recording, max_in_flight=2, inline=True) as batcher:
        await anyio.sleep(0.01)  # the senders are parked: nothing in flight
        caller = anyio.get_current_task().id
        assert await batcher.submit(1) == 2
        assert senders == [caller]  # no hand-off to a sender task
        results: dict[int, int] = {}

        async def submit(i: int) -> None:
            results[i] = await batcher.submit(i)

        async with anyio.create_task_group() as tg:
            for i in range(40):
                tg.start_soon(submit, i)
                await anyio.sleep(0.001)
    assert results == {i: i * 2 for i in range(40)}
    assert send.peak_in_flight <= 2
    assert len(send.batches) < 40  # the others were batched


async def test_inline_batch_takes_the_callers_of_the_same_turn() -> None:
    """Callers that submit in the same event-loop turn (runners woken together) go in
    one batch, sent by the first of them."""
    senders: list[int] = []
    send = FakeSend(latency=0)

    async def recording(items: list[int]) -> list[int]:
        senders.append(anyio.get_current_task().id)
        return await send(items)

    results: dict[int, int] = {}
    tasks: dict[int, int] = {}

    async def submit(i: int) -> None:
        tasks[i] = anyio.get_current_task().id
        results[i] = await batcher.submit(i)

    async with running(recording, inline=True) as batcher:
        await anyio.sleep(0.01)  # the senders are parked
        async with anyio.create_task_group() as tg:
            for i in range(5):
                tg.start_soon(submit, i)
    assert results == {i: i * 2 for i in range(5)}
    assert [sorted(b) for b in send.batches] == [[0, 1, 2, 3, 4]]
    assert senders[0] in tasks.values()  # one of the callers sent it, no sender task


async def test_a_cancelled_inline_sender_hands_its_batch_to_the_senders() -> None:
    send = FakeSend(latency=0)
    results: dict[int, int] = {}
    async with running(send, inline=True) as batcher:
        await anyio.sleep(0.01)  # the senders are parked: the first caller sends inline

        async def mate() -> None:
            results[2] = await batcher.submit(2)

        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as leader:
                tg.start_soon(mate)
                leader.cancel()  # cancelled at its checkpoint, before sending
                await batcher.submit(1)
        assert results == {2: 4}  # the mate still got its answer
        assert sorted(i for b in send.batches for i in b) == [1, 2]


@contextmanager
def counting_loop_turns() -> Iterator[list[int]]:
    """Counts the running asyncio loop's turns (iterations of its ``_run_once``) while
    the block runs: ``[turns]``."""
    loop: Any = asyncio.get_running_loop()
    turns = [0]
    run_once = loop._run_once

    def counting() -> None:
        turns[0] += 1
        run_once()

    loop._run_once = counting
    try:
        yield turns
    finally:
        del loop._run_once


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize(("max_callers", "extra_turns"), [(None, 1), (1, 0)])
async def test_a_lone_callers_inline_send_waits_no_turn_for_batch_mates(
    max_callers: int | None, extra_turns: int
) -> None:
    """max_callers=1 (a worker of concurrency 1): nobody can join an inline batch, so its
    send costs only its own I/O's event-loop turns, not one more to gather callers."""

    async def one_turn(items: list[int]) -> list[int]:
        await asyncio.sleep(0)  # a round trip: the loop turns once
        return [item * 2 for item in items]

    async with running(one_turn, inline=True, max_callers=max_callers) as batcher:
        await anyio.sleep(0.01)  # the senders are parked: every submit sends inline
        with counting_loop_turns() as turns:
            for i in range(50):
                assert await batcher.submit(i) == i * 2
    assert turns[0] == 50 * (1 + extra_turns)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_lone_callers_inline_send_still_yields_once_per_item() -> None:
    """A send that never suspends (the embedded broker) still lets the other tasks run
    once per item: a worker draining it at concurrency 1 does not starve the loop."""

    async def instant(items: list[int]) -> list[int]:
        return [item * 2 for item in items]

    ticks = [0]

    async def ticker() -> None:
        while True:
            ticks[0] += 1
            await asyncio.sleep(0)

    async with running(instant, inline=True, max_callers=1) as batcher:
        await anyio.sleep(0.01)  # the senders are parked: every submit sends inline
        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await asyncio.sleep(0)
            before = ticks[0]
            with counting_loop_turns() as turns:
                for i in range(50):
                    assert await batcher.submit(i) == i * 2
            tg.cancel_scope.cancel()
    assert turns[0] == 50
    assert ticks[0] - before >= 49  # the other task ran between the items
