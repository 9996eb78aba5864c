"""typedq.testing: the in-process harness users test their own tasks with."""

from __future__ import annotations

import time

import msgspec
import pytest

from typedq import App, Backoff, JobContext, JobState
from typedq.errors import ConfigError
from typedq.testing import FakeClock, run_worker

pytestmark = pytest.mark.anyio


class Num(msgspec.Struct, frozen=True):
    n: int


class Order(msgspec.Struct):
    order_id: int


class Shipped(msgspec.Struct):
    order_id: int
    attempts: int


def make_app() -> App:
    app = App("shop")

    @app.task(retries=2, backoff=Backoff(kind="fixed", base=600, jitter=0))
    async def ship(order: Order, ctx: JobContext) -> Shipped:
        if ctx.attempt < 3:
            raise ConnectionError("carrier API down")
        return Shipped(order_id=order.order_id, attempts=ctx.attempt)

    return app


async def test_retries_follow_the_fake_clock_without_real_sleeping() -> None:
    app = make_app()
    ship = app.tasks["ship"]
    started = time.monotonic()
    async with run_worker(app) as harness:
        job = await ship.enqueue(Order(order_id=1))
        await harness.idle()
        assert await job.status() is JobState.SCHEDULED  # first attempt failed, 600 s backoff
        await harness.advance(599)
        await harness.idle()
        assert (await job.info()).attempt == 1  # not due yet
        await harness.advance(1)
        await harness.idle()
        assert (await job.info()).attempt == 2
        await harness.advance(600)
        await harness.idle()
        result = await job.result(timeout=1)
    assert result == Shipped(order_id=1, attempts=3)
    assert time.monotonic() - started < 10  # 20 minutes of backoff took no real time


async def test_delayed_jobs_wait_for_the_clock() -> None:
    app = make_app()
    ship = app.tasks["ship"]
    clock = FakeClock(start=1_000_000.0)
    async with run_worker(app, clock=clock) as harness:
        job = await ship.enqueue(Order(order_id=2), delay=3600)
        await harness.idle()
        assert await job.status() is JobState.SCHEDULED
        assert (await job.info()).run_at == 1_000_000.0 + 3600
        await harness.advance(3600)
        await harness.idle()
        assert (await job.info()).attempt == 1
        assert (await harness.counts())[JobState.SCHEDULED] == 1  # retrying now


async def test_the_harness_needs_an_unconnected_app() -> None:
    app = make_app()
    async with app:
        with pytest.raises(ConfigError, match="not connected yet"):
            async with run_worker(app):
                pass


async def test_the_app_gets_its_broker_back_afterwards() -> None:
    app = make_app()
    before = app.client
    async with run_worker(app):
        assert app.client is not before
    assert app.client is before


def test_fake_clock_only_moves_forward() -> None:
    clock = FakeClock(start=5.0)
    clock.advance(2.5)
    assert clock() == 7.5
    with pytest.raises(ValueError, match="forward"):
        clock.advance(-1)


async def test_workflows_run_in_the_harness_and_no_clock_releases_a_held_step() -> None:
    app = App("harness-flows")
    ran: list[int] = []

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=60, jitter=0.0))
    async def gate(x: Num, ctx: JobContext) -> Num:
        ran.append(x.n)
        if ctx.attempt == 1:
            raise RuntimeError("not yet")  # retried after the fake clock moves
        return Num(x.n + 1)

    @app.task(retries=0)
    async def after(x: Num) -> Num:
        ran.append(x.n)
        return Num(x.n * 10)

    async with run_worker(app) as harness:
        job = await gate.then(after).enqueue(Num(1))
        await harness.idle()
        assert ran == [1]  # the first attempt failed; its retry is due in a minute
        # Far past any real run_at (and the held step's): only the hand-off releases it.
        await harness.advance(1e10)
        assert await job.result(timeout=5) == Num(20)
    assert ran == [1, 1, 2]
