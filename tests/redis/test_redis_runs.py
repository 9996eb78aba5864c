"""Durable runs on one Redis: what only the Redis broker has to get right (the contract
suite, tests/contract/test_durable_runs.py, holds it to the embedded broker's answers).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.redis_support import broker_at
from typedq.broker.base import Completion, JobMessage, JobState
from typedq.broker.redis.codec import encode_body
from typedq.broker.runs import RunSpec, StepOutcome
from typedq.errors import InvalidName

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.mark.parametrize("length", [1, 31, 32, 127, 128])
async def test_a_step_finds_its_runs_queue_whatever_its_names_length(
    redis_url: str, length: int
) -> None:
    """The finishing script reads the run's queue from the end of the step's body: a
    fixstr up to 31 characters, a str8 beyond (its length byte 0x80 at 128)."""
    queue = ("q" * length)[:length]
    async with broker_at(redis_url, "rlen") as broker:
        spec = RunSpec(
            id="r", name="f", queue=queue, turn_task="typedq.run.f", turn_payload=b"", input=b""
        )
        await broker.create_runs([spec])
        payload = bytes(range(256)) * 3  # every byte value, long: the header is found anyway
        step = JobMessage(id="r:0", task="t", queue="s", payload=payload, run_queue=queue)
        await broker.enqueue([step])
        [claimed] = await broker.claim(["s"], 1, worker_id="w", lease=30)
        assert claimed.message == step
        await broker.complete([Completion("r:0", claimed.token, b"\xff" * 40)])
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert record.outcomes == {
            "r:0": StepOutcome(state=JobState.COMPLETED, result=b"\xff" * 40)
        }


async def test_a_plain_job_with_a_numeric_suffix_is_no_step(redis_url: str) -> None:
    """A key-derived id ``<task>:<digits>`` pays one read of its body when it ends, and
    is no run's business; a bad run queue is refused before anything is stored."""
    async with broker_at(redis_url, "rplain") as broker:
        spec = RunSpec(
            id="send", name="f", queue="q", turn_task="typedq.run.f", turn_payload=b"", input=b""
        )
        await broker.create_runs([spec])
        await broker.enqueue([JobMessage(id="send:42", task="send", queue="s", payload=b"")])
        [claimed] = await broker.claim(["s"], 1, worker_id="w", lease=30)
        await broker.complete([Completion("send:42", claimed.token, b"")])
        [record] = await broker.get_runs(["send"])
        assert record is not None
        assert record.outcomes == {}
        with pytest.raises(InvalidName, match="invalid queue name"):
            encode_body(JobMessage(id="r:0", task="t", queue="s", payload=b"", run_queue="a}"))
        redis: Any = broker._conn()
        assert await redis.hget(broker.keys.runs, "send") == b"q"
