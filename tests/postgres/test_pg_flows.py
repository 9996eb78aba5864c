"""Workflows on the PostgreSQL broker beyond the contract suite (tests/contract/
test_workflows.py runs there too): the failure records its schema encodes itself, and a
job with no flow left out of the flows' triggers."""

from __future__ import annotations

import itertools

import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import connected, msg
from typedq import FailureReason, FailureRecord
from typedq.broker.base import Completion
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
    """``mp_failure`` (migration 5) writes the msgpack map msgspec reads as the
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
