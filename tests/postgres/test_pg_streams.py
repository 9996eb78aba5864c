"""The PostgreSQL broker's event streams and job streams beyond the contract files: an
event is written in the transaction of the job's final move (a rollback writes none)
and only for a queue whose stream is on; two queues' events written by transactions
that end jobs in opposite orders never deadlock; both kinds of stream stay bounded in
the tables; reads wait on the listener and wake on another process's commit; expired
streams and readers are swept by the reaper's pass (a throwaway cluster:
tests/pg_harness.py)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq.broker.base import BrokerSettings, ClaimedJob, Completion, FinishOutcome, Retention
from typedq.broker.messages import JobState
from typedq.broker.postgres import PostgresBroker
from typedq.broker.streams import STREAM_MAX, StreamAppend

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def brokers(
    url: str, ns: str, n: int = 1, *, events_max: int = 10_000
) -> AsyncIterator[list[PostgresBroker]]:
    """``n`` connected brokers of namespace ``ns``, each with its own pool and listener
    (as ``n`` processes would have)."""
    made = [
        PostgresBroker(url, BrokerSettings(namespace=ns, events_max=events_max)) for _ in range(n)
    ]
    try:
        with anyio.fail_after(TEST_DEADLINE):
            for broker in made:
                await broker.connect()
            yield made
    finally:
        for broker in made:
            await broker.close()


async def sql(broker: PostgresBroker, query: str, *args: Any) -> Any:
    """One value of ``query`` on the broker's pool; ``{s}`` is its schema, quoted."""
    return await broker._pool.fetchval(query.format(s=f'"{broker.target.schema}"'), *args)


async def claim(broker: PostgresBroker, queue: str, n: int) -> list[ClaimedJob]:
    jobs = await broker.claim([queue], n, worker_id="w", lease=30)
    assert len(jobs) == n
    return jobs


async def test_an_event_is_written_with_the_final_move_and_only_for_a_queue_with_events(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name) as (broker,):
        assert await broker.enable_events("on") == 0
        await broker.enqueue([msg(queue="on", job_id="a"), msg(queue="off", job_id="b")])
        (a,) = await claim(broker, "on", 1)
        (b,) = await claim(broker, "off", 1)
        count = "SELECT count(*) FROM {s}.events WHERE ns = $1"
        # The final move rolled back: its event goes with it (one transaction).
        async with broker._pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            args = broker._completion_args([Completion("a", a.token, b"r")])
            assert await conn.fetchval(broker._sql["complete"], *args) == [0]
            await conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the deferred trigger, now
            schema = f'"{broker.target.schema}"'
            assert await conn.fetchval(count.format(s=schema), app_name) == 1
            await tx.rollback()
        assert await sql(broker, count, app_name) == 0
        assert (await broker.read_events("on", 0, timeout=0)).events == []
        # Committed: the event is there; a queue whose stream is off gets none.
        done = [Completion("a", a.token, b"r"), Completion("b", b.token, b"s")]
        assert await broker.complete(done) == [FinishOutcome.OK] * 2
        assert await sql(broker, count, app_name) == 1
        read = await broker.read_events("on", 0, timeout=0)
        assert [(e.seq, e.id, e.state, e.data) for e in read.events] == [
            (1, "a", JobState.COMPLETED, b"r")
        ]
        assert (
            await sql(broker, "SELECT count(*) FROM {s}.event_queues WHERE ns = $1", app_name) == 1
        )


async def test_events_of_two_queues_ended_in_opposite_orders_never_deadlock(
    pg_cluster: PgCluster, app_name: str
) -> None:
    rounds = 40
    async with brokers(pg_cluster.url, app_name, 2) as (one, two):
        for queue in ("x", "y"):
            await one.enable_events(queue)
            await one.enqueue([msg(queue=queue) for _ in range(2 * rounds)])

        async def finish(broker: PostgresBroker, first: str, second: str) -> None:
            for _ in range(rounds):
                jobs = await claim(broker, first, 1) + await claim(broker, second, 1)
                # Each transaction ends a job of each queue, the two in opposite orders.
                done = [Completion(j.message.id, j.token, b"") for j in jobs]
                assert await broker.complete(done) == [FinishOutcome.OK] * 2

        async with anyio.create_task_group() as tg:
            tg.start_soon(finish, one, "x", "y")
            tg.start_soon(finish, two, "y", "x")
        for queue in ("x", "y"):
            read = await one.read_events(queue, 0, timeout=0, limit=1000)
            assert [e.seq for e in read.events] == list(range(1, 2 * rounds + 1))
            assert len({e.id for e in read.events}) == 2 * rounds


