"""A worker's shutdown against calls in flight when it begins (embedded broker, under
asyncio and trio): what such a call brings after the stop goes back at once."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.support import TEST_DEADLINE, HeldTask, In, Out
from typedq import App, JobState

pytestmark = pytest.mark.anyio


async def until_count(app: App, state: JobState, n: int) -> None:
    """Until ``n`` jobs of the default queue are in ``state`` (polled)."""
    while (await app.broker.counts("default")).get(state, 0) != n:  # noqa: ASYNC110
        await anyio.sleep(0.005)


async def test_a_claim_answered_after_the_stop_hands_its_jobs_back_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A claim for a prefetch slot, sent before ``stop()`` and answered after it: its job
    goes back to the queue at once, unrun, while the running job still has its grace (it
    once waited in the worker's table for the whole grace, not handed back)."""
    app = App("races", broker="memory://")
    held = HeldTask(app)
    broker = app.broker
    claim = broker.claim
    hold = anyio.Event()  # the claim's answer is held until this is set
    holding = False

    async def claim_answered_late(*args: Any, **kwargs: Any) -> Any:
        jobs = await claim(*args, **kwargs)
        if holding and jobs:
            await hold.wait()
        return jobs

    monkeypatch.setattr(broker, "claim", claim_answered_late)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            first = await held.work.enqueue(In(0))
            async with app.worker(concurrency=1, prefetch=1, grace=1.5 * TEST_DEADLINE) as worker:
                await held.long_started.wait()
                holding = True
                second = await held.work.enqueue(In(1))
                await until_count(app, JobState.ACTIVE, 2)  # claimed; the answer is held
                worker.stop()
                hold.set()  # the answer arrives after the stop
                await until_count(app, JobState.WAITING, 1)
                assert await first.status() is JobState.ACTIVE  # still in its grace
                assert held.started == [0]
                held.release.set()
            assert await first.result(timeout=10) == Out(0)
            assert await second.status() is JobState.WAITING
    assert held.started == [0]
