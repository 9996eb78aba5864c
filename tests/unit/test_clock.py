"""The injected clock: the system clock reads real time; a virtual clock moves when told."""

from __future__ import annotations

import time

import anyio
import anyio.lowlevel
import pytest

from typedq.clock import SYSTEM_CLOCK, Clock, VirtualClock, move_on_after


def test_the_system_clock_reads_real_time() -> None:
    assert isinstance(SYSTEM_CLOCK, Clock)
    assert abs(SYSTEM_CLOCK.time() - time.time()) < 1.0
    assert SYSTEM_CLOCK.monotonic() <= time.monotonic()


def test_a_virtual_clock_starts_where_told_and_moves_both_times_together() -> None:
    clock = VirtualClock(start=1_000.0)
    assert isinstance(clock, Clock)
    assert (clock.time(), clock.monotonic(), clock()) == (1_000.0, 0.0, 1_000.0)
    clock.advance_nowait(2.5)
    assert (clock.time(), clock.monotonic()) == (1_002.5, 2.5)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance_nowait(-1)


@pytest.mark.anyio
async def test_sleepers_wake_in_deadline_order_at_their_deadline() -> None:
    clock = VirtualClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.monotonic()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, "late", 5.0)
        tg.start_soon(sleeper, "early", 1.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 2
        assert clock.next_deadline() == 1.0
        await clock.advance(0.5)
        assert woke == []
        await clock.advance(10.0)
    assert woke == [("early", 1.0), ("late", 5.0)]
    assert clock.monotonic() == 10.5
    assert clock.sleepers == 0


@pytest.mark.anyio
async def test_a_loop_that_sleeps_sees_every_period_of_an_advance() -> None:
    clock = VirtualClock(start=0.0)
    ticks: list[float] = []

    async def every_second() -> None:
        while True:
            await clock.sleep(1.0)
            ticks.append(clock.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(every_second)
        await anyio.wait_all_tasks_blocked()
        await clock.advance(3.0)
        tg.cancel_scope.cancel()
    assert ticks == [1.0, 2.0, 3.0]
    assert clock.sleepers == 0  # the cancelled sleeper left no entry behind


@pytest.mark.anyio
async def test_a_cancelled_sleep_is_forgotten() -> None:
    clock = VirtualClock(start=0.0)
    with anyio.move_on_after(0.01):
        await clock.sleep(100.0)
    assert clock.sleepers == 0
    assert clock.next_deadline() is None
    await clock.sleep(0)  # a checkpoint, not a sleep


@pytest.mark.anyio
async def test_move_on_after_a_virtual_clock_cancels_when_the_clock_passes_its_deadline() -> None:
    clock = VirtualClock(start=0.0)
    reached: list[str] = []

    async def waits() -> None:
        with move_on_after(clock, 2.0) as scope:
            await anyio.sleep_forever()
        reached.append(f"moved on at {clock.monotonic()}: {scope.cancelled_caught}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waits)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 1
        await clock.advance(1.5)
        assert reached == []
        await clock.advance(1.0)
    assert reached == ["moved on at 2.0: True"]
    assert clock.sleepers == 0


@pytest.mark.anyio
async def test_move_on_after_left_early_or_at_zero_leaves_no_deadline() -> None:
    clock = VirtualClock(start=0.0)
    with move_on_after(clock, 5.0) as scope:
        await anyio.lowlevel.checkpoint()
    assert not scope.cancelled_caught
    assert clock.sleepers == 0  # the deadline went with the block
    with move_on_after(clock, 0) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
    # The system clock's is anyio's own deadline, in real time.
    with move_on_after(SYSTEM_CLOCK, 0.01) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught
