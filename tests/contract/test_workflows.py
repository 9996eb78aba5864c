"""Workflows on every broker: chains, fan-out, fan-in, failure policy, cancel, bounds.

The hand-off between steps happens inside the broker's completion path (see
typedq/broker/flow.py), so each of these depends on the broker as much as on the API.
"""

from __future__ import annotations

import io
import random
from collections import Counter
from typing import Any

import anyio
import msgspec
import pytest
from rich.console import Console

from tests.support import TEST_DEADLINE, In, Out, PIn, POut
from typedq import (
    App,
    ConcurrencyLimit,
    ConfigError,
    Failed,
    FailureReason,
    FailureRecord,
    JobCancelled,
    JobFailed,
    JobState,
    Ok,
    QueueFull,
    RateLimit,
)
from typedq.broker.base import Completion, RetryOutcome
from typedq.cli.render import render_flow, render_job
from typedq.inspector import Inspector
from typedq.job import decode_failure

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class Boom(Exception):
    pass


async def test_chain_of_ten_steps(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    seen: list[int] = []

    @app.task
    async def step(x: In) -> In:
        seen.append(x.n)
        return In(x.n + 1)

    @app.task
    def finish(x: In) -> Out:
        return Out(x.n * 10)

    flow = step.then(step)
    for _ in range(7):
        flow = flow.then(step)
    chain = flow.then(finish)
    assert len(chain.steps) == 10
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            job = await chain.enqueue(In(0))
            assert await job.result(timeout=10) == Out(90)
    assert seen == list(range(9))  # nine steps, each on the previous one's result


async def test_three_hundred_chains_at_once(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def double(x: In) -> In:
        return In(x.n * 2)

    @app.task
    async def plus_one(x: In) -> Out:
        return Out(x.n + 1)

    chain = double.then(double).then(plus_one)
    results: dict[int, Out] = {}
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=16):
            jobs = {}

            async def start(i: int) -> None:
                jobs[i] = await chain.enqueue(In(i))

            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(start, i)
            for i, job in jobs.items():
                results[i] = await job.result(timeout=15)
    assert results == {i: Out(4 * i + 1) for i in range(300)}


async def test_failing_middle_step_fails_the_flow(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    ran: list[str] = []

    @app.task
    async def first(x: In) -> In:
        ran.append("first")
        return x

    @app.task(retries=1)
    async def broken(x: In) -> In:
        ran.append("broken")
        raise Boom(f"no {x.n}")

    @app.task
    async def last(x: In) -> Out:
        ran.append("last")
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await first.then(broken).then(last).enqueue(In(7))
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=10)
            middle = broken.job(f"{job.id}.1")
            with pytest.raises(JobFailed) as step_error:
                await middle.result(timeout=1)
            assert await job.status() is JobState.FAILED
    record = caught.value.record
    assert record.reason is FailureReason.ERROR
    assert record.message == "no 7"
    assert record.attempt == 2  # the step's retries ran first
    assert record == step_error.value.record
    assert ran == ["first", "broken", "broken"]


async def test_fan_out_results_in_input_order(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        await anyio.sleep(random.random() / 100)  # finish out of order
        return Out(x.n * x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=8):
            job = await square.map(In(i) for i in range(60)).enqueue()
            assert await job.result(timeout=10) == [Out(i * i) for i in range(60)]


async def test_twenty_fan_ins_call_each_callback_once(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls: Counter[int] = Counter()

    @app.task
    async def square(x: In) -> Out:
        await anyio.sleep(random.random() / 200)
        return Out(x.n * x.n)

    @app.task
    async def total(outs: list[Out]) -> Out:
        calls[outs[0].n] += 1
        return Out(sum(o.n for o in outs))

    with anyio.fail_after(TEST_DEADLINE * 2):
        async with app, app.worker(concurrency=16):
            jobs = [
                await square.map(In(1000 * f + i) for i in range(50)).then(total).enqueue()
                for f in range(20)
            ]
            results = [await job.result(timeout=20) for job in jobs]
    assert results == [Out(sum((1000 * f + i) ** 2 for i in range(50))) for f in range(20)]
    assert calls == Counter({(1000 * f) ** 2: 1 for f in range(20)})


async def test_fan_in_then_more_steps_with_pydantic_models(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def label(x: PIn) -> POut:
        return POut(label=f"{x.name}x{x.qty}")

    @app.task
    async def join(labels: list[POut]) -> PIn:
        return PIn(name=",".join(p.label for p in labels), qty=len(labels))

    @app.task
    async def shout(x: PIn) -> POut:
        return POut(label=x.name.upper())

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            items = [PIn(name=n, qty=i) for i, n in enumerate("abc")]
            job = await label.map(items).then(join).then(shout).enqueue()
            assert await job.result(timeout=10) == POut(label="AX0,BX1,CX2")


async def test_member_failure_fails_the_fan_in(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    settled: list[int] = []
    callback_ran = False

    @app.task
    async def check(x: In) -> Out:
        settled.append(x.n)
        if x.n in (3, 5):
            raise Boom(f"bad {x.n}")
        return Out(x.n)

    @app.task
    async def total(outs: list[Out]) -> Out:
        nonlocal callback_ran
        callback_ran = True
        return Out(len(outs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            job = await check.map(In(i) for i in range(10)).then(total).enqueue()
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=10)
            assert sorted(settled) == list(range(10))  # every member settled first
    assert caught.value.record.message == "bad 3"  # the first failed member, by index
    assert not callback_ran


async def test_collecting_fan_in_gets_every_outcome(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def check(x: In) -> Out:
        if x.n % 3 == 0:
            raise Boom(f"bad {x.n}")
        return Out(x.n)

    @app.task
    async def report(outcomes: list[Ok[Out] | Failed]) -> In:
        good = sum(o.value.n for o in outcomes if isinstance(o, Ok))
        bad = [o.error.message for o in outcomes if isinstance(o, Failed)]
        return In(good * 1000 + len(bad))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            job = await check.map(In(i) for i in range(7)).collect(report).enqueue()
            assert await job.result(timeout=10) == In((1 + 2 + 4 + 5) * 1000 + 3)


async def test_cancel_a_running_flow(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    started = anyio.Event()
    cancelled = anyio.Event()
    later: list[int] = []

    @app.task
    async def hang(x: In) -> In:
        started.set()
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return x  # pragma: no cover

    @app.task
    async def after(x: In) -> Out:
        later.append(x.n)
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await hang.then(after).enqueue(In(1))
            await started.wait()
            assert await job.cancel()
            await cancelled.wait()
            with pytest.raises(JobCancelled):
                await job.result(timeout=5)
            first = hang.job(f"{job.id}.0")
            with pytest.raises(JobCancelled):
                await first.result(timeout=5)
    assert later == []


async def test_cancel_a_fan_out_cancels_waiting_members(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:  # no worker: every member is waiting
            job = await square.map(In(i) for i in range(5)).enqueue()
            assert (await app.broker.counts("default"))[JobState.WAITING] == 5
            assert await job.cancel()
            with pytest.raises(JobCancelled):
                await job.result(timeout=5)
            counts = await app.broker.counts("default")
    assert counts[JobState.WAITING] == 0
    assert counts[JobState.CANCELLED] == 6  # 5 members and the flow's own job


async def test_empty_fan_out_completes_with_an_empty_list(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    got: list[list[Out]] = []

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    @app.task
    async def total(outs: list[Out]) -> Out:
        got.append(outs)
        return Out(len(outs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            bare = await square.map([]).enqueue()
            assert await bare.result(timeout=5) == []
            async with app.worker(concurrency=1):
                job = await square.map([]).then(total).enqueue()
                assert await job.result(timeout=5) == Out(0)
    assert got == [[]]


async def test_oversize_fan_out_is_refused_whole(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url, max_queue_length=20)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:
        with pytest.raises(QueueFull):
            await square.map(In(i) for i in range(25)).enqueue()
        counts = await app.broker.counts("default")
        assert sum(counts.values()) == 0
        job = await square.map(In(i) for i in range(10)).enqueue()  # fits: stored
        assert await job.status() is JobState.SCHEDULED


async def test_flow_id_is_idempotent(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def one(x: In) -> In:
        return x

    @app.task
    async def two(x: In) -> Out:
        return Out(x.n)

    async with app:
        first = await one.then(two).enqueue(In(1), job_id="flow-1")
        again = await one.then(two).enqueue(In(1), job_id="flow-1")
        assert (first.created, again.created) == (True, False)
        assert first.id == again.id == "flow-1"
        counts = await app.broker.counts("default")
    assert counts[JobState.WAITING] + counts[JobState.SCHEDULED] == 2


async def test_removed_member_fails_the_flow(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)

    async with app:
        job = await square.map(In(i) for i in range(3)).enqueue()
        assert await app.broker.remove([f"{job.id}.m1"]) == [True]
        async with app.worker(concurrency=2):
            with pytest.raises(JobFailed) as caught:
                await job.result(timeout=10)
    assert caught.value.record.reason is FailureReason.FLOW_BROKEN


def test_types_that_do_not_meet_are_refused_when_built() -> None:
    app = App("untyped")

    @app.task
    async def a(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    @app.task
    async def b(x: PIn) -> POut:
        return POut(label="")  # pragma: no cover

    @app.task
    async def c(xs: list[POut]) -> Out:
        return Out(0)  # pragma: no cover

    loose: Any = a
    with pytest.raises(ConfigError, match="a chain step's input must be"):
        loose.then(b)
    with pytest.raises(ConfigError, match=r"list\[tests.support.Out\]"):
        loose.map([In(1)]).then(c)
    with pytest.raises(ConfigError, match="Ok"):
        loose.map([In(1)]).collect(c)


async def test_inspect_shows_a_flow_and_where_it_stands(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def check(x: In) -> Out:
        if x.n == 2:
            raise Boom("two")
        return Out(x.n)

    @app.task
    async def report(outcomes: list[Ok[Out] | Failed]) -> In:
        return In(len(outcomes))

    @app.task
    async def last(x: In) -> Out:
        return Out(x.n)

    tool = Inspector(app.client, ["default"])
    async with app:
        job = await check.map(In(i) for i in range(4)).collect(report).then(last).enqueue()
        running = await tool.flow(job.id)
        assert running is not None
        assert (running.running, running.members, running.members_pending) == (True, 4, 4)
        assert running.member_states == {JobState.WAITING: 4}
        assert [s.state for s in running.steps if s is not None] == [JobState.SCHEDULED] * 2
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=2):
                assert await job.result(timeout=10) == Out(4)
        ended = await tool.flow(job.id)
        by_member = await tool.flow(f"{job.id}.m0")  # any job of the flow finds it
        assert by_member is not None
        assert by_member.id == job.id
        assert await tool.flow("no-such-job") is None
        out = io.StringIO()
        assert ended is not None
        render_flow(Console(file=out, width=200), ended)
    assert (ended.running, ended.state, ended.members_pending) == (False, JobState.COMPLETED, -1)
    assert ended.member_states == {JobState.COMPLETED: 3, JobState.FAILED: 1}
    assert [m.id for m in ended.failed_members] == [f"{job.id}.m2"]
    assert [s.task for s in ended.steps if s is not None] == ["report", "last"]
    text = out.getvalue()
    assert f"flow {job.id}: completed (ended)" in text
    assert "fan-out: 4 members (3 completed, 1 failed)" in text
    assert f"member {job.id}.m2: failed: error: two" in text


async def test_a_list_input_task_enqueued_directly(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def total(outs: list[Out]) -> Out:
        return Out(sum(o.n for o in outs))

    @app.task
    async def count_ok(outcomes: list[Ok[POut] | Failed]) -> Out:
        return Out(sum(isinstance(o, Ok) and len(o.value.label) for o in outcomes))

    record = FailureRecord(
        reason=FailureReason.ERROR, error_type="E", message="m", attempt=1, retryable=False
    )
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await total.enqueue([Out(1), Out(2), Out(3)])
            assert await job.result(timeout=10) == Out(6)
            mixed: list[Ok[POut] | Failed] = [
                Ok(POut(label="abc")),
                Failed(record),
                Ok(POut(label="de")),
            ]
            assert await (await count_ok.enqueue(mixed)).result(timeout=10) == Out(5)


class Blob(msgspec.Struct, frozen=True):
    text: str


async def test_large_results_are_handed_off_whole(app_name: str, broker_url: str) -> None:
    """Results of every msgpack size class (bin 8/16/32, arrays past 15 and 65535 bytes)."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def grow(x: In) -> Blob:
        return Blob("x" * x.n)

    @app.task
    async def measure(b: Blob) -> Out:
        return Out(len(b.text))

    @app.task
    async def total(blobs: list[Blob]) -> Out:
        return Out(sum(len(b.text) for b in blobs))

    sizes = [0, 200, 300, 70_000, 100_000]
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            jobs = [await grow.then(measure).enqueue(In(n)) for n in sizes]
            assert [await job.result(timeout=10) for job in jobs] == [Out(n) for n in sizes]
            fan = await grow.map(In(5000 + i) for i in range(20)).then(total).enqueue()
            assert await fan.result(timeout=10) == Out(sum(5000 + i for i in range(20)))


async def test_a_flow_whose_derived_id_is_taken_is_refused(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def one(x: In) -> In:
        return x  # pragma: no cover

    @app.task
    async def two(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:
        await one.enqueue(In(0), job_id="taken.0")
        with pytest.raises(ConfigError, match=r"'taken\.0' of flow 'taken' is taken"):
            await one.then(two).enqueue(In(1), job_id="taken")
        counts = await app.broker.counts("default")
    assert counts[JobState.WAITING] + counts[JobState.SCHEDULED] == 1  # nothing stored


async def test_steps_on_other_queues_and_priorities(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="fast", priority=5)
    async def first(x: In) -> In:
        return In(x.n + 1)

    @app.task(queue="slow")
    async def member(x: In) -> Out:
        return Out(x.n * 2)

    @app.task(queue="fast", priority=-3)
    async def total(outs: list[Out]) -> In:
        return In(sum(o.n for o in outs))

    @app.task(queue="slow")
    async def last(x: In) -> Out:
        return Out(x.n)

    # On Redis Cluster each queue is its own slot: these flows hand off across slots.
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            chain = await first.then(last).enqueue(In(1))
            fan = await member.map(In(i) for i in range(4)).then(total).then(last).enqueue()
            assert (await app.broker.counts("fast"))[JobState.WAITING] == 1
            assert (await app.broker.counts("slow"))[JobState.WAITING] == 4
            assert (await app.broker.counts("slow"))[JobState.SCHEDULED] == 2
            assert (await app.broker.counts("fast"))[JobState.SCHEDULED] == 1
            async with app.worker(concurrency=4):
                assert await chain.result(timeout=10) == Out(2)
                assert await fan.result(timeout=10) == Out(12)
            info = await total.job(f"{fan.id}.0").info()
    assert (info.queue, info.priority, info.status) == ("fast", -3, JobState.COMPLETED)


async def test_limits_apply_to_flow_steps(app_name: str, broker_url: str) -> None:
    """Jobs of a flow are ordinary jobs to the limits: a fan-out's members and a chain's
    first step carry their keys; a later step may have a limit without key."""
    app = App(app_name, broker=broker_url)
    running: Counter[int] = Counter()
    peak: Counter[int] = Counter()

    @app.task(concurrency=ConcurrencyLimit(1, key=lambda x: x.n % 2))
    async def one_per_parity(x: In) -> Out:
        running[x.n % 2] += 1
        peak[x.n % 2] = max(peak[x.n % 2], running[x.n % 2])
        await anyio.sleep(0.01)
        running[x.n % 2] -= 1
        return Out(x.n)

    @app.task(rate_limit=RateLimit(1000, per=1.0))
    async def total(outs: list[Out]) -> In:
        return In(sum(o.n for o in outs))

    @app.task
    async def ident(x: In) -> In:
        return x  # pragma: no cover

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            fan = await one_per_parity.map(In(i) for i in range(8)).then(total).enqueue()
            (member,) = await app.broker.get([f"{fan.id}.m3"])
            assert member is not None
            assert member.message.concurrency_key == "1"
            async with app.worker(concurrency=8):
                assert await fan.result(timeout=10) == In(28)
    assert peak == Counter({0: 1, 1: 1})
    with pytest.raises(ConfigError, match="keyed on its input"):
        ident.then(one_per_parity)  # its key would come from ident's result


async def test_a_released_step_goes_before_jobs_enqueued_after_its_flow(
    app_name: str, broker_url: str
) -> None:
    """A chain's next step waits at the head of its priority level: a flow under way
    finishes before work enqueued since (else a callback queues behind every newer job)."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def double(x: In) -> In:
        return In(x.n * 2)

    @app.task
    async def plus_one(x: In) -> Out:
        return Out(x.n + 1)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await double.then(plus_one).enqueue(In(1))
            later = [await plus_one.enqueue(In(i)) for i in range(5)]
            broker = app.broker
            (first,) = await broker.claim(["default"], 1, worker_id="w", lease=30)
            assert first.message.task == "double"
            result = double.output.encode(In(2))
            await broker.complete([Completion(first.message.id, first.token, result)])
            claimed = await broker.claim(["default"], 10, worker_id="w", lease=30)
            assert [c.message.id for c in claimed] == [job.id] + [j.id for j in later]
            assert claimed[0].message.payload == result


async def test_retrying_the_failed_step_resumes_its_flow(app_name: str, broker_url: str) -> None:
    """Retrying the step that failed a chain runs it again and then the steps its failure
    stopped: the flow's own job completes. A step that never ran is not retried alone."""
    app = App(app_name, broker=broker_url)
    ran: list[str] = []
    fixed = False

    @app.task
    async def first(x: In) -> In:
        ran.append("first")
        return In(x.n + 1)

    @app.task
    async def flaky(x: In) -> In:
        ran.append("flaky")
        if not fixed:
            raise Boom("not yet")
        return In(x.n * 10)

    @app.task
    async def last(x: In) -> Out:
        ran.append("last")
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await first.then(flaky).then(last).enqueue(In(1))
            with pytest.raises(JobFailed):
                await job.result(timeout=10)
            broker = app.broker
            # The last step never ran (it ended with its flow): not retried alone.
            assert await broker.retry([job.id]) == [RetryOutcome.IN_FLOW]
            assert await job.status() is JobState.FAILED
            fixed = True
            assert await broker.retry([f"{job.id}.1"]) == [RetryOutcome.RETRIED]
            assert await job.result(timeout=10) == Out(20)
            assert await job.status() is JobState.COMPLETED
            state = await broker.flow_state(job.id)
            assert state is not None
            assert state.pending == -1  # the flow has ended again
            # Done now: nothing of the flow is retryable.
            assert await broker.retry([f"{job.id}.1"]) == [RetryOutcome.NOT_RETRYABLE]
    assert ran == ["first", "flaky", "flaky", "last"]


async def test_retrying_a_cancelled_step_resumes_a_cancelled_flow(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    started = anyio.Event()
    hang_once = True

    @app.task
    async def slow(x: In) -> In:
        if hang_once:
            started.set()
            await anyio.sleep_forever()
        return In(x.n + 1)

    @app.task
    async def after(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await slow.then(after).enqueue(In(4))
            await started.wait()
            assert await job.cancel()
            with pytest.raises(JobCancelled):
                await job.result(timeout=5)
            first = slow.job(f"{job.id}.0")
            with pytest.raises(JobCancelled):
                await first.result(timeout=5)
            hang_once = False
            assert await app.broker.retry([first.id]) == [RetryOutcome.RETRIED]
            assert await job.result(timeout=10) == Out(5)


async def test_a_fan_out_member_is_not_retried_alone(app_name: str, broker_url: str) -> None:
    """A failed member's flow failed without it and its siblings' results are not kept:
    retrying the member (or the callback that never ran) is refused, nothing changes."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def check(x: In) -> Out:
        if x.n == 2:
            raise Boom("bad 2")
        return Out(x.n)

    @app.task
    async def total(outs: list[Out]) -> Out:
        return Out(len(outs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await check.map(In(i) for i in range(4)).then(total).enqueue()
            with pytest.raises(JobFailed):
                await job.result(timeout=10)
            member = f"{job.id}.m2"
            assert await app.broker.retry([member, job.id]) == [RetryOutcome.IN_FLOW] * 2
            assert await check.job(member).status() is JobState.FAILED
            assert await job.status() is JobState.FAILED


async def test_held_steps_say_what_they_wait_for(app_name: str, broker_url: str) -> None:
    """A held step is ``scheduled`` (the six states of the spec) and inspect says which
    step of which flow it waits for, instead of a due time centuries away."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n * x.n)

    @app.task
    async def total(outs: list[Out]) -> In:
        return In(sum(o.n for o in outs))

    @app.task
    async def last(x: In) -> Out:
        return Out(x.n)

    @app.task
    async def plus(x: Out) -> Out:
        return Out(x.n + 1)

    tool = Inspector(app.client, ["default"])
    async with app:  # no worker: everything after the first step stays held
        chain = await square.then(plus).enqueue(In(3))
        fan = await square.map(In(i) for i in range(3)).then(total).then(last).enqueue()
        assert await chain.status() is JobState.SCHEDULED
        detail = await tool.job(chain.id)
        assert detail is not None
        assert detail.job.waits_for == f"waiting for step 0 ({chain.id}.0) of flow {chain.id}"
        flow = await tool.flow(fan.id)
        assert flow is not None
        assert [s.waits_for for s in flow.steps if s is not None] == [
            f"waiting for the fan-out (3 members) of flow {fan.id}",
            f"waiting for step 0 ({fan.id}.0) of flow {fan.id}",
        ]
        first = await tool.job(f"{chain.id}.0")  # waiting: waits on nothing
        assert first is not None
        assert first.job.waits_for == ""
        out = io.StringIO()
        render_job(Console(file=out, width=200), detail)
        render_flow(Console(file=out, width=200), flow)
    text = out.getvalue()
    assert f"scheduled (waiting for step 0 ({chain.id}.0) of flow {chain.id})" in text
    assert not [line for line in text.splitlines() if line.startswith("due")]
    assert f"scheduled (waiting for the fan-out (3 members) of flow {fan.id})" in text


async def test_retrying_a_failed_fan_in_callback_resumes_its_flow(
    app_name: str, broker_url: str
) -> None:
    """The callback's payload (the members' results) is kept with it: retried, it runs on
    the same results and the steps after it run."""
    app = App(app_name, broker=broker_url)
    fixed = False
    got: list[list[int]] = []

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n * x.n)

    @app.task
    async def total(outs: list[Out]) -> In:
        got.append([o.n for o in outs])
        if not fixed:
            raise Boom("not yet")
        return In(sum(o.n for o in outs))

    @app.task
    async def last(x: In) -> Out:
        return Out(x.n + 1)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await square.map(In(i) for i in range(4)).then(total).then(last).enqueue()
            with pytest.raises(JobFailed):
                await job.result(timeout=10)
            fixed = True
            assert await app.broker.retry([f"{job.id}.0"]) == [RetryOutcome.RETRIED]
            assert await job.result(timeout=10) == Out(1 + 4 + 9 + 1)
    assert got == [[0, 1, 4, 9]] * 2


async def test_purging_held_steps_fails_the_flow_and_counts_each_once(
    app_name: str, broker_url: str
) -> None:
    """Purging ``scheduled`` where a chain's steps are held deletes every job that was
    scheduled (the held step and the flow's own job: 2), whatever order the broker
    deletes them in, and fails the step still waiting with ``flow_broken``."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def a(x: In) -> In:
        return x  # pragma: no cover

    @app.task
    async def b(x: In) -> In:
        return x  # pragma: no cover

    @app.task
    async def c(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:  # no worker: F.0 waits, F.1 and F are held
        job = await a.then(b).then(c).enqueue(In(1))
        assert await app.broker.purge("default", [JobState.SCHEDULED]) == 2
        first, middle, own = await app.broker.get([f"{job.id}.0", f"{job.id}.1", job.id])
        counts = await app.broker.counts("default")
    assert (middle, own) == (None, None)
    assert first is not None
    assert first.state is JobState.FAILED
    assert decode_failure(first.error, "F.0").reason is FailureReason.FLOW_BROKEN
    assert (counts[JobState.SCHEDULED], counts[JobState.WAITING], counts[JobState.FAILED]) == (
        0,
        0,
        1,
    )


async def test_deleting_the_flows_own_job_fails_the_rest_like_any_step(
    app_name: str, broker_url: str
) -> None:
    """The flow's own job removed (or purged) before it finished fails the rest of the
    flow with ``flow_broken``, like any removed step: one answer, whichever job of the
    flow a purge reaches first. (Cancelling it still cancels the rest.)"""
    app = App(app_name, broker=broker_url)

    @app.task(queue="fast")
    async def first(x: In) -> In:
        return x  # pragma: no cover

    @app.task(queue="slow")
    async def middle(x: In) -> In:
        return x  # pragma: no cover

    @app.task(queue="fast")
    async def last(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:
        purged = await first.then(middle).then(last).enqueue(In(1))
        # Only the flow's own job is scheduled on "fast" (its middle step is held on
        # "slow"; on Redis Cluster the flow hands off across slots).
        assert await app.broker.purge("fast", [JobState.SCHEDULED]) == 1
        removed = await first.then(middle).then(last).enqueue(In(2))
        assert await app.broker.remove([removed.id]) == [True]
        ids = [f"{f.id}.{k}" for f in (purged, removed) for k in (0, 1)]
        with anyio.fail_after(TEST_DEADLINE):
            while True:  # across slots the rest ends through the hand-off outbox
                records = await app.broker.get(ids)
                if all(r is not None and r.state.is_final for r in records):
                    break
                await anyio.sleep(0.05)  # pragma: no cover
    for record in records:
        assert record is not None
        assert record.state is JobState.FAILED, record
        assert decode_failure(record.error, "step").reason is FailureReason.FLOW_BROKEN


async def test_purge_of_a_held_flow_across_batches_counts_every_scheduled_job(
    app_name: str, broker_url: str
) -> None:
    """A Redis purge deletes 1000 scheduled jobs per call: a flow whose own job falls in
    one call and its held step in the next is deleted whole (count 1001), as on the
    embedded broker, instead of the held step surviving as ``failed``."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def a(x: In) -> In:
        return x  # pragma: no cover

    @app.task
    async def b(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:
        await a.enqueue_many([In(i) for i in range(999)], delay=3600)
        flow = await a.then(a).then(b).enqueue(In(0))  # F.0 waits; F and F.1 held
        # Due order: the 999 delayed jobs, then F (held ids sort F < F.1): 1000 and 1001.
        assert await app.broker.purge("default", [JobState.SCHEDULED]) == 1001
        counts = await app.broker.counts("default")
        first = (await app.broker.get([f"{flow.id}.0"]))[0]
    assert (counts[JobState.SCHEDULED], counts[JobState.FAILED]) == (0, 1)
    assert first is not None
    assert first.state is JobState.FAILED


async def test_purging_the_last_waiting_members_purges_the_callback_they_release(
    app_name: str, broker_url: str
) -> None:
    """A collecting fan-in's callback is released when its last member settles, also
    when a purge of ``waiting`` deleted it; the same purge deletes the callback (nothing
    is left waiting) and counts it."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    @app.task
    async def report(outcomes: list[Ok[Out] | Failed]) -> In:
        return In(len(outcomes))  # pragma: no cover

    async with app:
        job = await square.map(In(i) for i in range(3)).collect(report).enqueue()
        assert await app.broker.purge("default", [JobState.WAITING]) == 4
        counts = await app.broker.counts("default")
        assert await app.broker.get([job.id]) == [None]
    assert sum(counts.values()) == 0


async def test_purging_several_states_deletes_every_job_of_a_flow_in_them(
    app_name: str, broker_url: str
) -> None:
    """Purging ``active`` and ``scheduled`` together: the running step's deletion ends
    its flow, which reaches the held steps; they are in a purged state, so they are
    deleted and counted (3), whichever state the broker purges first. Redis purged the
    states one by one and left the held steps failed (count 1); found by the combined
    model check (issue 24)."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def a(x: In) -> In:
        return x  # pragma: no cover

    @app.task
    async def b(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    async with app:
        flow = await a.then(a).then(b).enqueue(In(0))
        claimed = await app.broker.claim(["default"], 1, worker_id="w", lease=60)
        assert [c.message.id for c in claimed] == [f"{flow.id}.0"]
        removed = await app.broker.purge("default", [JobState.ACTIVE, JobState.SCHEDULED])
        counts = await app.broker.counts("default")
    assert removed == 3
    assert sum(counts.values()) == 0


async def test_purging_a_large_fan_outs_callback_fails_its_members_then_all_go_once(
    app_name: str, broker_url: str
) -> None:
    """Purging ``scheduled`` where a fan-out of 450 members holds its callback deletes
    the callback alone and fails every waiting member with ``flow_broken`` before the
    purge returns (Redis: over several purge calls and steps of the flow's end, issue
    31); the running ones are asked to cancel. Purging every state then deletes each
    job of it, and of a second such flow, once."""
    app = App(app_name, broker=broker_url)

    @app.task
    async def square(x: In) -> Out:
        return Out(x.n)  # pragma: no cover

    @app.task
    async def total(xs: list[Out]) -> In:
        return In(len(xs))  # pragma: no cover

    async with app:
        job = await square.map(In(i) for i in range(450)).then(total).enqueue()
        claimed = await app.broker.claim(["default"], 3, worker_id="w", lease=60)
        assert await app.broker.purge("default", [JobState.SCHEDULED]) == 1
        counts = await app.broker.counts("default")
        running = sorted(c.message.id for c in claimed)
        asked = await app.broker.cancel_requests(running)
        members = await app.broker.get([f"{job.id}.m{i}" for i in range(450)])
        await square.map(In(i) for i in range(450)).then(total).enqueue()
        removed = await app.broker.purge("default", list(JobState))
        after = await app.broker.counts("default")
    assert (counts[JobState.ACTIVE], counts[JobState.WAITING], counts[JobState.FAILED]) == (
        3,
        0,
        447,
    )
    assert sorted(asked) == running
    failed = [m for m in members if m is not None and m.state is JobState.FAILED]
    assert len(failed) == 447
    assert {decode_failure(m.error, "member").reason for m in failed} == {FailureReason.FLOW_BROKEN}
    assert removed == 3 + 447 + 451
    assert sum(after.values()) == 0
