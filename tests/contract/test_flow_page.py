"""Broker contract: a flow's page is a few bounded reads (issue 24, defect 8).

The dashboard's flow page and ``typedq inspect --flow`` read every fan-out member on
every load (20,000 members: 0.7 s per load; 100,000: 5-6 s, refreshed every 5 s). Now a
page reads the flow's shape with the broker's counts of settled members, its steps and
one page of members, whatever the flow's size; the counts follow the members as they
settle, on every broker.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.support import TEST_DEADLINE, In, Out
from typedq import App, Failed, JobState, Ok
from typedq.inspector import MEMBER_PAGE, Inspector

pytestmark = pytest.mark.anyio

MEMBERS = 300
LAST = MEMBERS - 1


class Boom(Exception):
    pass


async def test_a_flow_page_reads_one_page_and_counts_settled_members(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    release = anyio.Event()

    @app.task(retries=0)
    async def check(x: In) -> Out:
        if x.n == LAST:
            await release.wait()  # keeps the flow running while it is looked at
        if x.n % 10 == 0:
            raise Boom(str(x.n))
        return Out(x.n)

    @app.task
    async def report(outcomes: list[Ok[Out] | Failed]) -> In:
        return In(len(outcomes))

    tool = Inspector(app.client, ["default"])
    read: list[int] = []
    broker = app.client.broker
    real_get = broker.get

    async def counting_get(ids: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(len(ids))
        return await real_get(ids, *args, **kwargs)

    async with app:
        broker.get = counting_get  # type: ignore[method-assign]
        job = await check.map(In(i) for i in range(MEMBERS)).collect(report).enqueue()
        fresh = await tool.flow(job.id, start=100)
        assert fresh is not None
        assert (fresh.members, fresh.members_pending, fresh.member_states) == (MEMBERS, MEMBERS, {})
        assert fresh.members_start == 100
        assert [m.id for m in fresh.member_page if m is not None] == [
            f"{job.id}.m{i}" for i in range(100, 100 + MEMBER_PAGE)
        ]
        assert {m.state for m in fresh.member_page if m is not None} == {JobState.WAITING}
        # One read of records: the flow's step and one page of members.
        assert read == [1 + MEMBER_PAGE]

        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=8):
                while True:
                    shape = await broker.flow_state(job.id)
                    assert shape is not None
                    if shape.pending == 1:
                        break
                    await anyio.sleep(0.02)
                read.clear()
                running = await tool.flow(job.id, start=MEMBERS - 30)
                assert read == [1 + 30]
                assert running is not None
                failed = sum(1 for n in range(LAST) if n % 10 == 0)
                assert running.members_pending == 1
                assert running.member_states == {
                    JobState.COMPLETED: LAST - failed,
                    JobState.FAILED: failed,
                }
                page = {m.id: m.state for m in running.member_page if m is not None}
                assert page[f"{job.id}.m{LAST}"] is JobState.ACTIVE
                assert page[f"{job.id}.m{MEMBERS - 30}"] is JobState.FAILED
                assert [m.id for m in running.failed_members] == [
                    f"{job.id}.m{n}" for n in range(MEMBERS - 30, LAST) if n % 10 == 0
                ]
                release.set()
                assert await job.result(timeout=10) == In(MEMBERS)
        ended = await tool.flow(job.id)
        assert ended is not None
        assert (ended.running, ended.members_pending, ended.member_states) == (False, -1, {})
        assert len(ended.member_page) == MEMBER_PAGE
