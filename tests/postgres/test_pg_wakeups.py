"""The PostgreSQL broker's notifications only for those who wait (migration 17, issue 30):
an enqueue notifies a queue only when a worker waits for its work, a finish notifies a
job only when someone waits for its end, and no wake-up is lost either way: a worker
about to wait sees every job an enqueue in flight stores (it waits for that enqueue's
commit), and a waiter that watches a job a finish holds sees the end."""

from __future__ import annotations

import random
import time

import anyio
import asyncpg
import pytest
from anyio.abc import TaskStatus

from tests.pg_harness import PgCluster
from tests.support import claim_one, connected, msg
from typedq.broker.base import Broker, ClaimedJob, Completion, JobRecord
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

#: Far below the waits' timeouts below: a wait that ends before it was woken.
PROMPT = 1.5
#: The waits' timeouts: a wait that runs into it missed its wake-up.
TIMEOUT = 4.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pg(broker: Broker) -> PostgresBroker:
    assert isinstance(broker, PostgresBroker)
    return broker


class Notes:
    """The notifications of a broker's channel, heard on a connection of its own."""

    def __init__(self) -> None:
        self.heard: list[str] = []
        self.conn: asyncpg.Connection | None = None

    async def listen(self, url: str, channel: str) -> None:
        self.conn = await asyncpg.connect(url)
        await self.conn.add_listener(channel, lambda *a: self.heard.append(a[3]))

    async def settle(self) -> list[str]:
        """What was heard so far, after a round trip (a commit's notifications are
        delivered before the answer to a statement sent after it)."""
        assert self.conn is not None
        await self.conn.execute("SELECT 1")
        await anyio.sleep(0.05)
        heard, self.heard = self.heard, []
        return heard

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()


async def test_an_enqueue_notifies_only_a_queue_a_worker_waits_for(
    pg_cluster: PgCluster, app_name: str
) -> None:
    async with connected(app_name, pg_cluster.url) as broker:
        pg = _pg(broker)
        notes = Notes()
        await notes.listen(pg_cluster.url, pg.channel)
        try:
            # Nobody waits: the enqueue is not announced.
            await broker.enqueue([msg(job_id="a")])
            assert await notes.settle() == []
            await claim_one(broker)
            # A worker waits: the next enqueue notifies (once), the one after it not
            # (the mark is cleared: the worker reads the queue before it waits again).
            async with anyio.create_task_group() as tg:
                woken = anyio.Event()

                async def wait() -> None:
                    await broker.wait_for_jobs(["q"], TIMEOUT)
                    woken.set()

                tg.start_soon(wait)
                for _ in range(1000):  # until the worker has marked the queue
                    if await _marked(pg, pg_cluster.url, "q"):
                        break
                    await anyio.sleep(0.01)
                started = time.monotonic()
                await broker.enqueue([msg(job_id="b")])
                await woken.wait()
                assert time.monotonic() - started < PROMPT
            await broker.enqueue([msg(job_id="c")])
            assert await notes.settle() == [f"w:{pg.ns}:q"]
        finally:
            await notes.close()


