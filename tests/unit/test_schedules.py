"""Schedules: declaration checks, tick planning and policies, reconciliation.

Policies run end to end on the embedded broker with a fake clock (two workers, so a
tick is also fired once when both schedulers see it); the broker-side steps they rely
on (compare and set, overlap, reconciliation) are in the contract suite for every broker.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import anyio
import anyio.lowlevel
import msgspec
import pytest

from tests.support import In, Out
from typedq import App, BrokerUnavailable, ConcurrencyLimit, ConfigError, JobContext, RateLimit
from typedq.broker.base import BrokerSettings
from typedq.broker.memory import MemoryBroker
from typedq.clock import VirtualClock
from typedq.schedule import MAX_FIRE, Schedule, plan, tick_job_id
from typedq.testing import FakeClock, run_worker

S = 1_000_000
#: 3 s into a 10 s interval.
T0 = 1_800_000_003.0


class Other(msgspec.Struct):
    text: str


def make_app(name: str = "sched", broker: MemoryBroker | None = None) -> App:
    return App(name, broker=broker or "memory://")


# -- declaration ------------------------------------------------------------------------


def test_declaration_defaults_and_names() -> None:
    app = make_app()

    @app.task
    async def poll(x: In) -> None: ...

    every = app.schedule(poll, In(1), every=30)
    daily = app.schedule(poll, In(1), cron="0 8 * * *", tz="Europe/Paris")
    td = app.schedule(poll, In(2), every=timedelta(minutes=5))
    assert every.name == "poll.every-30s"
    assert daily.name.startswith("poll.cron-")
    assert td.every == 300.0
    assert every.missed == "once"
    assert every.overlap == "allow"
    assert daily.tz == ZoneInfo("Europe/Paris")
    assert set(app.schedules) == {every.name, daily.name, td.name}
    assert every.digest != app.schedule(poll, In(2), every=30, name="other").digest
    assert app.schedule(poll, In(1), every=1_000_000).name == "poll.every-1000000s"
    assert app.schedule(poll, In(1), every=0.25).name == "poll.every-0.25s"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({}, "give exactly one of cron='<expression>' or every=<seconds>, not neither"),
        ({"cron": "* * * * *", "every": 5}, "not both"),
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "every day"}, "use five fields"),
        # cronsim takes a sixth field (seconds); the documented form has five (issue 29).
        ({"cron": "*/10 * * * * *"}, "has 6 fields; use five fields 'minute hour"),
        ({"cron": "*/10 * * * * *"}, "for ticks in seconds use every=SECONDS"),
        ({"every": 0}, "every=0 must be > 0 seconds"),
        ({"every": -5}, "every=-5 must be > 0 seconds"),
        ({"every": timedelta(0)}, "must be > 0 seconds"),
        ({"every": float("nan")}, "must be > 0 seconds (finite)"),
        ({"every": "30"}, "every='30' is not a number of seconds"),
        ({"every": 5, "missed": 0}, "missed=0: use 'skip', 'once', or an int"),
        ({"every": 5, "missed": "all"}, "missed='all'"),
        ({"every": 5, "overlap": "wait"}, "overlap='wait': use 'skip', 'queue' or 'allow'"),
        ({"every": 5, "grace": -1}, "grace=-1 must be >= 0"),
        ({"every": 5, "max_lateness": 0}, "max_lateness=0 must be > 0"),
        ({"cron": "0 8 * * *", "tz": "Mars/Base"}, "unknown time zone 'Mars/Base'"),
        ({"every": 5, "tz": "UTC"}, "tz= applies to cron schedules"),
        ({"every": 5, "name": "bad name"}, "invalid schedule name 'bad name'"),
    ],
)
def test_bad_declarations_are_one_clear_config_error(
    kwargs: dict[str, object], fragment: str
) -> None:
    app = make_app()

    @app.task
    async def poll(x: In) -> None: ...

    with pytest.raises(ConfigError) as info:
        app.schedule(poll, In(1), **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message
    assert "schedule" in message


def test_wrong_payload_model_is_refused_at_declaration() -> None:
    app = make_app()

    @app.task
    async def poll(x: In) -> None: ...

    with pytest.raises(ConfigError, match=r"the payload is a Other, but task 'poll' takes a In"):
        app.schedule(poll, Other("x"), every=5)  # type: ignore[arg-type]


def test_two_schedules_with_one_name() -> None:
    app = make_app()

    @app.task
    async def poll(x: In) -> None: ...

    app.schedule(poll, In(1), every=5)
    with pytest.raises(ConfigError, match=r"already has a schedule named 'poll.every-5s'; pass"):
        app.schedule(poll, In(2), every=5)
    app.schedule(poll, In(1), every=7, name="x")
    with pytest.raises(ConfigError, match="already has a schedule named 'x'"):
        app.schedule(poll, In(1), cron="* * * * *", name="x")


def test_a_task_of_another_app_is_refused() -> None:
    app, other = make_app("a"), make_app("b")

    @other.task
    async def poll(x: In) -> None: ...

    with pytest.raises(ConfigError, match="belongs to another app"):
        app.schedule(poll, In(1), every=5)


# -- ticks and planning ----------------------------------------------------------------


def _schedule(**kwargs: object) -> Schedule[In]:
    app = make_app()

    @app.task
    async def poll(x: In) -> None: ...

    return app.schedule(poll, In(1), **kwargs)  # type: ignore[arg-type]


def test_interval_ticks_are_on_the_epoch_grid() -> None:
    sched = _schedule(every=10)
    assert sched.next_tick(round(T0 * S)) == 1_800_000_010 * S
    assert sched.next_tick(1_800_000_010 * S) == 1_800_000_020 * S
    down = sched.ticks_down(1_800_000_020 * S)
    assert [next(down) for _ in range(3)] == [
        t * S for t in (1_800_000_020, 1_800_000_010, 1_800_000_000)
    ]
    assert tick_job_id(sched.name, 5) == "schedule:poll.every-10s:5"
    message = sched.message(1_800_000_010 * S)
    assert message.id == f"schedule:poll.every-10s:{1_800_000_010 * S}"
    assert message.scheduled_for == 1_800_000_010.0


def test_a_schedules_jobs_carry_the_tasks_limit_keys() -> None:
    """A tick's job is the task's own envelope of the payload: per-key limits apply."""
    app = make_app()

    @app.task(
        rate_limit=RateLimit(5, per=1.0, key=lambda x: f"r{x.n}"),
        concurrency=ConcurrencyLimit(1, key=lambda x: f"c{x.n}"),
    )
    async def limited(x: In) -> None: ...

    direct = limited.message(In(7))
    message = app.schedule(limited, In(7), every=10).message(1_800_000_010 * S)
    assert (message.rate_key, message.concurrency_key) == (direct.rate_key, direct.concurrency_key)
    assert message.rate_key
    assert message.concurrency_key
    assert message.scheduled_for == 1_800_000_010.0


def test_cron_ticks_follow_the_time_zone_and_dst() -> None:
    sched = _schedule(cron="0 8 * * *", tz="Europe/Paris")
    # 2026-03-28 is CET (UTC+1), 2026-03-30 CEST (UTC+2): 08:00 local moves in UTC.
    start = round(datetime(2026, 3, 28, 12, tzinfo=UTC).timestamp() * S)
    first = sched.next_tick(start)
    second = sched.next_tick(first)
    third = sched.next_tick(second)
    as_utc = [
        datetime.fromtimestamp(t / S, UTC).strftime("%d %H:%M") for t in (first, second, third)
    ]
    assert as_utc == ["29 06:00", "30 06:00", "31 06:00"]
    down = sched.ticks_down(second)
    assert [next(down), next(down)] == [second, first]


def _plan(sched: Schedule[In], last: float, now: float) -> tuple[list[float], int, float] | None:
    p = plan(sched, round(last * S), round(now * S))
    return None if p is None else ([t / S for t in p.fire], p.skipped, p.last / S)


def test_plan_fires_the_due_tick_and_nothing_before_it() -> None:
    sched = _schedule(every=10)
    assert _plan(sched, 100.0, 109.0) is None
    assert _plan(sched, 100.0, 110.0) == ([110.0], 0, 110.0)
    assert _plan(sched, 100.0, 110.5) == ([110.0], 0, 110.0)
    assert _plan(sched, 110.0, 112.0) is None


@pytest.mark.parametrize(
    ("missed", "max_lateness", "fired", "skipped"),
    [
        # Down from 103 to 203 (grace 5): ticks 110..190 were missed, 200 is on time.
        ("skip", None, [200.0], 9),
        ("once", None, [190.0, 200.0], 8),
        (3, None, [170.0, 180.0, 190.0, 200.0], 6),
        (3, 20.0, [190.0, 200.0], 8),
        ("once", 2.0, [], 10),
        (50, None, [float(t) for t in range(110, 201, 10)], 0),
    ],
)
def test_plan_missed_ticks_follow_the_policy(
    missed: object, max_lateness: float | None, fired: list[float], skipped: int
) -> None:
    sched = _schedule(every=10, grace=5, missed=missed, max_lateness=max_lateness)
    assert _plan(sched, 103.0, 203.0) == (fired, skipped, 200.0)


def test_plan_counts_a_long_pause_without_walking_it() -> None:
    sched = _schedule(every=1, grace=0, missed="skip")
    year = 365 * 24 * 3600
    assert _plan(sched, 0.0, float(year)) == ([float(year)], year - 1, float(year))
    sched = _schedule(every=0.001, grace=60, missed="skip")
    result = plan(sched, 0, 3600 * S)
    assert result is not None
    assert len(result.fire) == MAX_FIRE
    assert result.skipped == 3600 * 1000 - MAX_FIRE


def test_plan_for_cron_after_a_pause() -> None:
    sched = _schedule(cron="*/15 * * * *", grace=60, missed=2)
    start = datetime(2026, 1, 1, 0, 0, tzinfo=UTC).timestamp()
    result = _plan(sched, start, start + 3600 + 30)  # 4 ticks missed, 01:00 on time
    assert result is not None
    fire, skipped, last = result
    assert [datetime.fromtimestamp(t, UTC).strftime("%H:%M") for t in fire] == [
        "00:30",
        "00:45",
        "01:00",
    ]
    assert skipped == 1
    assert last == start + 3600


# -- end to end on a fake clock ------------------------------------------------------------


#: Scheduler rounds a step gives the schedulers and workers: a tick's claim, run and
#: settle take a few each.
SETTLE_ROUNDS = 100


class Env:
    def __init__(self) -> None:
        self.clock = FakeClock(T0)
        self.broker = MemoryBroker(BrokerSettings(namespace="sched"), clock=self.clock)

    async def advance(self, seconds: float, *, step: float = 10.0) -> None:
        """Move the fake clock in steps, letting the schedulers and workers act."""
        while seconds > 0:
            moved = min(step, seconds)
            self.clock.advance(moved)
            seconds -= moved
            self.broker.wake()
            await self.settle()

    async def settle(self) -> None:
        """Let the schedulers and workers run until they wait again (no time passes)."""
        for _ in range(SETTLE_ROUNDS):
            await anyio.lowlevel.cancel_shielded_checkpoint()


@contextlib.asynccontextmanager
async def env() -> AsyncIterator[Env]:
    with anyio.fail_after(20):
        yield Env()


@pytest.mark.anyio
async def test_cron_fires_once_per_tick_with_two_workers() -> None:
    async with env() as e:
        app = make_app(broker=e.broker)
        ran: Counter[float] = Counter()

        @app.task
        async def report(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran[ctx.scheduled_for] += 1

        app.schedule(report, In(1), cron="*/5 * * * *")
        async with app, app.worker(), app.worker():
            await e.settle()
            await e.advance(3600, step=60)
            await e.settle()
        assert set(ran.values()) == {1}
        assert len(ran) == 12
        assert all(datetime.fromtimestamp(t, UTC).minute % 5 == 0 for t in ran)
        assert all(datetime.fromtimestamp(t, UTC).second == 0 for t in ran)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("missed", "expected_runs"),
    [("skip", []), ("once", [T0 - 3 + 100]), (3, [T0 - 3 + 80, T0 - 3 + 90, T0 - 3 + 100])],
)
async def test_missed_ticks_while_no_worker_ran(missed: object, expected_runs: list[float]) -> None:
    async with env() as e:
        app = make_app(broker=e.broker)
        ran: list[float] = []

        @app.task
        async def poll(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran.append(ctx.scheduled_for)

        app.schedule(poll, In(1), every=10, grace=5, missed=missed)  # type: ignore[arg-type]
        async with app:
            async with app.worker():
                await e.settle()
            e.clock.advance(104)  # ten ticks pass with no worker: now is 7 s past the last
            async with app.worker():
                await e.settle()
            (state,) = await e.broker.schedule_states()
        assert sorted(ran) == expected_runs
        assert state.fired == len(expected_runs)
        assert state.skipped == 10 - len(expected_runs)


@pytest.mark.anyio
async def test_max_lateness_skips_late_ticks() -> None:
    async with env() as e:
        app = make_app(broker=e.broker)
        ran: list[float] = []

        @app.task
        async def poll(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran.append(ctx.scheduled_for)

        app.schedule(poll, In(1), every=10, missed=5, grace=0, max_lateness=25)
        async with app:
            async with app.worker():
                await e.settle()
            e.clock.advance(54)  # ticks at +7, +17, +27, +37, +47 pass; now is T0 + 54
            async with app.worker():
                await e.settle()
            (state,) = await e.broker.schedule_states()
        assert sorted(ran) == [T0 + 37, T0 + 47]
        assert state.skipped == 3


@pytest.mark.anyio
@pytest.mark.parametrize("overlap", ["skip", "queue", "allow"])
async def test_overlap_with_a_still_running_previous_tick(overlap: str) -> None:
    async with env() as e:
        app = make_app(broker=e.broker)
        started: list[float] = []
        release = anyio.Event()

        @app.task
        async def slow(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            started.append(ctx.scheduled_for)
            await release.wait()

        app.schedule(slow, In(1), every=10, overlap=overlap, grace=100)  # type: ignore[arg-type]
        async with app, app.worker(concurrency=4), app.worker(concurrency=4):
            await e.settle()
            await e.advance(30)  # three ticks while the first one still runs
            await e.settle()
            running_during = sorted(started)
            release.set()
            await e.settle()
            (state,) = await e.broker.schedule_states()
        first = T0 + 7
        if overlap == "skip":
            assert running_during == [first]
            assert sorted(started) == [first]
            assert (state.fired, state.skipped) == (1, 2)
        elif overlap == "queue":
            # The held ticks fire once the first run finishes; both are still within
            # grace (100 s), so both fire, in order (none counts as missed).
            assert running_during == [first]
            assert sorted(started) == [first, first + 10, first + 20]
            assert (state.fired, state.skipped) == (3, 0)
        else:
            assert running_during == [first, first + 10, first + 20]
            assert (state.fired, state.skipped) == (3, 0)


@pytest.mark.anyio
async def test_a_changed_definition_restarts_its_state() -> None:
    async with env() as e:
        v1 = make_app(broker=e.broker)
        ran: list[tuple[int, float]] = []

        @v1.task(name="poll")
        async def poll1(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran.append((x.n, ctx.scheduled_for))

        v1.schedule(poll1, In(1), every=10, name="poll", missed=10)
        async with v1, v1.worker():
            await e.settle()
            await e.advance(10)
            await e.settle()
        assert ran == [(1, T0 + 7)]
        e.clock.advance(100)  # ten ticks pass with no worker

        # Version 2 changes the payload: its state restarts, nothing of the ten past
        # ticks fires (version 1 with missed=10 would have caught them up).
        v2 = make_app(broker=e.broker)

        @v2.task(name="poll")
        async def poll2(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran.append((x.n, ctx.scheduled_for))

        v2.schedule(poll2, In(2), every=10, name="poll", missed=10)
        async with v2, v2.worker():
            await e.settle()
            (state,) = await e.broker.schedule_states()
            assert (state.fired, state.skipped, state.last_job) == (0, 0, "")
            await e.advance(10)
            await e.settle()
        assert ran == [(1, T0 + 7), (2, T0 + 117)]


@pytest.mark.anyio
async def test_a_removed_schedule_is_cleaned_up_and_never_fires() -> None:
    async with env() as e:
        v1 = make_app(broker=e.broker)

        @v1.task(name="poll")
        async def poll1(x: In) -> None: ...

        v1.schedule(poll1, In(1), every=10, name="a")
        v1.schedule(poll1, In(1), every=10, name="b")
        async with v1, v1.worker():
            await e.settle()
            assert [s.name for s in await e.broker.schedule_states()] == ["a", "b"]

        v2 = make_app(broker=e.broker)

        @v2.task(name="poll")
        async def poll2(x: In) -> Out | None: ...

        v2.schedule(poll2, In(1), every=10, name="a")
        async with v2, v2.worker():
            await e.settle()
            assert [s.name for s in await e.broker.schedule_states()] == ["a"]


@pytest.mark.anyio
async def test_a_single_task_worker_runs_only_that_tasks_schedules() -> None:
    async with env() as e:
        app = make_app(broker=e.broker)

        @app.task(queue="a")
        async def first(x: In) -> None: ...

        @app.task(queue="b")
        async def second(x: In) -> None: ...

        app.schedule(first, In(1), every=10)
        app.schedule(second, In(1), every=10)
        from typedq import Worker

        async with app, Worker(first):
            await e.settle()
            assert [s.name for s in await e.broker.schedule_states()] == ["first.every-10s"]


@pytest.mark.anyio
async def test_the_testing_harness_waits_for_due_ticks() -> None:
    app = make_app()
    ran: list[float] = []

    @app.task
    async def digest(x: In, ctx: JobContext) -> None:
        assert ctx.scheduled_for is not None
        ran.append(ctx.scheduled_for)

    app.schedule(digest, In(1), cron="0 8 * * *", tz="Europe/Paris")
    start = datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp()
    async with run_worker(app, clock=FakeClock(start)) as harness:
        await harness.idle()
        assert ran == []
        await harness.advance(24 * 3600)
        await harness.idle()
        assert [datetime.fromtimestamp(t, UTC).isoformat() for t in ran] == [
            "2026-06-02T06:00:00+00:00"  # 08:00 in Paris (CEST)
        ]


class FlakyClockBroker(MemoryBroker):
    """An embedded broker whose clock cannot be read, for the first few reads and the
    first few sleeps (an outage)."""

    def __init__(self, clock: VirtualClock, *, reads: int, sleeps: int) -> None:
        super().__init__(BrokerSettings(namespace="sched"), clock=clock)
        self.reads = reads
        self.sleeps = sleeps

    @property
    def failures(self) -> int:
        return self.reads + self.sleeps

    async def broker_time_us(self) -> int:
        if self.reads > 0:
            self.reads -= 1
            raise BrokerUnavailable("injected: the broker's clock could not be read")
        return await super().broker_time_us()

    async def sleep_until_us(self, when_us: int) -> None:
        if self.sleeps > 0:
            self.sleeps -= 1
            raise BrokerUnavailable("injected: the broker's clock could not be read")
        await super().sleep_until_us(when_us)


@pytest.mark.anyio
async def test_the_scheduler_outlives_broker_errors() -> None:
    # One virtual clock for the broker and the worker: the scheduler's backoffs after
    # the failures pass as the test moves it (grace=0: a stop waits on it too).
    clock = VirtualClock(start=T0)
    broker = FlakyClockBroker(clock, reads=2, sleeps=3)
    app = make_app(broker=broker)
    ran: list[float] = []

    @app.task
    async def poll(x: In, ctx: JobContext) -> None:
        assert ctx.scheduled_for is not None
        ran.append(ctx.scheduled_for)

    app.schedule(poll, In(1), every=10)
    with anyio.fail_after(20):
        async with app, app.worker(clock=clock, grace=0) as worker:
            for _ in range(20):  # the scheduler consumes the failures, backing off
                if not broker.failures:
                    break
                await clock.advance(0.1)
            assert broker.failures == 0
            assert clock.time() < T0 + 7  # the first tick is not due yet
            await clock.advance(10)
            for _ in range(1000):  # the worker runs the tick (no time passes)
                if ran:
                    break
                await anyio.lowlevel.checkpoint()
            assert worker.running <= 1
    assert ran == [T0 + 7]


def test_default_grace_is_one_interval_at_most_a_minute() -> None:
    assert _schedule(every=10).grace == 10.0
    assert _schedule(every=3600).grace == 60.0
    assert _schedule(cron="0 8 * * *").grace == 60.0
    assert _schedule(every=10, grace=0).grace == 0.0
    # Back from a 30 s pause with every=1: one missed tick fires ("once"), not thirty.
    result = _plan(_schedule(every=1), 100.0, 130.5)
    assert result == ([129.0, 130.0], 28, 130.0)
