"""The PostgreSQL broker's schedules beyond the contract files: a tick fired at once by
many brokers (each its own pool of connections) is fired by one, and its job stored once
(a throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import anyio
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE
from typedq import JobState
from typedq.broker.base import BrokerSettings, FireOutcome, JobMessage, TickFiring
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_tick_fired_by_many_brokers_at_once_fires_once(
    pg_cluster: PgCluster, app_name: str
) -> None:
    brokers = [PostgresBroker(pg_cluster.url, BrokerSettings(namespace=app_name)) for _ in range(6)]
    with anyio.fail_after(TEST_DEADLINE):
        for broker in brokers:
            await broker.connect()
        try:
            (state,) = await brokers[0].sync_schedules([("s", "d")], prune=False)
            for round_ in range(1, 6):
                tick = state.last_tick_us + 1
                await brokers[0].sleep_until_us(tick)
                firing = TickFiring(
                    name="s",
                    digest="d",
                    expected_last_us=state.last_tick_us,
                    new_last_us=tick,
                    messages=[
                        JobMessage(id=f"schedule:s:{tick}", task="t", queue="q", payload=b"\xc0")
                    ],
                )
                got: list[tuple[FireOutcome, object]] = []

                async def fire(
                    broker: PostgresBroker,
                    firing: TickFiring = firing,
                    got: list[tuple[FireOutcome, object]] = got,
                ) -> None:
                    got.extend(await broker.fire_schedules([firing, firing]))

                async with anyio.create_task_group() as tg:
                    for broker in brokers:
                        tg.start_soon(fire, broker)
                fired = [o for o, _ in got if o is FireOutcome.FIRED]
                assert len(fired) == 1, got
                assert all(o in (FireOutcome.FIRED, FireOutcome.STALE) for o, _ in got)
                (state,) = await brokers[0].schedule_states()
                assert (state.last_tick_us, state.fired) == (tick, round_)
            assert (await brokers[0].counts("q"))[JobState.WAITING] == 5
        finally:
            for broker in brokers:
                await broker.close()
