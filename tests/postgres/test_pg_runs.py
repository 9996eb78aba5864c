"""Durable runs on the PostgreSQL broker beyond the contract suite (tests/contract/
test_durable_runs.py runs there too): the triggers of migration 9 leave jobs that are
no steps alone, by a test of the row alone."""

from __future__ import annotations

import itertools

import anyio
import asyncpg
import msgspec
import pytest

from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, connected
from typedq.broker.base import Completion, Failure, JobMessage
from typedq.broker.postgres import PostgresBroker
from typedq.broker.runs import RunAppend, RunSpec

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

_apps = itertools.count()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("run_queue", ["", "q", "a" * 31, "b" * 32, "c" * 300])
@pytest.mark.parametrize("trace_links", ["", "00-abc-01"])
def test_the_step_triggers_find_run_queue_third_from_the_end(
    run_queue: str, trace_links: str
) -> None:
    """The triggers' condition (migration 9): an envelope's third byte from the end is
    0xa0 (an empty str) exactly when its ``run_queue`` is empty, as long as ``fair_key``
    (empty) and ``fair_weight`` (0) follow it: a plain job's (a fair job's final state
    calls ``run_step``, which finds no run for it; migration 10). A field added after
    them breaks this test before it breaks the triggers."""
    message = JobMessage(
        id="r:1",
        task="t",
        queue="q",
        payload=b"\xa0\xa0\x00",
        trace_links=trace_links,
        run_queue=run_queue,
    )
    encoded = msgspec.msgpack.encode(message)
    assert (encoded[-3] == 0xA0) == (run_queue == "")
    assert encoded[-2:] == b"\xa0\x00"
    assert list(JobMessage.__struct_fields__[-3:]) == ["run_queue", "fair_key", "fair_weight"]


async def test_jobs_that_are_no_steps_never_call_the_run_triggers(pg_cluster: PgCluster) -> None:
    """Plain jobs finish without calling ``run_step`` (one whose id looks like a running
    run's step, ``r:1``, too) or ``run_turn`` (a failed one, ``r-x``); one that fails with
    a turn's id (``r:t9``) calls ``run_turn``, which leaves the run alone (not its turn
    task); the run's real step calls ``run_step`` once. Counted by PostgreSQL's function
    statistics."""
    url = pg_cluster.url.split("?")[0]
    admin = await asyncpg.connect(url)
    try:
        await admin.execute("ALTER DATABASE postgres SET track_functions = 'pl'")
        await admin.execute("SELECT pg_stat_reset()")
        app = f"pgruns{next(_apps)}"
        async with connected(app, pg_cluster.url) as broker:
            assert isinstance(broker, PostgresBroker)
            spec = RunSpec(
                id="r", name="f", queue="q", turn_task="typedq.run.f", turn_payload=b"", input=b""
            )
            await broker.create_runs([spec])
            await broker.enqueue(
                [
                    JobMessage(id="r:1", task="t", queue="plain", payload=b""),
                    JobMessage(id="r-x", task="t", queue="plain", payload=b""),
                    JobMessage(id="r:t9", task="other", queue="plain", payload=b""),
                ]
            )
            a, b, c = await broker.claim(["plain"], 3, worker_id="w", lease=30)
            await broker.complete([Completion(a.message.id, a.token, b"")])
            await broker.fail([Failure(id=j.message.id, token=j.token, error=b"x") for j in (b, c)])
            step = JobMessage(id="r:0", task="t", queue="steps", payload=b"", run_queue="q")
            [ok] = await broker.append_runs(
                [RunAppend(run_id="r", expected=0, wait_jobs=("r:0",), steps=(step,))]
            )
            assert ok.value == "appended"
            [claimed] = await broker.claim(["steps"], 1, worker_id="w", lease=30)
            await broker.complete([Completion(claimed.message.id, claimed.token, b"")])
            [record] = await broker.get_runs(["r"])
            assert record is not None
            assert set(record.outcomes) == {"r:0"}
            assert record.state.value == "running"
        # The pool's connections have exited: their statistics are reported.
        calls: dict[str, int] = {}
        with anyio.fail_after(TEST_DEADLINE):
            while calls.get("run_step", 0) < 1:
                rows = await admin.fetch(
                    "SELECT funcname, calls FROM pg_stat_user_functions "
                    "WHERE schemaname = 'typedq' AND funcname IN ('run_step', 'run_turn')"
                )
                calls = {row["funcname"]: row["calls"] for row in rows}
                await anyio.sleep(0.1)
        assert calls == {"run_step": 1, "run_turn": 1}
    finally:
        await admin.execute("ALTER DATABASE postgres RESET track_functions")
        await admin.close()
