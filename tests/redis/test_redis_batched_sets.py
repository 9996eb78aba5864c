"""A batch of completions (complete, or a claim that settles them) writes the active and
completed sets once per call, and a claim of several jobs its leases once: the sets must
hold exactly what one write per job would have written, and retention stays exact."""

from __future__ import annotations

from typing import Any

import pytest

from tests.redis_support import broker_at, message, raw_redis
from typedq import JobState, Retention
from typedq.broker.base import Completion, FinishOutcome

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


async def test_a_batch_of_completions_keeps_the_sets_and_retention_exact(redis_url: str) -> None:
    async with (
        broker_at(redis_url, "zb", retention=Retention(completed_max=5)) as broker,
        raw_redis(redis_url) as raw,
    ):
        k = broker.keys
        await broker.enqueue([message(f"j{i}") for i in range(20)])
        held = await broker.claim(["q"], 8, worker_id="w", lease=30)
        leases: list[Any] = await raw.zrange(k.active("q"), 0, -1, withscores=True)
        assert sorted(m.decode() for m, _ in leases) == sorted(j.message.id for j in held)
        assert len({s for _, s in leases}) == 1  # one lease deadline for the claim
        # A repeated completion in the batch answers ALREADY_FINISHED, once written.
        items = [Completion(j.message.id, j.token, b"\xc0") for j in held]
        out = await broker.complete([*items, items[0]])
        assert out == [FinishOutcome.OK] * 8 + [FinishOutcome.ALREADY_FINISHED]
        assert await raw.zcard(k.active("q")) == 0
        # Retention exact in the same call: 8 completed, 5 kept (the newest).
        assert await raw.zcard(k.done("q", "c")) == 5
        counts = await broker.counts("q")
        assert counts[JobState.COMPLETED] == 5
        assert counts[JobState.ACTIVE] == 0

        # A claim that settles a batch: the settled leave, the claimed enter.
        held = await broker.claim(["q"], 4, worker_id="w", lease=30)
        done, claimed = await broker.complete_and_claim(
            [Completion(j.message.id, j.token, b"\xc0") for j in held],
            ["q"],
            4,
            worker_id="w",
            lease=30,
        )
        assert done == [FinishOutcome.OK] * 4
        members: list[Any] = await raw.zrange(k.active("q"), 0, -1)
        active = {m.decode() for m in members}
        assert active == {j.message.id for j in claimed}
        assert await raw.zcard(k.done("q", "c")) == 5
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 4
        assert counts[JobState.COMPLETED] == 5
        assert counts[JobState.WAITING] == 20 - 8 - 4 - 4
        # The newest completions are the ones retention keeps.
        for record in await broker.get([j.message.id for j in held]):
            assert record is not None
            assert record.state == JobState.COMPLETED
