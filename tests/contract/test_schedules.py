"""Schedules end to end, on every broker: workers fire each tick of an interval once.

The embedded broker runs on a fake clock that the test moves; Redis runs in real time
with short intervals (its clock is Redis TIME, which a test cannot move).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import AsyncIterator, Callable

import anyio
import pytest

from tests.support import TEST_DEADLINE, In
from typedq import App, JobContext, JobState
from typedq.broker.base import BrokerSettings, Completion, FireOutcome, ScheduleState, TickFiring
from typedq.broker.memory import MemoryBroker
from typedq.schedule import Overlap, tick_job_id
from typedq.testing import FakeClock

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

#: A start time in the middle of a 10 s interval (fake clock).
T0 = 1_800_000_003.0


class Drive:
    """Make apps on the test's broker and let time pass: the fake clock on the embedded
    broker, real time on Redis."""

    def __init__(self, app_name: str, broker_url: str) -> None:
        self.name = app_name
        self.fake = broker_url.startswith("memory")
        self.clock = FakeClock(T0)
        self.memory = MemoryBroker(BrokerSettings(namespace=app_name), clock=self.clock)
        self.url = broker_url
        #: The interval the tests use: 10 s of fake time, or 0.25 s of real time.
        self.every = 10.0 if self.fake else 0.25

    def app(self) -> App:
        return App(self.name, broker=self.memory if self.fake else self.url)

    async def ticks(self, n: int, until: Callable[[], bool]) -> None:
        """Let ``n`` intervals pass, then wait until ``until()`` holds."""
        for _ in range(n):
            if self.fake:
                self.clock.advance(self.every)
                self.memory.wake()
            await anyio.sleep(0.02 if self.fake else self.every)
        with anyio.fail_after(10):
            while not until():  # noqa: ASYNC110 - the condition spans workers and broker
                await anyio.sleep(0.01)


@contextlib.asynccontextmanager
async def driven(app_name: str, broker_url: str) -> AsyncIterator[Drive]:
    with anyio.fail_after(TEST_DEADLINE):
        yield Drive(app_name, broker_url)


async def test_each_tick_fires_once_with_two_workers(app_name: str, broker_url: str) -> None:
    async with driven(app_name, broker_url) as drive:
        app = drive.app()
        ran: Counter[float] = Counter()
        job_ids: set[str] = set()

        @app.task
        async def poll(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran[ctx.scheduled_for] += 1
            job_ids.add(ctx.job_id)

        # A generous grace: on a loaded machine a late tick must not count as missed here.
        sched = app.schedule(poll, In(1), every=drive.every, grace=60)
        async with app:
            async with app.worker(concurrency=2) as w1, app.worker(concurrency=2) as w2:
                await anyio.sleep(0.05)  # both schedulers reconciled
                await drive.ticks(6, lambda: len(ran) >= 5)
                await anyio.sleep(0.05 if drive.fake else drive.every)
            # Read once the workers (and so their schedulers) stopped: a tick fired in the last
            # moment may still wait as a job, and it is counted as such, not as a ran tick.
            (state,) = await app.broker.schedule_states()
            counts = await app.broker.counts(poll.queue)
        assert state.name == sched.name
        # Every tick ran once, none twice, and none between the first and the last is missing.
        assert set(ran.values()) == {1}, ran
        ticks = sorted(ran)
        assert len(ticks) >= 5
        step = round(drive.every * 1000)
        assert [round(t * 1000) for t in ticks] == [
            round(ticks[0] * 1000) + i * step for i in range(len(ticks))
        ]
        assert all(round(t * 1000) % step == 0 for t in ticks)  # on the interval's grid
        assert job_ids == {f"schedule:{sched.name}:{round(t * 1_000_000)}" for t in ticks}
        assert state.fired == len(ticks) + counts[JobState.WAITING] + counts[JobState.SCHEDULED]
        assert state.skipped == 0
        # Both workers ran the scheduler; between them they ran each tick once. (Claims
        # may count one more: a tick claimed as a worker stopped is handed back unrun.)
        assert w1.stats.completed + w2.stats.completed == len(ticks)
        released = w1.stats.released + w2.stats.released
        assert w1.stats.claimed + w2.stats.claimed == len(ticks) + released


async def test_a_new_schedule_does_not_fire_past_ticks(app_name: str, broker_url: str) -> None:
    """Declared now: its first tick is the next one, not the ones before it started."""
    async with driven(app_name, broker_url) as drive:
        app = drive.app()
        ran: list[float] = []

        @app.task
        async def poll(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            ran.append(ctx.scheduled_for)

        app.schedule(poll, In(1), every=drive.every, missed=5, grace=0)
        async with app:
            start = await app.broker.broker_time_us() / 1e6
            async with app.worker():
                await drive.ticks(2, lambda: len(ran) >= 1)
        assert min(ran) > start


async def test_overlap_skip_and_queue_while_the_previous_tick_runs(
    app_name: str, broker_url: str
) -> None:
    async with driven(app_name, broker_url) as drive:
        app = drive.app()
        started: dict[str, list[float]] = {"skip": [], "queue": []}
        release = anyio.Event()

        @app.task
        async def slow(x: In, ctx: JobContext) -> None:
            assert ctx.scheduled_for is not None
            started["skip" if x.n == 0 else "queue"].append(ctx.scheduled_for)
            await release.wait()

        app.schedule(slow, In(0), every=drive.every, overlap="skip", name="skip")
        # grace=0: a tick held at all is a missed tick when planned (missed="once").
        app.schedule(slow, In(1), every=drive.every, overlap="queue", name="queue", grace=0)
        async with app, app.worker(concurrency=8), app.worker(concurrency=8):
            await anyio.sleep(0.05)
            await drive.ticks(1, lambda: len(started["skip"]) == 1 and len(started["queue"]) == 1)
            await drive.ticks(4, lambda: True)  # four more ticks while both first runs block
            during = {k: list(v) for k, v in started.items()}
            states = {s.name: s for s in await app.broker.schedule_states()}
            release.set()
            await drive.ticks(0, lambda: len(started["queue"]) >= 2)
            await drive.ticks(1, lambda: len(started["skip"]) >= 2)
        assert during == {"skip": started["skip"][:1], "queue": started["queue"][:1]}
        assert states["skip"].skipped >= 3  # the ticks that came while the first one ran
        assert states["skip"].fired == 1
        assert states["queue"].skipped == 0  # held, not skipped
        assert states["queue"].fired == 1
        # The held ticks were planned when the first run finished: those past grace=0 are
        # missed ticks (missed="once": the newest of them fires), none of the early ones.
        assert started["queue"][1] >= started["queue"][0] + 3 * drive.every
        assert started["skip"][1] >= started["skip"][0] + 4 * drive.every


async def test_a_changed_definition_restarts_from_now(app_name: str, broker_url: str) -> None:
    async with driven(app_name, broker_url) as drive:
        ran: list[tuple[int, float]] = []

        def version(n: int) -> App:
            app = drive.app()

            @app.task(name="poll")
            async def poll(x: In, ctx: JobContext) -> None:
                assert ctx.scheduled_for is not None
                ran.append((x.n, ctx.scheduled_for))

            app.schedule(poll, In(n), every=drive.every, name="poll", missed=100, grace=0)
            return app

        v1 = version(1)
        async with v1, v1.worker():
            await anyio.sleep(0.05)
            await drive.ticks(2, lambda: len(ran) >= 1)
        await drive.ticks(4, lambda: True)  # nothing runs for four ticks
        v2 = version(2)
        async with v2:
            restarted = await v2.broker.broker_time_us() / 1e6
            async with v2.worker():
                await anyio.sleep(0.05)
                await drive.ticks(2, lambda: any(n == 2 for n, _ in ran))
            (state,) = await v2.broker.schedule_states()
        # Version 1's missed ticks were not caught up (its missed=100 would have): version
        # 2 started from its own start, with counts of its own.
        assert {n for n, _ in ran} == {1, 2}
        v2_ticks = [tick for n, tick in ran if n == 2]
        assert all(tick > restarted for tick in v2_ticks)
        assert state.digest == v2.schedules["poll"].digest
        assert state.skipped == 0
        # (a tick fired while the worker stopped may not have run)
        assert len(v2_ticks) <= state.fired <= len(v2_ticks) + 1


def _id_hash(job_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=8).digest(), "big")


@pytest.mark.parametrize("overlap", ["skip", "queue"])
async def test_overlap_holds_for_a_partitioned_task(
    app_name: str, broker_url: str, overlap: Overlap
) -> None:
    """Issue 24 defect 3. A partitioned task's schedule with overlap="skip"/"queue": while
    the previous tick's job is unfinished, no later tick fires. Each tick's job once went
    to the partition its own id hashes to, and Redis looked the previous job up in the new
    tick's partition, found nothing and fired (5-6 ticks ran at once). Every tick of a
    schedule now goes to one partition, the one its schedule hashes to."""
    app = App(app_name, broker=broker_url)

    @app.task(queue="hot", partitions=4)
    async def slow(x: In) -> None:
        pass

    sched = app.schedule(slow, In(0), every=1, overlap=overlap)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            (state,) = await broker.sync_schedules([(sched.name, sched.digest)], prune=False)
            ticks = [state.last_tick_us + i for i in range(1, 7)]

            def partitions(ticks: list[int]) -> set[int]:
                return {_id_hash(tick_job_id(sched.name, t)) % 4 for t in ticks}

            # The ids themselves must hash to several partitions (what sent them apart
            # before); six consecutive ticks all hash to one about once in 1,000 draws:
            # then the last tick moves on until it hashes elsewhere.
            while len(partitions(ticks)) == 1:
                ticks[-1] += 1
            assert len(partitions(ticks)) > 1
            assert {sched.message(t).queue for t in ticks} == {sched.queue}
            await broker.sleep_until_us(ticks[-1] + 1)  # every tick is due

            def firing(state: ScheduleState, tick: int) -> TickFiring:
                return TickFiring(
                    name=sched.name,
                    digest=sched.digest,
                    expected_last_us=state.last_tick_us,
                    new_last_us=tick,
                    messages=[sched.message(tick)],
                    overlap=overlap,
                    queue=sched.queue,
                )

            ((outcome, after),) = await broker.fire_schedules([firing(state, ticks[0])])
            assert outcome is FireOutcome.FIRED
            assert after is not None
            state = after
            running = await broker.claim(slow.queues, 1, worker_id="w", lease=30)
            assert [j.message.id for j in running] == [tick_job_id(sched.name, ticks[0])]
            for t in ticks[1:-1]:
                ((outcome, after),) = await broker.fire_schedules([firing(state, t)])
                assert after is not None
                expected = FireOutcome.OVERLAP_SKIPPED if overlap == "skip" else FireOutcome.HELD
                assert outcome is expected, (t, outcome)
                state = after
            pending = 0
            for q in slow.queues:
                counts = await broker.counts(q)
                pending += counts[JobState.WAITING] + counts[JobState.SCHEDULED]
            assert pending == 0
            await broker.complete([Completion(running[0].message.id, running[0].token, b"")])
            ((outcome, after),) = await broker.fire_schedules([firing(state, ticks[-1])])
            assert outcome is FireOutcome.FIRED
            assert after is not None
            assert after.fired == 2
            assert after.skipped == (4 if overlap == "skip" else 0)
