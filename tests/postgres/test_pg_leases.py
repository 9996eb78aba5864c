"""The PostgreSQL broker's lease renewal beside other transactions (the contract suite,
tests/contract/test_broker_leases.py, runs here too): a renewal never waits for a row
lock, so a settle in flight never holds a worker's other leases back (issue 30: a step
run twice by live workers on the durable SIGKILL batch)."""

from __future__ import annotations

import anyio
import asyncpg
import pytest

from tests.pg_harness import PgCluster
from tests.support import claim_one, connected, msg
from typedq.broker.base import Broker, Completion, FinishOutcome, LeaseStatus
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

#: Seconds a renewal may take here: far below PostgreSQL's deadlock_timeout (1 s) and a
#: worker's shortest usual lease.
PROMPT = 0.5


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _pg(broker: Broker) -> PostgresBroker:
    assert isinstance(broker, PostgresBroker)
    return broker


def _jobs(broker: Broker) -> str:
    return f'"{_pg(broker).target.schema}".jobs'


async def _lease_until(conn: asyncpg.Connection, broker: Broker, job_id: str) -> float:
    sql = f"SELECT lease_until FROM {_jobs(broker)} WHERE ns = $1 AND id = $2"  # noqa: S608
    value: float = await conn.fetchval(sql, _pg(broker).ns, job_id)
    return value


async def test_a_renewal_does_not_wait_for_a_job_another_transaction_holds(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """A worker's jobs ``a`` and ``b``; another transaction holds ``b``'s row (as the
    worker's own settle of ``b`` does until it commits, behind the locks its triggers
    take). The renewal of both answers at once: ``a`` renewed, ``b`` still the worker's
    (OK, left as it is). Before, it waited for ``b``'s row holding ``a``'s: a settle
    that then wanted ``a`` deadlocked with it, found only after deadlock_timeout, by
    when the worker's leases had run out and another worker started its jobs again."""
    async with connected(app_name, pg_cluster.url) as broker:
        await broker.enqueue([msg(job_id="a"), msg(job_id="b")])
        a, b = await broker.claim(["q"], 2, worker_id="w", lease=30)
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            before = await _lease_until(conn, broker, "a")
            async with conn.transaction():
                await conn.execute(
                    f"SELECT 1 FROM {_jobs(broker)} WHERE ns = $1 AND id = 'b' FOR UPDATE",  # noqa: S608
                    _pg(broker).ns,
                )
                with anyio.fail_after(PROMPT):
                    statuses = await broker.renew([("a", a.token), ("b", b.token)], 60)
                assert statuses == [LeaseStatus.OK, LeaseStatus.OK]
                assert await _lease_until(conn, broker, "a") > before + 20
            # The row free again, the next renewal renews it too.
            with anyio.fail_after(PROMPT):
                statuses = await broker.renew([("a", a.token), ("b", b.token)], 60)
            assert statuses == [LeaseStatus.OK, LeaseStatus.OK]
            assert await _lease_until(conn, broker, "b") > before + 20
        finally:
            await conn.close()


async def test_a_renewal_beside_a_settle_in_flight_tells_the_outcome_next_time(
    pg_cluster: PgCluster, app_name: str
) -> None:
    """A renewal that passes a held row answers by what it read; once the holder
    committed (the job completed, or recovered and claimed by another worker), the next
    renewal says the lease is lost, and the stale owner's settle is refused."""
    async with connected(app_name, pg_cluster.url, lease=30) as broker:
        await broker.enqueue([msg(job_id="s")])
        mine = await claim_one(broker, lease=30)
        conn = await asyncpg.connect(pg_cluster.url)
        try:
            async with conn.transaction():
                # Another worker's reaper takes the job back (its lease as if run out).
                await conn.execute(
                    f"UPDATE {_jobs(broker)} SET state = 0, token = NULL, lease_until = 0 "  # noqa: S608
                    "WHERE ns = $1 AND id = 's'",
                    _pg(broker).ns,
                )
                with anyio.fail_after(PROMPT):
                    assert await broker.renew([("s", mine.token)], 30) == [LeaseStatus.OK]
            # Committed: the renewal does not bring the lease back.
            assert await broker.renew([("s", mine.token)], 30) == [LeaseStatus.LOST]
            theirs = await claim_one(broker, lease=30, worker_id="w2")
            assert theirs.attempt == 2
            assert await broker.renew([("s", mine.token)], 30) == [LeaseStatus.LOST]
            assert await broker.complete([Completion("s", mine.token, b"stale")]) == [
                FinishOutcome.LEASE_LOST
            ]
            assert await broker.complete([Completion("s", theirs.token, b"real")]) == [
                FinishOutcome.OK
            ]
        finally:
            await conn.close()
