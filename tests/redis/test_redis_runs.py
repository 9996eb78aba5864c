"""Durable runs on one Redis: what only the Redis broker has to get right (the contract
suite, tests/contract/test_durable_runs.py, holds it to the embedded broker's answers).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.redis_support import broker_at
from typedq.broker.base import BrokerSettings, Completion, JobMessage, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import encode_body
from typedq.broker.runs import AppendOutcome, RunAppend, RunSpec, StepOutcome
from typedq.client import Client
from typedq.errors import InvalidName, QueueFull

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


def _spec(run_id: str, queue: str) -> RunSpec:
    return RunSpec(
        id=run_id, name="f", queue=queue, turn_task="typedq.run.f", turn_payload=b"", input=b""
    )


async def test_a_run_started_again_on_another_queue_stays_where_it_is(redis_url: str) -> None:
    """create_runs indexes and creates in one script (run_start.lua); an id indexed on
    another queue already is not created on the new one: the existing run answers."""
    async with broker_at(redis_url, "rstart") as broker:
        [(created, first)] = await broker.create_runs([_spec("r", "a")])
        assert created
        assert first.spec.queue == "a"
        answers = await broker.create_runs([_spec("r", "b"), _spec("s", "b")])
        assert [(c, r.spec.id, r.spec.queue) for c, r in answers] == [
            (False, "r", "a"),
            (True, "s", "b"),
        ]
        redis: Any = broker._conn()
        assert await redis.hmget(broker.keys.runs, ["r", "s"]) == [b"a", b"b"]
        [again] = await broker.get_runs(["r"])
        assert again is not None
        assert again.spec.queue == "a"


async def test_steps_go_with_their_append_or_not_at_all(redis_url: str) -> None:
    """An append's steps of the run's slot are stored by the append's own script
    (run_schedule.lua): only when it applies; max_queue_length refuses the whole call
    (QueueFull, nothing stored); a step stored already is not stored again."""
    async with broker_at(redis_url, "rsched", max_queue_length=3) as broker:
        await broker.create_runs([_spec("r", "q")])  # its first turn: 1 job waiting in q

        def step(k: int, queue: str = "q") -> JobMessage:
            return JobMessage(id=f"r:{k}", task="t", queue=queue, payload=b"", run_queue="q")

        [stale] = await broker.append_runs(
            [RunAppend(run_id="r", expected=5, wait_jobs=("r:0",), steps=(step(0),))]
        )
        assert stale is AppendOutcome.CONFLICT
        assert await broker.get(["r:0"]) == [None]  # not applied: not stored
        with pytest.raises(QueueFull, match="max_queue_length=3"):
            await broker.append_runs(
                [
                    RunAppend(
                        run_id="r",
                        expected=0,
                        entries=(b"x",),
                        wait_jobs=("r:0", "r:1", "r:2"),
                        steps=(step(0), step(1), step(2)),
                    )
                ]
            )
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert record.log == ()
        assert await broker.get(["r:0", "r:1", "r:2"]) == [None, None, None]
        [done] = await broker.append_runs(
            [
                RunAppend(
                    run_id="r",
                    expected=0,
                    entries=(b"x",),
                    wait_jobs=("r:0", "r:1"),
                    steps=(step(0), step(1, "other"), step(0)),
                )
            ]
        )
        assert done is AppendOutcome.APPENDED
        jobs = await broker.get(["r:0", "r:1"])
        assert [(j.message.queue, j.state) for j in jobs if j is not None] == [
            ("q", JobState.WAITING),
            ("other", JobState.WAITING),
        ]
        assert (await broker.counts("q"))[JobState.WAITING] == 2  # the turn and r:0, once
        [record] = await broker.get_runs(["r"])
        assert record is not None
        assert record.wait_jobs == ("r:0", "r:1")


async def test_coalesced_appends_a_full_queue_refuses_only_its_own(
    redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Turns of one process append through one batcher (Client.append_run): appends sent
    together whose steps fill a queue past max_queue_length fail alone with QueueFull
    (nothing of theirs stored); the others of the batch are appended with their steps."""
    broker = RedisBroker(redis_url, BrokerSettings(namespace="rbatch", max_queue_length=4))
    client = Client(broker, name="rbatch", settings=broker.settings)
    async with client:
        assert broker.coalesce_run_calls
        runs = [f"r{i}" for i in range(8)]
        await broker.create_runs([_spec(r, "q") for r in runs])
        outcomes: dict[str, AppendOutcome | Exception] = {}

        async def append(i: int, run_id: str) -> None:
            # Even runs' steps go to queue "ok" (one each: four fit), odd runs' five
            # steps to "full" (more than max_queue_length on their own).
            ks = range(1) if i % 2 == 0 else range(5)
            steps = tuple(
                JobMessage(
                    id=f"{run_id}:{k}",
                    task="t",
                    queue="ok" if i % 2 == 0 else "full",
                    payload=b"",
                    run_queue="q",
                )
                for k in ks
            )
            item = RunAppend(
                run_id=run_id,
                expected=0,
                entries=(b"x",),
                wait_jobs=tuple(s.id for s in steps),
                steps=steps,
            )
            try:
                outcomes[run_id] = await client.append_run(item)
            except QueueFull as exc:
                outcomes[run_id] = exc

        async with anyio.create_task_group() as tg:
            for i, run_id in enumerate(runs):
                tg.start_soon(append, i, run_id)
        for i, run_id in enumerate(runs):
            [record] = await broker.get_runs([run_id])
            assert record is not None
            if i % 2:
                assert isinstance(outcomes[run_id], QueueFull)
                assert record.log == ()
                assert await broker.get([f"{run_id}:0"]) == [None]
            else:
                assert outcomes[run_id] is AppendOutcome.APPENDED
                assert record.log == (b"x",)
        assert (await broker.counts("ok"))[JobState.WAITING] == 4
    # They were sent together: the batch's refusal had them sent again one by one.
    assert "run append batcher: a batch of" in caplog.text