async def test_event_streams_stay_near_their_cap_in_the_table(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name, events_max=10) as (broker,):
        await broker.enable_events("q")
        await broker.enqueue([msg() for _ in range(300)])
        while jobs := await broker.claim(["q"], 16, worker_id="w", lease=30):
            await broker.complete([Completion(j.message.id, j.token, b"") for j in jobs])
        held = await sql(broker, "SELECT count(*) FROM {s}.events WHERE ns = $1", app_name)
        # Trimmed by chunks of 64: at least the cap, never a chunk more.
        assert 10 <= held < 10 + 64
        read = await broker.read_events("q", 0, timeout=0, limit=1000)
        assert read.missed == 300 - held
        assert [e.seq for e in read.events] == list(range(300 - held + 1, 301))


async def test_reads_wait_on_the_listener_and_wake_on_another_process_commit(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name, 2) as (reader, writer):
        await writer.enable_events("q")
        await writer.enqueue([msg(job_id="e"), msg(job_id="s")])
        e, s = await claim(writer, "q", 2)
        woke: dict[str, float] = {}

        async def read_events() -> None:
            read = await reader.read_events("q", 0, timeout=20)
            assert [x.id for x in read.events] == ["e"]
            woke["events"] = time.monotonic()

        async def read_stream() -> None:
            entries = await reader.read_stream("s", queue="q", after="", timeout=20)
            assert [x.data for x in entries] == [b"x"]
            woke["stream"] = time.monotonic()

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_events)
            tg.start_soon(read_stream)
            await anyio.sleep(0.3)
            assert woke == {}  # both wait (no connection each: the broker's listener)
            sent = time.monotonic()
            await writer.complete([Completion("e", e.token, b"")])
            append = StreamAppend(
                job_id="s", queue="q", token=s.token, attempt=1, seq=0, items=[b"x"], fresh=True
            )
            assert await writer.append_streams([append]) == [True]
        # Woken by the notifications, long before the reads' timeouts.
        assert woke["events"] - sent < 2.0
        assert woke["stream"] - sent < 2.0


async def test_a_job_stream_stays_near_its_cap_and_expired_streams_are_swept(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name) as (broker,):
        await broker.enqueue([msg(job_id="big"), msg(job_id="brief")])
        big, brief = await claim(broker, "q", 2)
        total = STREAM_MAX + 500
        for at in range(0, total, 1000):
            items = [b"i"] * min(1000, total - at)
            append = StreamAppend(
                job_id="big",
                queue="q",
                token=big.token,
                attempt=1,
                seq=at,
                items=items,
                fresh=at == 0,
            )
            assert await broker.append_streams([append]) == [True]
        entries = "SELECT count(*) FROM {s}.stream_entries WHERE ns = $1 AND job_id = $2"
        held = await sql(broker, entries, app_name, "big")
        # Trimmed by chunks of 100 (Redis MAXLEN ~): at least the cap, never a chunk more.
        assert STREAM_MAX <= held < STREAM_MAX + 100
        first = await broker.read_stream("big", queue="q", after="", timeout=0, limit=1)
        assert first[0].seq == total - held
        # A stream past its ttl is not read, and the reaper's pass deletes it.
        brief_append = StreamAppend(
            job_id="brief",
            queue="q",
            token=brief.token,
            attempt=1,
            seq=0,
            items=[b"b"],
            fresh=True,
            ttl=0.2,
        )
        assert await broker.append_streams([brief_append]) == [True]
        assert len(await broker.read_stream("brief", queue="q", after="", timeout=0)) == 1
        await broker.read_stream("brief", queue="q", after="", timeout=0, reader="r1")
        assert (
            await sql(broker, "SELECT count(*) FROM {s}.stream_readers WHERE ns = $1", app_name)
            == 1
        )
        await broker.leave_stream("brief", queue="q", reader="r1")
        assert (
            await sql(broker, "SELECT count(*) FROM {s}.stream_readers WHERE ns = $1", app_name)
            == 0
        )
        await anyio.sleep(0.3)
        assert await broker.read_stream("brief", queue="q", after="", timeout=0) == []
        await broker.recover_stalled()
        assert await sql(broker, entries, app_name, "brief") == 0
        streams = "SELECT count(*) FROM {s}.streams WHERE ns = $1"
        assert await sql(broker, streams, app_name) == 1  # the big one, live


async def test_a_read_of_a_stream_that_never_started_waits_then_finds_nothing(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name) as (broker,):
        started = time.monotonic()
        assert await broker.read_stream("none", queue="q", after="", timeout=0.3) == []
        assert time.monotonic() - started >= 0.25
        # The broker's waiters are forgotten once the reads end.
        assert broker._stream_waiters == {}
        assert broker._event_waiters == {}


