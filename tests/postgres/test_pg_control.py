"""Unique windows and debounce on PostgreSQL under racing producers: two brokers (two
pools, as two producer processes) of one app enqueue the same key at once, many calls in
flight on each. The contract suite (tests/contract/test_flow_control.py) has the rules;
here is the race the marker's lock must win, and what plain jobs are spared (a
throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq import JobState
from typedq.broker.base import BrokerSettings, EnqueueControl, EnqueueOutcome
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

#: Keyed enqueues in flight on each of the two brokers.
PER_BROKER = 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _race(
    url: str, app_name: str, control: EnqueueControl
) -> tuple[list[PostgresBroker], list[EnqueueOutcome], dict[str, bytes]]:
    """Enqueue one key PER_BROKER times on each of two brokers at once: the outcomes, and
    the payload each job id was sent with (the last one wins a debounce)."""
    brokers = [PostgresBroker(url, BrokerSettings(namespace=app_name)) for _ in range(2)]
    for broker in brokers:
        await broker.connect()
    outcomes: list[EnqueueOutcome] = []
    sent: dict[str, bytes] = {}

    async def one(broker: PostgresBroker, i: int) -> None:
        payload = msgspec.msgpack.encode(i)
        message = msg(queue="race", task="t", payload=payload)
        sent[message.id] = payload
        (outcome,) = await broker.enqueue_controlled([(message, control)])
        outcomes.append(outcome)

    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            for i in range(PER_BROKER):
                for b, broker in enumerate(brokers):
                    tg.start_soon(one, broker, 2 * i + b)
    return brokers, outcomes, sent


async def test_racing_producers_of_one_unique_key_make_one_job(
    pg_cluster: PgCluster, app_name: str
) -> None:
    brokers, outcomes, _ = await _race(
        pg_cluster.url, app_name, EnqueueControl(key="k", unique_for=3600.0)
    )
    try:
        assert sum(o.created for o in outcomes) == 1
        assert len({o.id for o in outcomes}) == 1
        counts = await brokers[0].counts("race")
        assert sum(counts.values()) == 1
    finally:
        for broker in brokers:
            await broker.close()


async def test_racing_producers_of_one_debounce_key_make_one_job_with_a_sent_payload(
    pg_cluster: PgCluster, app_name: str
) -> None:
    brokers, outcomes, sent = await _race(
        pg_cluster.url, app_name, EnqueueControl(key="k", wait=600.0, max_wait=3600.0)
    )
    try:
        assert sum(o.created for o in outcomes) == 1
        (job_id,) = {o.id for o in outcomes}
        counts = await brokers[0].counts("race")
        assert counts[JobState.SCHEDULED] == 1
        assert sum(counts.values()) == 1
        (record,) = await brokers[1].get([job_id])
        assert record is not None
        # The job keeps its own id, with one of the payloads sent (each replacement is
        # whole: never an id and a payload of two different enqueues).
        assert record.message.id == job_id
        assert record.message.payload in set(sent.values())
        assert 600.0 <= record.run_at - record.enqueued_at <= 3600.0
    finally:
        for broker in brokers:
            await broker.close()


async def test_plain_jobs_carry_no_marker(pg_cluster: PgCluster, app_name: str) -> None:
    """Jobs without a key pay nothing for flow control: no marker, no ``ctl``."""
    broker = PostgresBroker(pg_cluster.url, BrokerSettings(namespace=app_name))
    await broker.connect()
    try:
        plain = msg(queue="plain")
        await broker.enqueue([plain])
        keyed = msg(queue="plain")
        await broker.enqueue_controlled([(keyed, EnqueueControl(key="k", unique_for=60.0))])
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            schema = broker.target.schema
            rows = await conn.fetch(
                f'SELECT id, ctl FROM "{schema}".jobs WHERE ns = $1 ORDER BY id',  # noqa: S608
                app_name,
            )
            markers = await conn.fetch(
                f'SELECT job_id FROM "{schema}".ctl_markers WHERE ns = $1',  # noqa: S608
                app_name,
            )
        finally:
            await conn.close()
        ctl = {row["id"]: row["ctl"] for row in rows}
        assert ctl == {plain.id: None, keyed.id: "t|k"}
        assert [row["job_id"] for row in markers] == [keyed.id]
    finally:
        await broker.close()
