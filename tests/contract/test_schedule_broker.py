"""Broker contract for schedules: reconciliation by digest, and the atomic, compare-and-set
firing of ticks (exactly once, overlap policies, queue bounds).

Runs once per broker (memory under asyncio and trio, Redis under asyncio) against the
:class:`~typedq.broker.base.Broker` interface only. Ticks here are in the past of the
broker's clock (a broker refuses to fire a tick before its time).
"""

from __future__ import annotations

import time

import pytest

from tests.support import claim_one, connected, one
from typedq import JobState
from typedq.broker.base import (
    Broker,
    Completion,
    FireOutcome,
    JobMessage,
    ScheduleState,
    TickFiring,
)

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

S = 1_000_000


def tick_message(name: str, tick_us: int, *, queue: str = "q") -> JobMessage:
    return JobMessage(
        id=f"schedule:{name}:{tick_us}",
        task="t",
        queue=queue,
        payload=b"\x81\xa1n\x01",
        scheduled_for=tick_us / S,
    )


def firing(
    state: ScheduleState,
    ticks: list[int],
    *,
    new_last: int | None = None,
    skipped: int = 0,
    overlap: str = "allow",
    queue: str = "q",
) -> TickFiring:
    return TickFiring(
        name=state.name,
        digest=state.digest,
        expected_last_us=state.last_tick_us,
        new_last_us=new_last if new_last is not None else max(ticks),
        messages=[tick_message(state.name, t, queue=queue) for t in ticks],
        skipped=skipped,
        overlap=overlap,
    )


async def fresh_state(broker: Broker, name: str = "s", digest: str = "d1") -> ScheduleState:
    (state,) = await broker.sync_schedules([(name, digest)], prune=False)
    return state


