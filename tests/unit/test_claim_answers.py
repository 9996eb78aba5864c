"""The next due time a Redis worker's wait is bounded by comes from its own claims'
answers only: a refill (a claim sent with completions, on another connection) may be
read after the worker's claim although it ran before it, and its "nothing scheduled"
once dropped a due time the worker's claim had seen, so the worker slept past a due job
to its 5 s bound (seen as durable sleeps resuming ~5 s late)."""

from __future__ import annotations

import pytest

from typedq.broker.base import BrokerSettings
from typedq.broker.redis import RedisBroker

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_refill_answer_leaves_the_workers_next_due_time_alone() -> None:
    broker = RedisBroker("redis://127.0.0.1:1/0", BrokerSettings(namespace="answers"))
    key = ("q",)
    assert await broker._claimed(["q"], [250_000], "w") == []  # the worker's claim: 0.25 s
    due = broker._notes._next_due[key]
    assert await broker._claimed(["q"], [-1], "w", refill=True) == []
    assert broker._notes._next_due[key] == due
    assert await broker._claimed(["q"], [-1], "w") == []  # its own next claim: none
    assert key not in broker._notes._next_due
