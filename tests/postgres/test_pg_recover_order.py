"""Stall recovery on PostgreSQL hands one call's jobs back in their order (migration 15),
as the embedded broker and Redis do: two fair keys whose lanes left with their only jobs
come back oldest first, whatever order the table holds the rows in.

``recover`` took the expired leases in deadline order, a job at a time; jobs of one claim
share a deadline, so they came in the table's order, and a fair key with no lane joins at
the tail as its job comes back: the keys' next turns followed the rows' places. The
combined model check on PostgreSQL diverged on this now and then (fair seed 100)."""

from __future__ import annotations

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import connected, msg
from typedq.broker.postgres import PostgresBroker

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _fair(job_id: str, key: str) -> object:
    return msgspec.structs.replace(msg(job_id=job_id), fair_key=key, fair_weight=1)


async def test_recovered_fair_keys_come_back_oldest_first(pg_cluster: PgCluster) -> None:
    base = pg_cluster.url.split("?")[0]
    schema = "recover_order"
    async with connected("recover-order", f"{base}?schema={schema}") as broker:
        assert isinstance(broker, PostgresBroker)
        jobs = [_fair(f"j{i}", f"k{i}") for i in range(6)]
        await broker.enqueue(jobs)  # type: ignore[arg-type]
        claimed = await broker.claim(["q"], 6, worker_id="w", lease=0.001)
        assert [c.message.id for c in claimed] == [f"j{i}" for i in range(6)]
        conn = await asyncpg.connect(base)
        try:
            # The oldest rows rewritten where an index sees it (their lease moved and
            # moved back: new tuples, behind the others'), so the table and its index
            # give the expired leases of one deadline newest first.
            for delta in (1, -1):
                await conn.execute(
                    f'UPDATE "{schema}".jobs SET lease_until = lease_until + $3 '  # noqa: S608
                    "WHERE ns = $1 AND id = ANY ($2)",
                    broker.ns,
                    ["j0", "j1", "j2"],
                    float(delta),
                )
        finally:
            await conn.close()
        await anyio.sleep(0.05)  # every lease ran out
        assert await broker.recover_stalled() == 6
        again = await broker.claim(["q"], 6, worker_id="w", lease=30)
    assert [c.message.id for c in again] == [f"j{i}" for i in range(6)]
