"""Completion events on every broker (typedq.events): typed, in order, bounded by the
cap with a gap signal for a reader that fell behind, nothing lost after subscribing."""

from __future__ import annotations

import anyio
import pytest

from tests.support import TEST_DEADLINE, In, Out
from typedq import App, Backoff, CompletedEvent, EventGap, EventStream, FailedEvent, JobFailed
from typedq.events import Event

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


async def _take(events: EventStream[Out], n: int) -> list[Event[Out]]:
    got: list[Event[Out]] = []
    with anyio.fail_after(TEST_DEADLINE):
        async for event in events:
            got.append(event)
            if len(got) == n:
                return got
    raise AssertionError("the stream ended")


async def test_completed_and_failed_events_are_typed_and_in_order(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def double(x: In) -> Out:
        if x.n < 0:
            raise ValueError(f"negative {x.n}")
        return Out(x.n * 2)

    @app.task(retries=1, backoff=Backoff(kind="fixed", base=0))
    async def broken(x: In) -> Out:
        raise RuntimeError(f"broken {x.n}")

    async with app, app.events(double) as events, app.worker(concurrency=1):
        jobs = [await double.enqueue(In(n=n)) for n in (1, 2, -3, 4)]
        for job in jobs:
            with anyio.fail_after(TEST_DEADLINE):
                await app.broker.wait_finished(job.id, TEST_DEADLINE)
        other = await broken.enqueue(In(n=9))  # another task: not in this stream
        with pytest.raises(JobFailed):
            await other.result(timeout=TEST_DEADLINE)
        got = await _take(events, 4)
        broken_events = await _take(app.events(broken, replay=True), 1)
    one, two, failed, four = got
    assert isinstance(one, CompletedEvent)
    assert one == CompletedEvent(
        seq=one.seq, job_id=jobs[0].id, task="double", result=Out(2), attempt=1
    )
    assert isinstance(two, CompletedEvent)
    assert (two.job_id, two.result) == (jobs[1].id, Out(4))
    assert isinstance(failed, FailedEvent)
    assert failed.job_id == jobs[2].id
    assert failed.record is not None
    assert (failed.record.error_type, failed.record.message) == ("ValueError", "negative -3")
    assert not failed.cancelled
    assert isinstance(four, CompletedEvent)
    assert four.result == Out(8)
    seqs = [e.seq for e in got if not isinstance(e, EventGap)]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 4
    # One event per job, when it ends: the retried attempt of `broken` added none.
    [final] = broken_events
    assert isinstance(final, FailedEvent)
    assert final.job_id == other.id
    assert final.attempt == 2
    assert final.record is not None
    assert final.record.message == "broken 9"


async def test_a_cancelled_job_is_a_cancelled_failed_event(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def later(x: In) -> Out:
        return Out(x.n)

    async with app, app.events(later) as events:
        job = await later.enqueue(In(n=1), delay=3600)
        await job.cancel()
        [event] = await _take(events, 1)
    assert isinstance(event, FailedEvent)
    assert event.job_id == job.id
    assert event.cancelled


async def test_from_now_replay_and_resume(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app:
        await app.events(echo).start()  # the stream is on from here
        async with app.worker(concurrency=1):
            first = [await echo.enqueue(In(n=n)) for n in range(3)]
            for job in first:
                await job.result(timeout=TEST_DEADLINE)
            async with app.events(echo) as now:
                late = await echo.enqueue(In(n=10))
                await late.result(timeout=TEST_DEADLINE)
                [after_subscribe] = await _take(now, 1)
            replayed = await _take(app.events(echo, replay=True), 4)
            second = replayed[1]
            assert isinstance(second, CompletedEvent)
            resumed = await _take(app.events(echo, after=second.seq), 2)
    assert isinstance(after_subscribe, CompletedEvent)
    assert after_subscribe.job_id == late.id  # nothing from before the subscription
    ids = [j.id for j in (*first, late)]
    assert [e.job_id for e in replayed if isinstance(e, CompletedEvent)] == ids
    assert [e.job_id for e in resumed if isinstance(e, CompletedEvent)] == ids[2:]


async def test_a_reader_behind_the_cap_gets_a_gap(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url, events_max=10)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    total = 300
    async with app, app.events(echo) as behind:
        async with app.worker(concurrency=8):
            jobs = await echo.enqueue_many(In(n=n) for n in range(total))
            for job in jobs:
                await job.result(timeout=TEST_DEADLINE)
        # The reader reads only now: the stream kept about 10 of the 300 events.
        gap = await _take(behind, 1)
        assert isinstance(gap[0], EventGap)
        missed = gap[0].missed
        assert 0 < missed < total
        rest = await _take(behind, total - missed)
        retained = await _take(app.events(echo, replay=True), total - missed)
    assert not any(isinstance(e, EventGap) for e in rest)
    # Every event is either counted in the gap or delivered, once, in order.
    seqs = [e.seq for e in rest if not isinstance(e, EventGap)]
    assert seqs == list(range(seqs[0], seqs[0] + total - missed))
    assert seqs[0] == gap[0].after + missed + 1
    assert [e.seq for e in retained if not isinstance(e, EventGap)] == seqs


async def test_no_event_is_lost_between_subscribing_and_completions(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    total = 1000
    async with app, app.worker(concurrency=16), app.events(echo) as events:
        got: list[Event[Out]] = []

        async def read() -> None:
            got.extend(await _take(events, total))

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            jobs = await echo.enqueue_many(In(n=n) for n in range(total))
    assert not any(isinstance(e, EventGap) for e in got)
    completed = [e for e in got if isinstance(e, CompletedEvent)]
    assert sorted(e.job_id for e in completed) == sorted(j.id for j in jobs)
    assert {e.job_id: e.result for e in completed} == {j.id: Out(n) for n, j in enumerate(jobs)}
    assert [e.seq for e in completed] == sorted(e.seq for e in completed)


async def test_event_streams_on_at_worker_start(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url, event_streams=True)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app, app.worker(concurrency=1):
        job = await echo.enqueue(In(n=5))
        await job.result(timeout=TEST_DEADLINE)
        # Nobody subscribed before the job finished: a replay still has it.
        [event] = await _take(app.events(echo, replay=True), 1)
    assert isinstance(event, CompletedEvent)
    assert (event.job_id, event.result) == (job.id, Out(5))