async def test_sync_starts_at_broker_now_and_keeps_equal_digests(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        now = await broker.broker_time_us()
        assert abs(now / S - time.time()) < 5
        a, _b = await broker.sync_schedules([("a", "d1"), ("b", "d1")], prune=True)
        assert (a.name, a.digest, a.fired, a.skipped, a.last_job) == ("a", "d1", 0, 0, "")
        assert now <= a.last_tick_us <= await broker.broker_time_us()
        # Move "a" on, then reconcile again with the same digest: its state is kept.
        (fired, state) = (
            await broker.fire_schedules(
                [firing(a, [a.last_tick_us - S], new_last=a.last_tick_us + 1)]
            )
        )[0]
        assert fired is FireOutcome.FIRED
        assert state is not None
        (again,) = await broker.sync_schedules([("a", "d1")], prune=False)
        assert again == state
        # Another digest restarts it: no fired count, no last job, last tick = now.
        (changed,) = await broker.sync_schedules([("a", "d2")], prune=False)
        assert (changed.digest, changed.fired, changed.last_job) == ("d2", 0, "")
        assert changed.last_tick_us >= state.last_tick_us
        assert {s.name for s in await broker.schedule_states()} == {"a", "b"}


async def test_sync_prunes_undeclared_schedules(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.sync_schedules([("a", "d"), ("b", "d"), ("c", "d")], prune=True)
        await broker.sync_schedules([("a", "d")], prune=False)
        assert [s.name for s in await broker.schedule_states()] == ["a", "b", "c"]
        (b,) = await broker.sync_schedules([("b", "d")], prune=True)
        assert [s.name for s in await broker.schedule_states()] == ["b"]
        # A removed schedule never fires again from a worker that still declares it.
        gone = ScheduleState(name="a", digest="d", last_tick_us=b.last_tick_us)
        outcome, state = (await broker.fire_schedules([firing(gone, [b.last_tick_us])]))[0]
        assert (outcome, state) == (FireOutcome.STALE, None)


async def test_a_tick_fires_once_however_many_ask(app_name: str, broker_url: str) -> None:
    """Two schedulers that read the same state fire the same tick: one enqueues it."""
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        tick = state.last_tick_us + 1
        now = await broker.broker_time_us()
        assert now >= tick
        one_firing = firing(state, [tick])
        first, second = await broker.fire_schedules([one_firing, one_firing])
        assert first[0] is FireOutcome.FIRED
        assert second[0] is FireOutcome.STALE
        assert second[1] == first[1]
        after = first[1]
        assert after is not None
        assert (after.last_tick_us, after.fired, after.skipped) == (tick, 1, 0)
        assert after.last_job == f"schedule:s:{tick}"
        assert after.last_fired_us >= now
        # A third copy, sent later (a lost reply re-sent): still nothing new.
        (third,) = await broker.fire_schedules([one_firing])
        assert third[0] is FireOutcome.STALE
        assert (await broker.counts("q"))[JobState.WAITING] == 1
        claimed = await claim_one(broker)
        assert claimed.message == tick_message("s", tick)  # scheduled_for travels
        assert claimed.message.scheduled_for == tick / S


async def test_ticks_are_never_fired_before_their_time(app_name: str, broker_url: str) -> None:
    """A worker whose clock runs ahead cannot fire a future tick: the broker's clock rules."""
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        future = await broker.broker_time_us() + 3600 * S
        (result,) = await broker.fire_schedules([firing(state, [future])])
        assert result == (FireOutcome.STALE, state)
        assert (await broker.counts("q"))[JobState.WAITING] == 0


async def test_stale_digest_or_tick_changes_nothing(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        tick = state.last_tick_us - S
        other = TickFiring(
            name="s",
            digest="other",
            expected_last_us=state.last_tick_us,
            new_last_us=state.last_tick_us + 1,
            messages=[tick_message("s", tick)],
        )
        behind = TickFiring(
            name="s",
            digest="d1",
            expected_last_us=state.last_tick_us - 5,
            new_last_us=state.last_tick_us + 1,
            messages=[tick_message("s", tick)],
        )
        results = await broker.fire_schedules([other, behind])
        assert results == [(FireOutcome.STALE, state), (FireOutcome.STALE, state)]
        assert (await broker.counts("q"))[JobState.WAITING] == 0


async def test_skipped_ticks_are_counted(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        last = state.last_tick_us + 1
        (result,) = await broker.fire_schedules([firing(state, [], new_last=last, skipped=4)])
        assert result[0] is FireOutcome.FIRED
        assert result[1] is not None
        assert (result[1].last_tick_us, result[1].fired, result[1].skipped) == (last, 0, 4)
        assert result[1].last_job == ""


async def test_overlap_skip_while_the_previous_tick_runs(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        t1, t2, t3 = (state.last_tick_us + i for i in (1, 2, 3))
        (r1,) = await broker.fire_schedules([firing(state, [t1], overlap="skip")])
        assert r1[0] is FireOutcome.FIRED
        assert r1[1] is not None
        running = await claim_one(broker)
        (r2,) = await broker.fire_schedules([firing(r1[1], [t2], overlap="skip")])
        assert r2[0] is FireOutcome.OVERLAP_SKIPPED
        assert r2[1] is not None
        assert (r2[1].last_tick_us, r2[1].fired, r2[1].skipped) == (t2, 1, 1)
        assert r2[1].last_job == f"schedule:s:{t1}"
        assert (await broker.counts("q"))[JobState.WAITING] == 0
        await broker.complete([Completion(running.message.id, running.token, b"")])
        (r3,) = await broker.fire_schedules([firing(r2[1], [t3], overlap="skip")])
        assert r3[0] is FireOutcome.FIRED
        assert r3[1] is not None
        assert (r3[1].fired, r3[1].skipped, r3[1].last_job) == (2, 1, f"schedule:s:{t3}")


async def test_overlap_queue_holds_until_the_previous_tick_finishes(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        t1, t2 = state.last_tick_us + 1, state.last_tick_us + 2
        (r1,) = await broker.fire_schedules([firing(state, [t1], overlap="queue")])
        assert r1[0] is FireOutcome.FIRED
        assert r1[1] is not None
        # Waiting counts as unfinished, as running does.
        (held,) = await broker.fire_schedules([firing(r1[1], [t2], overlap="queue")])
        assert held == (FireOutcome.HELD, r1[1])
        running = await claim_one(broker)
        (held,) = await broker.fire_schedules([firing(r1[1], [t2], overlap="queue")])
        assert held == (FireOutcome.HELD, r1[1])
        await broker.complete([Completion(running.message.id, running.token, b"")])
        (r2,) = await broker.fire_schedules([firing(r1[1], [t2], overlap="queue")])
        assert r2[0] is FireOutcome.FIRED
        assert r2[1] is not None
        assert (r2[1].fired, r2[1].skipped) == (2, 0)
        assert (await one(broker, f"schedule:s:{t2}")).state is JobState.WAITING


async def test_overlap_allow_fires_regardless(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        t1, t2 = state.last_tick_us + 1, state.last_tick_us + 2
        (r1,) = await broker.fire_schedules([firing(state, [t1])])
        assert r1[1] is not None
        (r2,) = await broker.fire_schedules([firing(r1[1], [t2])])
        assert r2[0] is FireOutcome.FIRED
        assert (await broker.counts("q"))[JobState.WAITING] == 2


async def test_a_full_queue_skips_the_tick(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=1) as broker:
        state = await fresh_state(broker)
        t1, t2 = state.last_tick_us + 1, state.last_tick_us + 2
        (r1,) = await broker.fire_schedules([firing(state, [t1])])
        assert r1[1] is not None
        (r2,) = await broker.fire_schedules([firing(r1[1], [t2])])
        assert r2[0] is FireOutcome.FULL
        assert r2[1] is not None
        assert (r2[1].last_tick_us, r2[1].fired, r2[1].skipped) == (t2, 1, 1)
        assert (await broker.counts("q"))[JobState.WAITING] == 1


async def test_catch_up_fires_several_ticks_in_one_step(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        state = await fresh_state(broker)
        ticks = [state.last_tick_us - 3 * S + i * S for i in range(1, 4)]
        new_last = state.last_tick_us + 1
        (result,) = await broker.fire_schedules(
            [firing(state, ticks, new_last=new_last, skipped=2)]
        )
        assert result[0] is FireOutcome.FIRED
        assert result[1] is not None
        assert (result[1].fired, result[1].skipped, result[1].last_tick_us) == (3, 2, new_last)
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=10)
        assert [c.message.scheduled_for for c in claimed] == [t / S for t in ticks]
