"""Broker contract, producer side and dispatch: enqueue, dedup, order, delays, claim, counts.

Runs once per broker (memory under asyncio and trio, Redis under asyncio) against the
:class:`~typedq.broker.base.Broker` interface only.
"""

from __future__ import annotations

import math
import time

import anyio
import msgspec
import pytest

from tests.support import claim_one, connected, count, msg, one, sleep_until
from typedq import InvalidOption, JobState, QueueFull
from typedq.broker.base import Completion, FinishOutcome
from typedq.broker.flow import FlowSpec
from typedq.names import new_job_id

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def test_enqueue_claim_complete_round_trip(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        message = msg(payload=b"\x81\xa1n\x07", task="send", priority=0)
        before = time.time()
        (outcome,) = await broker.enqueue([message])
        assert outcome.id == message.id
        assert outcome.created is True

        record = await one(broker, message.id)
        assert record.state is JobState.WAITING
        assert record.message == message
        assert record.attempt == 0
        assert before - 5 <= record.enqueued_at <= time.time() + 5

        claimed = await claim_one(broker, lease=10, worker_id="w-1")
        assert claimed.message == message
        assert claimed.attempt == 1
        assert claimed.stalls == 0
        assert claimed.token
        assert claimed.enqueued_at == pytest.approx(record.enqueued_at)
        active = await one(broker, message.id)
        assert active.state is JobState.ACTIVE
        assert active.attempt == 1
        assert active.worker_id == "w-1"

        outcomes = await broker.complete([Completion(message.id, claimed.token, b"\x07")])
        assert outcomes == [FinishOutcome.OK]
        done = await one(broker, message.id)
        assert done.state is JobState.COMPLETED
        assert done.result == b"\x07"
        assert done.finished_at >= done.enqueued_at
        # Nothing left to claim.
        assert await broker.claim(["q"], 10, worker_id="w-1", lease=10) == []


async def test_enqueue_batch_keeps_order_and_reports_each(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        messages = [msg(payload=bytes([i])) for i in range(50)]
        outcomes = await broker.enqueue(messages)
        assert [o.id for o in outcomes] == [m.id for m in messages]
        assert all(o.created for o in outcomes)
        claimed = await broker.claim(["q"], 100, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == [m.id for m in messages]  # FIFO
        assert len({c.token for c in claimed}) == 50  # a fresh token per claim


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority", 2**70),
        ("priority", -(2**31) - 1),
        ("max_retries", 2**70),
        ("eta", math.nan),
        ("eta", 1e300),
        ("delay", -5.0),
        ("delay", math.inf),
        ("timeout", -3.0),
    ],
)
async def test_an_envelope_with_numbers_out_of_range_is_refused_on_every_broker(
    app_name: str, broker_url: str, field: str, value: float
) -> None:
    """Handed to a broker directly (past the producer's checks), an envelope whose number
    is out of range gets the producer's one-line InvalidOption, naming the field and the
    range, from enqueue, enqueue_batches and enqueue_flows alike, and nothing is stored.
    (It was stored by the embedded broker and a raw OverflowError from the Redis
    encoder for ints past 64 bits.)"""
    async with connected(app_name, broker_url) as broker:
        good = msg()
        bad = msgspec.structs.replace(msg(), **{field: value})
        flow_bad = msgspec.structs.replace(msg(job_id="flow-x"), **{field: value})
        for call in (
            lambda: broker.enqueue([good, bad]),
            lambda: broker.enqueue_batches([[good], [bad]]),
            lambda: broker.enqueue_flows([FlowSpec(id="flow-x", steps=(flow_bad,))]),
        ):
            with pytest.raises(InvalidOption, match=rf"{field}=.* is out of range: use "):
                await call()
        counts = await broker.counts("q")
        assert count(counts, JobState.WAITING) + count(counts, JobState.SCHEDULED) == 0


async def test_enqueue_empty_batch(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        assert await broker.enqueue([]) == []
        assert await broker.get([]) == []


async def test_dedup_by_job_id(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        first = msg(job_id="order-42", payload=b"\x01")
        (created,) = await broker.enqueue([first])
        assert created.created is True

        # Same id, different content: not replaced.
        (again,) = await broker.enqueue([msg(job_id="order-42", payload=b"\x02", priority=9)])
        assert again.id == "order-42"
        assert again.created is False
        record = await one(broker, "order-42")
        assert record.message == first

        # Dedup holds after the job finished, too.
        claimed = await claim_one(broker)
        await broker.complete([Completion("order-42", claimed.token, b"")])
        (late,) = await broker.enqueue([msg(job_id="order-42")])
        assert late.created is False
        assert (await one(broker, "order-42")).state is JobState.COMPLETED
        assert count(await broker.counts("q"), JobState.WAITING) == 0


async def test_resent_batch_creates_nothing(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        batch = [msg() for _ in range(20)]
        assert all(o.created for o in await broker.enqueue(batch))
        resent = await broker.enqueue(batch)
        assert [o.id for o in resent] == [m.id for m in batch]
        assert not any(o.created for o in resent)
        counts = await broker.counts("q")
        assert count(counts, JobState.WAITING) == 20


async def test_duplicate_ids_within_one_batch(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        outcomes = await broker.enqueue([msg(job_id="dup"), msg(job_id="dup"), msg(job_id="x")])
        assert [(o.id, o.created) for o in outcomes] == [
            ("dup", True),
            ("dup", False),
            ("x", True),
        ]
        assert count(await broker.counts("q"), JobState.WAITING) == 2


async def test_priority_then_fifo(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        plan = [("a", 0), ("b", 5), ("c", 0), ("d", 10), ("e", 5), ("f", -3), ("g", 10)]
        for job_id, priority in plan:  # separate calls: order is by arrival
            await broker.enqueue([msg(job_id=job_id, priority=priority)])
        claimed = await broker.claim(["q"], 100, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == ["d", "g", "b", "e", "a", "c", "f"]


async def test_claim_one_at_a_time_follows_priority(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="low"), msg(job_id="high", priority=1)])
        assert (await claim_one(broker)).message.id == "high"
        # A higher-priority job arriving later still overtakes the waiting one.
        await broker.enqueue([msg(job_id="urgent", priority=7)])
        assert (await claim_one(broker)).message.id == "urgent"
        assert (await claim_one(broker)).message.id == "low"


async def test_claim_limit_is_honoured(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg() for _ in range(10)])
        assert len(await broker.claim(["q"], 3, worker_id="w", lease=10)) == 3
        assert len(await broker.claim(["q"], 1, worker_id="w", lease=10)) == 1
        assert await broker.claim(["q"], 0, worker_id="w", lease=10) == []
        counts = await broker.counts("q")
        assert count(counts, JobState.ACTIVE) == 4
        assert count(counts, JobState.WAITING) == 6
        assert len(await broker.claim(["q"], 100, worker_id="w", lease=10)) == 6
        assert await broker.claim(["q"], 100, worker_id="w", lease=10) == []


async def test_multi_queue_claim(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(queue="a", job_id="a1"), msg(queue="b", job_id="b1")])
        await broker.enqueue([msg(queue="c", job_id="c1")])
        await broker.enqueue([msg(queue="a", job_id="a2", priority=3)])
        claimed = await broker.claim(["a", "b"], 10, worker_id="w", lease=10)
        # Priority across queues first, then arrival order; queue "c" is not asked for.
        assert [c.message.id for c in claimed] == ["a2", "a1", "b1"]
        assert {c.message.queue for c in claimed} == {"a", "b"}
        assert count(await broker.counts("c"), JobState.WAITING) == 1
        assert await broker.claim(["b"], 10, worker_id="w", lease=10) == []
        assert (await claim_one(broker, "c")).message.id == "c1"


async def test_queues_are_independent(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(queue="a"), msg(queue="a-b"), msg(queue="a.b")])
        for queue in ("a", "a-b", "a.b"):
            assert count(await broker.counts(queue), JobState.WAITING) == 1
        assert len(await broker.claim(["a"], 10, worker_id="w", lease=10)) == 1
        assert count(await broker.counts("a-b"), JobState.WAITING) == 1


async def test_delay_schedules_until_due(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        message = msg(delay=0.2)
        before = time.time()
        await broker.enqueue([message, msg(job_id="now")])
        record = await one(broker, message.id)
        assert record.state is JobState.SCHEDULED
        assert before + 0.1 <= record.run_at <= time.time() + 0.3
        counts = await broker.counts("q")
        assert count(counts, JobState.SCHEDULED) == 1
        assert count(counts, JobState.WAITING) == 1

        # Only the immediate job is claimable before the delay passes.
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == ["now"]

        await sleep_until(record.run_at)
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == [message.id]
        assert claimed[0].attempt == 1


async def test_eta_schedules_until_due(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        # A second ahead: the claim below must run before it, also on a loaded box
        # (0.25 s was passed there once between the enqueue and the claim).
        eta = time.time() + 1.0
        # eta wins over delay when both are set.
        message = msg(eta=eta, delay=60.0)
        await broker.enqueue([message])
        record = await one(broker, message.id)
        assert record.state is JobState.SCHEDULED
        assert record.run_at == pytest.approx(eta, abs=0.01)
        assert await broker.claim(["q"], 10, worker_id="w", lease=10) == []
        await sleep_until(eta)
        assert (await claim_one(broker)).message.id == message.id


async def test_eta_in_the_past_is_waiting(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        message = msg(eta=time.time() - 10)
        await broker.enqueue([message])
        assert (await one(broker, message.id)).state is JobState.WAITING
        assert (await claim_one(broker)).message.id == message.id


async def test_due_scheduled_job_keeps_priority(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        delayed = msg(job_id="delayed-high", delay=0.15, priority=5)
        await broker.enqueue([delayed, msg(job_id="plain")])
        record = await one(broker, delayed.id)
        await sleep_until(record.run_at)
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=10)
        assert [c.message.id for c in claimed] == ["delayed-high", "plain"]


async def test_wait_for_jobs_wakes_on_enqueue(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        claimed = anyio.Event()
        wakeups = 0

        async def worker_loop() -> None:
            # A hint, not a promise: a wake-up may find nothing, so claim and go round.
            nonlocal wakeups
            while True:
                await broker.wait_for_jobs(["q"], 10.0)
                wakeups += 1
                if await broker.claim(["q"], 1, worker_id="w", lease=10):
                    claimed.set()
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(worker_loop)
            await anyio.sleep(0.3)  # an empty queue: the loop must sleep, not spin
            assert wakeups <= 2
            assert not claimed.is_set()
            await broker.enqueue([msg()])
            with anyio.fail_after(2):
                await claimed.wait()


async def test_wait_for_jobs_returns_for_waiting_work_and_on_timeout(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        with anyio.fail_after(2):
            await broker.wait_for_jobs(["q"], 0.1)  # nothing there: the timeout ends it
        await broker.enqueue([msg()])
        with anyio.fail_after(1):
            await broker.wait_for_jobs(["q"], 10.0)  # work is there: returns at once


async def test_wait_for_jobs_wakes_when_a_delay_is_due(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        message = msg(delay=0.2)
        await broker.enqueue([message])
        with anyio.fail_after(2):
            while True:
                await broker.wait_for_jobs(["q"], 10.0)
                if jobs := await broker.claim(["q"], 1, worker_id="w", lease=10):
                    break
        assert jobs[0].message.id == message.id


async def test_max_queue_length_refuses_whole_batch(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=5) as broker:
        await broker.enqueue([msg() for _ in range(3)])
        with pytest.raises(QueueFull):
            await broker.enqueue([msg() for _ in range(3)])
        # Nothing of the refused batch went in.
        assert count(await broker.counts("q"), JobState.WAITING) == 3
        # Scheduled jobs count as pending too.
        await broker.enqueue([msg(delay=60)])
        await broker.enqueue([msg()])
        with pytest.raises(QueueFull):
            await broker.enqueue([msg()])
        # Other queues have their own bound.
        await broker.enqueue([msg(queue="other") for _ in range(5)])
        # Claiming frees room.
        await broker.claim(["q"], 2, worker_id="w", lease=10)
        await broker.enqueue([msg(), msg()])
        counts = await broker.counts("q")
        assert count(counts, JobState.WAITING) + count(counts, JobState.SCHEDULED) == 5


async def test_max_queue_length_accepts_resent_ids(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=2) as broker:
        batch = [msg(), msg()]
        await broker.enqueue(batch)
        outcomes = await broker.enqueue(batch)  # a retried send of a full queue
        assert not any(o.created for o in outcomes)


async def test_counts_follow_every_state(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        assert all(v == 0 for v in (await broker.counts("q")).values())
        ids = [new_job_id() for _ in range(6)]
        await broker.enqueue([msg(job_id=i) for i in ids[:4]])
        await broker.enqueue([msg(job_id=ids[4], delay=60), msg(job_id=ids[5], delay=60)])
        c1, c2 = await broker.claim(["q"], 2, worker_id="w", lease=10)
        await broker.complete([Completion(c1.message.id, c1.token, b"")])
        await broker.cancel(ids[4])
        counts = await broker.counts("q")
        assert {s: count(counts, s) for s in JobState} == {
            JobState.WAITING: 2,
            JobState.SCHEDULED: 1,
            JobState.ACTIVE: 1,
            JobState.COMPLETED: 1,
            JobState.FAILED: 0,
            JobState.CANCELLED: 1,
        }
        assert c2.message.id in ids
        assert all(v == 0 for v in (await broker.counts("elsewhere")).values())


async def test_purge(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        waiting = [msg() for _ in range(4)]
        scheduled = [msg(delay=60) for _ in range(2)]
        other = msg(queue="keep")
        await broker.enqueue([*waiting, *scheduled, other])
        claimed = await claim_one(broker)
        await broker.complete([Completion(claimed.message.id, claimed.token, b"")])

        assert await broker.purge("q", [JobState.WAITING, JobState.SCHEDULED]) == 5
        records = await broker.get([m.id for m in waiting[1:] + scheduled])
        assert records == [None] * 5
        counts = await broker.counts("q")
        assert count(counts, JobState.WAITING) == 0
        assert count(counts, JobState.SCHEDULED) == 0
        assert count(counts, JobState.COMPLETED) == 1
        assert await broker.claim(["q"], 10, worker_id="w", lease=10) == []
        # Other queues and states are untouched.
        assert (await one(broker, other.id)).state is JobState.WAITING
        assert await broker.purge("q", [JobState.COMPLETED]) == 1
        assert await broker.get([claimed.message.id]) == [None]
        assert await broker.purge("q", [JobState.COMPLETED]) == 0
        # A purged id may be enqueued afresh.
        (again,) = await broker.enqueue([msg(job_id=waiting[1].id)])
        assert again.created is True


async def test_get_unknown_ids(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        known = msg()
        await broker.enqueue([known])
        records = await broker.get(["nope", known.id, "also-nope"])
        assert records[0] is None
        assert records[2] is None
        assert records[1] is not None
        assert records[1].message.id == known.id


async def test_a_refused_flow_of_a_batch_stores_nothing_of_it_and_the_others_are_stored(
    app_name: str, broker_url: str
) -> None:
    """``enqueue_flows`` answers per flow: a flow one of whose derived ids is taken
    (ConfigError) or that would pass ``max_queue_length`` (QueueFull) stores nothing, and
    the flows around it in the same call are stored (or found: ``created`` False)."""

    def chain(flow_id: str, queue: str = "q", steps: int = 2) -> FlowSpec:
        first = msg(job_id=f"{flow_id}.0", queue=queue)
        held = [
            msg(job_id=f"{flow_id}.{k}" if k < steps - 1 else flow_id, queue=queue, payload=b"")
            for k in range(1, steps)
        ]
        return FlowSpec(id=flow_id, steps=(first, *held))

    async with connected(app_name, broker_url, max_queue_length=4) as broker:
        await broker.enqueue([msg(job_id="taken.0", queue="r")])
        out = await broker.enqueue_flows(
            [chain("a"), chain("taken", "r"), chain("b", "full"), chain("a"), chain("c", "r")]
        )
        assert [type(o).__name__ for o in out] == [
            "EnqueueOutcome",
            "ConfigError",
            "EnqueueOutcome",
            "EnqueueOutcome",
            "EnqueueOutcome",
        ]
        assert [getattr(o, "created", None) for o in out] == [True, None, True, False, True]
        assert "taken.0" in str(out[1])
        full = await broker.enqueue_flows([chain("d", "full", steps=3), chain("e", "q")])
        assert isinstance(full[0], QueueFull)
        assert getattr(full[1], "created", None) is True
        assert count(await broker.counts("full"), JobState.WAITING) == 1
        assert sum((await broker.counts("r")).values()) == 3  # taken.0, c.0 and c
        assert sum((await broker.counts("q")).values()) == 4  # a.0, a, e.0, e
