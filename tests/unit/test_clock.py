"""The injected clock: the system clock reads real time; a virtual clock moves when told."""

from __future__ import annotations

import time

import anyio
import pytest

from typedq.clock import SYSTEM_CLOCK, Clock, VirtualClock


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