async def test_a_job_retention_deletes_in_its_own_final_move_still_has_its_event(
    pg_cluster: PgCluster, app_name: str
) -> None:
    # completed_max=1: each completion deletes the completed jobs before it, in the
    # same transaction, before the deferred trigger writes the events at commit.
    broker = PostgresBroker(
        pg_cluster.url,
        BrokerSettings(namespace=app_name, retention=Retention(completed_max=1)),
    )
    await broker.connect()
    try:
        await broker.enable_events("q")
        await broker.enqueue([msg(job_id=f"j{n}") for n in range(20)])
        jobs = await claim(broker, "q", 20)
        await broker.complete([Completion(j.message.id, j.token, b"r") for j in jobs[:10]])
        for job in jobs[10:]:
            await broker.complete([Completion(job.message.id, job.token, b"r")])
        read = await broker.read_events("q", 0, timeout=0, limit=100)
        assert [(e.id, e.data) for e in read.events] == [(f"j{n}", b"r") for n in range(20)]
        assert await sql(broker, "SELECT count(*) FROM {s}.jobs WHERE ns = $1", app_name) == 1
    finally:
        await broker.close()


async def test_batches_of_appends_to_several_jobs_answer_in_their_order(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name, 2) as (one, two):
        await one.enqueue([msg(job_id=f"j{n}") for n in range(4)])
        runs = {j.message.id: j for j in await claim(one, "q", 4)}

        def append(job_id: str, token: str, seq: int) -> StreamAppend:
            return StreamAppend(
                job_id=job_id, queue="q", token=token, attempt=1, seq=seq, items=[b"x"]
            )

        # Batches naming the same streams in opposite orders, at once, many times: each
        # answers in its own order (a stranger's token refused), and none deadlocks.
        async def send(broker: PostgresBroker, ids: list[str]) -> None:
            for seq in range(30):
                batch = [append(i, runs[i].token, seq) for i in ids]
                batch.insert(1, append(ids[0], "stranger", seq))
                assert await broker.append_streams(batch) == [True, False, True, True, True]

        async with anyio.create_task_group() as tg:
            tg.start_soon(send, one, ["j0", "j1", "j2", "j3"])
            tg.start_soon(send, two, ["j3", "j2", "j1", "j0"])
        for job_id in runs:
            entries = await one.read_stream(job_id, queue="q", after="", timeout=0)
            assert len(entries) == 60


async def test_waiting_reads_wake_when_the_listener_is_lost(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name, 2) as (reader, writer):
        await writer.enable_events("q")
        await writer.enqueue([msg(job_id="e")])
        (e,) = await claim(writer, "q", 1)
        listener = reader._listener
        assert listener is not None
        old = listener._conn
        pid = old.get_server_pid()
        woke: list[float] = []

        async def read_events() -> None:
            assert (await reader.read_events("q", 0, timeout=20)).events == []
            woke.append(time.monotonic())

        async def read_stream() -> None:
            assert await reader.read_stream("e", queue="q", after="", timeout=20) == []
            woke.append(time.monotonic())

        async with anyio.create_task_group() as tg:
            tg.start_soon(read_events)
            tg.start_soon(read_stream)
            await anyio.sleep(0.3)
            # The listener's connection dies: a notification may have been missed, so
            # the waiting reads are woken (to read again), not left to their timeout.
            lost = time.monotonic()
            await sql(writer, "SELECT pg_terminate_backend($1)", pid)
        assert len(woke) == 2
        assert max(woke) - lost < 5.0
        # The listener is back (its reset woke every waiter once more, at once): a read
        # waits again and is woken by the next event.
        while listener._conn is old:  # noqa: ASYNC110 -- the listener task sets it; bounded
            await anyio.sleep(0.01)
        async with anyio.create_task_group() as tg:
            tg.start_soon(writer.complete, [Completion("e", e.token, b"")])
            read = await reader.read_events("q", 0, timeout=20)
        assert [x.id for x in read.events] == ["e"]


async def test_appends_leave_the_streams_index_alone_while_the_expiry_barely_moves(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with brokers(pg_cluster.url, app_name) as (broker,):
        await broker.enqueue([msg(job_id="h")])
        (run,) = await claim(broker, "q", 1)
        stats = (
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables "
            "WHERE schemaname = $1 AND relname = 'streams'"
        )
        schema = broker.target.schema
        async with broker._pool.acquire() as conn:

            async def counters() -> tuple[int, int]:
                await conn.execute("SELECT pg_stat_force_next_flush()")
                await conn.execute("SELECT pg_stat_clear_snapshot()")
                row = await conn.fetchrow(stats, schema)
                return int(row[0]), int(row[1])

            before = await counters()
            for seq in range(50):
                args = (app_name, ["h"], [run.token], [1], [seq], [seq == 0], [False])
                taken = await conn.fetchval(
                    broker._sql["append_streams"],
                    *args,
                    [86400.0],
                    [1],
                    [b"x"],
                    STREAM_MAX,
                    broker.channel,
                )
                assert taken == [True]
            after = await counters()
        updates, hot = after[0] - before[0], after[1] - before[1]
        # Each append updates its stream's row; with the expiry left alone (it would move
        # by less than a minute of a day's ttl) every update but the first is HOT.
        assert updates == 50
        assert hot >= 49
