"""``typedq inspect`` lists schedules: next and last fire times, counts and status."""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest

from tests.process.test_inspect import inspect
from tests.redis_harness import RedisProcess, flushall
from tests.support import TEST_DEADLINE, In
from typedq import App
from typedq.broker.base import TickFiring
from typedq.inspector import Inspector

S = 1_000_000


@pytest.mark.anyio
@pytest.mark.core_store  # the PostgreSQL broker too
async def test_schedules_with_next_and_last_fire_times(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def poll(x: In) -> None: ...

    every = app.schedule(poll, In(1), every=60)
    cron = app.schedule(poll, In(1), cron="30 7 * * 1", tz="Europe/Paris", name="weekly")
    app.schedule(poll, In(1), every=5, name="waiting")
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            state, _, _ = await broker.sync_schedules(
                [(every.name, every.digest), ("weekly", "an-older-definition"), ("gone", "d")],
                prune=True,
            )
            tick = state.last_tick_us // (60 * S) * (60 * S)
            ((_, fired),) = await broker.fire_schedules(
                [
                    TickFiring(
                        name=every.name,
                        digest=every.digest,
                        expected_last_us=state.last_tick_us,
                        new_last_us=state.last_tick_us + 1,
                        messages=[every.message(tick)],
                        skipped=2,
                    )
                ]
            )
            assert fired is not None
            now = await broker.broker_time_us()
            tool = Inspector(app.client, app.queues, schedules=list(app.schedules.values()))
            views = {v.name: v for v in await tool.schedules()}
            overview = await tool.overview()
            bare = await Inspector(app.client, app.queues).schedules()
    assert sorted(views) == ["gone", "poll.every-60s", "waiting", "weekly"]
    ok = views[every.name]
    assert (ok.status, ok.task, ok.every, ok.cron) == ("ok", "poll", 60.0, None)
    assert (ok.fired, ok.skipped, ok.last_job) == (1, 2, every.message(tick).id)
    assert ok.last_fired == fired.last_fired_us / S
    assert ok.last_tick == (state.last_tick_us + 1) / S
    # (Inspect reads the broker's clock again: a tick may pass in between.)
    assert ok.next_fire is not None
    assert ok.next_fire in (every.next_tick(now) / S, every.next_tick(now) / S + 60)
    assert views["weekly"].status == "changed"
    assert (views["weekly"].cron, views["weekly"].tz) == ("30 7 * * 1", "Europe/Paris")
    assert views["weekly"].next_fire == cron.next_tick(now) / S
    assert views["gone"].status == "not declared"
    assert views["gone"].next_fire is None
    assert views["waiting"].status == "not started"
    assert views["waiting"].next_fire is not None
    assert views["waiting"].next_fire % 5 == 0
    assert 0 < views["waiting"].next_fire - now / S <= 10
    assert views["waiting"].last_fired is None
    # The overview reads the broker's clock again: a tick may pass in between, so a next
    # fire time there is the same or one period (every=) later.
    assert len(overview.schedules) == len(views)
    for seen, view in zip(overview.schedules, views.values(), strict=True):
        assert msgspec.structs.replace(seen, next_fire=None) == msgspec.structs.replace(
            view, next_fire=None
        )
        later = (seen.next_fire or 0) - (view.next_fire or 0)
        assert later == 0 or (view.every is not None and later == view.every), (seen, view)
    # Without the app's declarations: the broker's states, no next fire time.
    assert [(v.name, v.status, v.next_fire) for v in bare] == [
        ("gone", "not declared", None),
        ("poll.every-60s", "not declared", None),
        ("weekly", "not declared", None),
    ]


@pytest.mark.redis
def test_cli_lists_schedules(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    from tests import schedule_app

    async def reconcile() -> None:
        schedule_app.app.use_broker(redis_server.url)
        async with schedule_app.app:
            sched = schedule_app.schedule
            await schedule_app.app.broker.sync_schedules([(sched.name, sched.digest)], prune=True)

    anyio.run(reconcile)
    result = inspect("tests.schedule_app:app", "--broker", redis_server.url, "--json")
    assert result.returncode == 0, result.stderr
    (view,) = json.loads(result.stdout)["schedules"]
    assert view["name"] == "tick.every-1s"
    assert view["status"] == "ok"
    assert view["next_fire"] > view["last_tick"]
    assert view["fired"] == 0
    table = inspect("tests.schedule_app:app", "--broker", redis_server.url)
    assert table.returncode == 0, table.stderr
    assert "schedules" in table.stdout
    assert "tick.every-1s" in table.stdout
    assert "every 1s" in table.stdout
