"""Workflows on the PostgreSQL broker beyond the contract suite (tests/contract/
test_workflows.py runs there too): the failure records its schema encodes itself, a job
with no flow left out of the flows' triggers, and flows settled by workers at once."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, In, Out, connected, msg
from typedq import App, FailureReason, FailureRecord, JobCancelled, JobState
from typedq.broker.base import Completion
from typedq.broker.postgres import PostgresBroker
from typedq.broker.records import broker_failure

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_apps = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize(
    ("message", "attempt", "worker"),
    [
        ("cancelled with its flow", 0, None),
        ("é" * 20, 127, "w-1"),  # 40 bytes of UTF-8: a str8
        ("x" * 300, 128, "w" * 40),  # str16; a uint8 attempt
        ("y" * 70_000, 70_000, None),  # str32; a uint32 attempt
        ("", 255, ""),
    ],
)
async def test_the_schemas_failure_records_decode_as_the_brokers_own(
    pg_cluster: PgCluster, message: str, attempt: int, worker: str | None
) -> None:
    """``mp_failure`` (migration 6) writes the msgpack map msgspec reads as the
    FailureRecord the Python side makes (``broker_failure``), for strings and attempts
    of every msgpack width."""
    async with connected(f"pgflows{next(_apps)}", pg_cluster.url):
        conn = await asyncpg.connect(pg_cluster.url.split("?")[0])
        try:
            got = await conn.fetchval(
                "SELECT typedq.mp_failure('cancelled', 'JobCancelled', $1, $2, $3, $4)",
                message,
                attempt,
                worker,
                1234.5,
            )
        finally:
            await conn.close()
    record = msgspec.msgpack.decode(got, type=FailureRecord)
    assert record == broker_failure(
        "cancelled", message, attempt=attempt, failed_at=1234.5, worker_id=worker
    )
    assert record.reason is FailureReason.CANCELLED


async def test_a_job_with_no_flow_has_no_flow_columns_and_no_flow_row(
    pg_cluster: PgCluster,
) -> None:
    """A plain job's row stores no flow column (they are NULL: no byte more per row) and
    finishing it writes nothing to the flows' tables."""
    app = f"pgflows{next(_apps)}"
    async with connected(app, pg_cluster.url) as broker:
        assert isinstance(broker, PostgresBroker)
        await broker.enqueue([msg(job_id="plain")])
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.complete([Completion(id="plain", token=job.token, result=b"\xc0")])
        conn = await asyncpg.connect(pg_cluster.url.split("?")[0])
        try:
            row = await conn.fetchrow(
                "SELECT flow_id, flow_member, flow_step, flow_shape, hole, parked, state "
                "FROM typedq.jobs WHERE id = 'plain' AND ns = $1",
                broker.ns,
            )
            flows = await conn.fetchval(
                "SELECT count(*) FROM typedq.flows WHERE ns = $1", broker.ns
            )
        finally:
            await conn.close()
    assert row is not None
    assert row["state"] == 3
    assert [row[k] for k in range(6)] == [None] * 6
    assert flows == 0


async def test_members_settled_by_workers_at_once_fan_in_once(pg_cluster: PgCluster) -> None:
    """Three worker processes' worth of brokers (pools of their own) settle a fan-out's
    members at once: each member counts once (the flows row is locked by each settle),
    and the callback runs once, with every result in input order."""
    name = f"pgflows{next(_apps)}"
    runs: list[list[int]] = []

    def make() -> tuple[App, Any, Any]:
        app = App(name, broker=pg_cluster.url)

        @app.task
        async def square(x: In) -> Out:
            return Out(x.n * x.n)

        @app.task
        async def total(xs: list[Out]) -> Out:
            runs.append([x.n for x in xs])
            return Out(sum(x.n for x in xs))

        return app, square, total

    apps = [make() for _ in range(3)]
    producer, square, total = apps[0]
    with anyio.fail_after(TEST_DEADLINE):
        async with contextlib.AsyncExitStack() as stack:
            for app, _, _ in apps:
                await stack.enter_async_context(app)
            job = await square.map(In(i) for i in range(120)).then(total).enqueue()
            for app, _, _ in apps:
                await stack.enter_async_context(app.worker(concurrency=8))
            assert await job.result(timeout=TEST_DEADLINE) == Out(sum(i * i for i in range(120)))
            state = await producer.broker.flow_state(job.id)
    assert runs == [[i * i for i in range(120)]]
    assert state is not None
    assert state.pending == -1


async def test_a_flow_cancelled_while_its_members_settle_ends_whole(
    pg_cluster: PgCluster,
) -> None:
    """The flow's own job cancelled while workers settle its members: the cancel's end of
    the flow and the members' settles lock the same rows in opposite orders (a deadlock
    PostgreSQL breaks by rolling one back, which the broker sends again); every job of
    the flow ends, none is left waiting, and the callback never runs."""
    name = f"pgflows{next(_apps)}"
    app = App(name, broker=pg_cluster.url)
    ran: list[int] = []
    started: list[int] = []
    under_way = anyio.Event()

    @app.task
    async def slow(x: In) -> Out:
        started.append(x.n)
        if len(started) >= 20:
            under_way.set()
        await anyio.sleep(0.002 * (x.n % 5))
        return Out(x.n)

    @app.task
    async def total(xs: list[Out]) -> Out:
        ran.append(len(xs))  # pragma: no cover
        return Out(len(xs))  # pragma: no cover

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await slow.map(In(i) for i in range(200)).then(total).enqueue()
            async with app.worker(concurrency=16):
                await under_way.wait()
                assert await job.cancel()
                with pytest.raises(JobCancelled):
                    await job.result(timeout=TEST_DEADLINE)
                while True:
                    counts = await app.broker.counts("default")
                    if counts[JobState.ACTIVE] == 0:
                        break
                    await anyio.sleep(0.02)
            counts = await app.broker.counts("default")
            state = await app.broker.flow_state(job.id)
    assert ran == []
    assert counts[JobState.WAITING] == counts[JobState.SCHEDULED] == 0
    assert counts[JobState.COMPLETED] + counts[JobState.CANCELLED] == 201
    assert state is not None
    assert state.pending == -1


async def test_two_producers_storing_one_flow_id_at_once_store_it_once(
    pg_cluster: PgCluster,
) -> None:
    """Idempotent producers racing on one flow id (each its own pool): one stores the
    flow, the others find it (``created`` False), none fails on a taken job id."""
    name = f"pgflows{next(_apps)}"

    def make() -> tuple[App, Any]:
        app = App(name, broker=pg_cluster.url)

        @app.task
        async def first(x: In) -> Out:
            return Out(x.n)  # pragma: no cover

        @app.task
        async def second(xs: list[Out]) -> Out:
            return xs[0]  # pragma: no cover

        return app, first.map([In(1), In(2), In(3)]).then(second)

    made = [make() for _ in range(4)]
    created: list[bool] = []
    with anyio.fail_after(TEST_DEADLINE):
        async with contextlib.AsyncExitStack() as stack:
            for app, _ in made:
                await stack.enter_async_context(app)

            async def store(flow: Any) -> None:
                created.append((await flow.enqueue(job_id="same-flow")).created)

            async with anyio.create_task_group() as tg:
                for _, flow in made:
                    tg.start_soon(store, flow)
            counts = await made[0][0].broker.counts("default")
    assert sorted(created) == [False, False, False, True]
    assert counts[JobState.WAITING] + counts[JobState.SCHEDULED] == 4
