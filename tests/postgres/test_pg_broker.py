"""The PostgreSQL broker beyond the contract suite: its URL, its schema's migrations, what
it refuses at connect, the records it writes itself, and its connections killed under a
running worker (a throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import itertools
from collections import Counter

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, In, Out, claim_one, connected, msg, one
from typedq import App, ConfigError, FailureRecord, JobState, Run
from typedq.broker import broker_from_url
from typedq.broker.base import BrokerSettings
from typedq.broker.postgres import PostgresBroker
from typedq.broker.postgres.schema import MIGRATIONS
from typedq.broker.records import CANCELLED_WORKER_LOST, stalled_message

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_schemas = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    return pg_cluster.url


def fresh_schema(url: str) -> tuple[str, str]:
    schema = f"fresh_{next(_schemas)}_{id(url) % 1000}"
    return schema, f"{url}?schema={schema}"


def test_urls_name_the_broker_and_its_schema() -> None:
    settings = BrokerSettings()
    for scheme in ("postgresql", "postgres"):
        broker = broker_from_url(f"{scheme}://u:secret@h:5/db?schema=jobs_1", settings)
        assert isinstance(broker, PostgresBroker)
        assert broker.target.schema == "jobs_1"
        assert "schema" not in broker.target.dsn
        assert "secret" not in repr(broker)
    assert broker_from_url("postgresql://h/db", settings).target.schema == "typedq"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"invalid schema 'Bad-Name' in the broker URL: use"):
        broker_from_url("postgresql://h/db?schema=Bad-Name", settings)


async def test_several_processes_migrate_a_fresh_schema_once(pg_url: str) -> None:
    schema, url = fresh_schema(pg_url)
    brokers = [PostgresBroker(url, BrokerSettings(namespace=f"m{i}")) for i in range(6)]
    with anyio.fail_after(TEST_DEADLINE):
        async with anyio.create_task_group() as tg:
            for broker in brokers:
                tg.start_soon(broker.connect)
        try:
            conn = await asyncpg.connect(pg_url)
            try:
                query = f'SELECT version FROM "{schema}".migrations'  # noqa: S608 (a test's own name)
                versions = await conn.fetch(query)
            finally:
                await conn.close()
            assert sorted(r[0] for r in versions) == list(range(1, len(MIGRATIONS) + 1))
            # Every broker works on the schema; connecting again migrates nothing.
            for broker in brokers:
                assert (await broker.enqueue([msg()]))[0].created
            again = PostgresBroker(url)
            await again.connect()
            await again.close()
        finally:
            for broker in brokers:
                await broker.close()


async def test_an_app_with_durable_functions_connects_and_runs_one(
    pg_url: str, app_name: str
) -> None:
    """The broker has Runs now (migration 9): an app declaring a durable function
    connects, and a run of it ends with its result (tests/contract/test_durable_runs.py
    holds the rules)."""
    app = App(app_name, broker=pg_url)

    @app.durable
    async def onboard(run: Run, x: In) -> Out:
        return Out(x.n)

    async with app, app.worker():
        handle = await onboard.start(In(n=3), run_id="once")
        with anyio.fail_after(TEST_DEADLINE):
            assert await handle.result() == Out(3)


async def test_a_workflow_runs_on_postgres_beside_plain_tasks(pg_url: str, app_name: str) -> None:
    app = App(app_name, broker=pg_url)

    @app.task
    async def step(x: In) -> Out:
        return Out(x.n)

    @app.task
    async def last(x: Out) -> Out:
        return x

    async with app:
        flow = await step.then(last).enqueue(In(1))
        job = await step.enqueue(In(2))
        async with app.worker():
            assert await flow.result(timeout=TEST_DEADLINE) == Out(1)
            assert await job.result(timeout=TEST_DEADLINE) == Out(2)


def test_trio_is_refused_in_one_line(pg_url: str) -> None:
    broker = PostgresBroker(pg_url)

    async def go() -> None:
        await broker.connect()

    with pytest.raises(ConfigError, match=r"runs on asyncio .* run the app under anyio's asyncio"):
        anyio.run(go, backend="trio")


_record = msgspec.msgpack.Decoder(FailureRecord).decode


async def test_the_broker_writes_stalled_and_lost_records_as_memory_does(
    pg_url: str, app_name: str
) -> None:
    async with connected(app_name, pg_url, max_stalls=0) as broker:
        stalled, lost = msg(), msg()
        await broker.enqueue([stalled, lost])
        first = await claim_one(broker, lease=0.05, worker_id="w-a")
        second = await claim_one(broker, lease=0.05, worker_id="w-b")
        assert await broker.cancel(second.message.id) == "requested"
        await anyio.sleep(0.2)  # the leases (broker clock) run out
        assert await broker.recover_stalled() == 2
        a = await one(broker, first.message.id)
        assert a.state is JobState.FAILED
        assert a.error is not None
        assert a.errors == (a.error,)
        record = _record(a.error)
        assert record.reason == "stalled"
        assert record.message == stalled_message(1, 0)
        assert record.worker_id == "w-a"
        assert record.attempt == 1
        b = await one(broker, second.message.id)
        assert b.state is JobState.CANCELLED
        assert b.error is not None
        assert _record(b.error).message == CANCELLED_WORKER_LOST


class _Progress:
    """Set when the worker moved on (a handler ran) since the storm's last round."""

    def __init__(self) -> None:
        self.event = anyio.Event()

    def moved(self) -> None:
        self.event.set()


async def _terminate_others(
    url: str, stop: anyio.Event, killed: list[int], progress: _Progress
) -> None:
    """Every 200 ms, terminate every other client connection of the cluster, but only
    once the worker moved on since the last round: on a loaded box a reconnect and a call
    can take longer than 200 ms, and a storm at a fixed pace then cut every call short
    (nothing moved for 40 s: a livelock of the test, not of the broker). ``stop`` is set
    with ``progress.moved()``."""
    conn = await asyncpg.connect(url)
    try:
        while not stop.is_set():
            n = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
            killed.append(int(n))
            progress.event = anyio.Event()
            with anyio.move_on_after(0.2):
                await stop.wait()
            await progress.event.wait()
    finally:
        await conn.close()


@pytest.mark.slow
async def test_terminated_connections_lose_no_job_and_run_none_twice(
    pg_url: str, app_name: str
) -> None:
    app = App(app_name, broker=pg_url, lease=5.0)
    runs: Counter[int] = Counter()

    @app.task
    async def tally(x: In) -> Out:
        runs[x.n] += 1
        progress.moved()
        await anyio.sleep(0.001)
        return Out(x.n)

    killed: list[int] = []
    progress = _Progress()
    with anyio.fail_after(120):
        async with app:
            jobs = await tally.enqueue_many(In(i) for i in range(500))
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(_terminate_others, pg_url, stop, killed, progress)
                async with app.worker(concurrency=16):
                    # Waiting for the results reads through the storm too.
                    results = [await job.result(timeout=60) for job in jobs]
                stop.set()
                progress.moved()
    assert results == [Out(i) for i in range(500)]
    assert runs == dict.fromkeys(range(500), 1)  # none lost, none run twice
    assert sum(killed) > 5  # the storm did hit the broker's connections