async def _marked(pg: PostgresBroker, url: str, queue: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        schema = pg.target.schema
        sql = f'SELECT waiting FROM "{schema}".sleepers WHERE ns = $1 AND queue = $2'  # noqa: S608
        return bool(await conn.fetchval(sql, pg.ns, queue))
    finally:
        await conn.close()


async def test_a_worker_going_idle_sees_an_enqueue_in_flight(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """An enqueue that read the marks before the worker set its own, not committed yet:
    the worker's read waits for that commit and finds the job (the enqueue notified
    nobody)."""
    async with connected(app_name, pg_cluster.url) as broker:
        pg = _pg(broker)
        args = pg._enqueue_args([msg(job_id="late")])
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.fetchval(pg._sql["enqueue_waking"], *args)
            done = anyio.Event()

            async def wait() -> None:
                await broker.wait_for_jobs(["q"], TIMEOUT)
                done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.3)
                assert not done.is_set()  # waiting for the enqueue's commit, not asleep
                started = time.monotonic()
                await tx.commit()
                await done.wait()
                assert time.monotonic() - started < PROMPT
        finally:
            await conn.close()
        assert (await claim_one(broker)).message.id == "late"


async def test_no_enqueue_wake_up_is_lost_in_a_race(pg_cluster: PgCluster, app_name: str) -> None:
    """A worker that comes up short and waits, and a producer (another process's broker)
    enqueueing at a random moment around it, many times: every wait ends promptly."""
    async with (
        connected(app_name, pg_cluster.url, deadline=120) as worker,
        connected(app_name, pg_cluster.url, deadline=120) as producer,
    ):
        rng = random.Random(30)
        slow = []
        for i in range(150):
            assert await worker.claim(["q"], 1, worker_id="w", lease=30) == []

            async def enqueue(i: int = i) -> None:
                await anyio.sleep(rng.random() * 0.004)
                await producer.enqueue([msg(job_id=f"j{i}")])

            started = time.monotonic()
            async with anyio.create_task_group() as tg:
                tg.start_soon(enqueue)
                await worker.wait_for_jobs(["q"], TIMEOUT)
            if time.monotonic() - started > PROMPT:
                slow.append(i)
            job = await claim_one(worker)
            await worker.complete([Completion(job.message.id, job.token, b"")])
        assert slow == []


async def test_a_finish_notifies_only_a_watched_job(pg_cluster: PgCluster, app_name: str) -> None:
    async with connected(app_name, pg_cluster.url) as broker:
        pg = _pg(broker)
        notes = Notes()
        await notes.listen(pg_cluster.url, pg.channel)
        try:
            await broker.enqueue([msg(job_id="quiet"), msg(job_id="watched")])
            await notes.settle()
            for _ in range(2):
                job = await claim_one(broker)
                if job.message.id == "watched":
                    waited = await _finish_watched(broker, job.message.id, job.token)
                    assert waited
                else:
                    await broker.complete([Completion(job.message.id, job.token, b"")])
            assert await notes.settle() == [f"f:{pg.ns}:watched"]
        finally:
            await notes.close()


async def test_a_finish_notifies_a_job_an_earlier_version_enqueued(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """A job whose mark is unknown (NULL: enqueued by an earlier version, whose waiters
    do not watch, or by an enqueue other than the plain one) has its end notified as
    before migration 17: a rolling deploy's older producers still hear their jobs end."""
    async with connected(app_name, pg_cluster.url) as broker:
        pg = _pg(broker)
        notes = Notes()
        await notes.listen(pg_cluster.url, pg.channel)
        try:
            await broker.enqueue([msg(job_id="new"), msg(job_id="older")])
            assert notes.conn is not None
            await notes.conn.execute(
                f'UPDATE "{pg.target.schema}".jobs SET watched = NULL WHERE ns = $1 AND id = $2',  # noqa: S608 -- the test's own schema name
                pg.ns,
                "older",
            )
            await notes.settle()
            for _ in range(2):
                job = await claim_one(broker)
                await broker.complete([Completion(job.message.id, job.token, b"")])
            assert await notes.settle() == [f"f:{pg.ns}:older"]
        finally:
            await notes.close()


async def _finish_watched(broker: Broker, job_id: str, token: str) -> bool:
    """Complete ``job_id`` while ``wait_finished`` waits for it; whether the wait ended
    with the job's end, promptly."""
    got: list[JobRecord | None] = []

    async def wait(*, task_status: TaskStatus[None]) -> None:
        got.append(await broker.wait_finished(job_id, TIMEOUT, task_status=task_status))

    async with anyio.create_task_group() as tg:
        await tg.start(wait)
        started = time.monotonic()
        await broker.complete([Completion(job_id, token, b"")])
    record = got[0]
    return record is not None and record.state.is_final and time.monotonic() - started < PROMPT


async def test_a_waiter_watching_a_job_its_finish_holds_sees_the_end(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """A finish holds the job's row (its transaction not committed: no notification for
    the waiter, who had not watched it then); the waiter's watch waits for that commit
    and its read then sees the job final."""
    async with connected(app_name, pg_cluster.url) as broker:
        pg = _pg(broker)
        await broker.enqueue([msg(job_id="held")])
        job = await claim_one(broker)
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            tx = conn.transaction()
            await tx.start()
            await conn.fetchval(
                pg._sql["complete"], *pg._completion_args([Completion("held", job.token, b"")])
            )
            got: list[JobRecord | None] = []

            async def wait() -> None:
                got.append(await broker.wait_finished("held", TIMEOUT))

            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await anyio.sleep(0.3)
                assert got == []
                started = time.monotonic()
                await tx.commit()
            assert time.monotonic() - started < PROMPT
            assert got[0] is not None
            assert got[0].state.is_final
        finally:
            await conn.close()


async def test_no_finish_wake_up_is_lost_in_a_race(pg_cluster: PgCluster, app_name: str) -> None:
    """A waiter starting at a random moment around its job's completion, many times:
    every wait ends promptly with the job's end."""
    async with (
        connected(app_name, pg_cluster.url, deadline=120) as waiter,
        connected(app_name, pg_cluster.url, deadline=120) as worker,
    ):
        rng = random.Random(17)
        late = []
        for i in range(150):
            await worker.enqueue([msg(job_id=f"r{i}")])
            job = await claim_one(worker)
            started = time.monotonic()
            record = await _race(waiter, worker, job, rng.random() * 0.004)
            if time.monotonic() - started > PROMPT or record is None:
                late.append(i)
        assert late == []


async def _race(waiter: Broker, worker: Broker, job: ClaimedJob, delay: float) -> JobRecord | None:
    """``waiter`` waits for ``job``'s end while ``worker`` completes it after ``delay``
    seconds; what the wait returned."""
    got: list[JobRecord | None] = []

    async def wait() -> None:
        got.append(await waiter.wait_finished(job.message.id, TIMEOUT))

    async def finish() -> None:
        await anyio.sleep(delay)
        await worker.complete([Completion(job.message.id, job.token, b"")])

    async with anyio.create_task_group() as tg:
        tg.start_soon(finish)
        tg.start_soon(wait)
    return got[0]
