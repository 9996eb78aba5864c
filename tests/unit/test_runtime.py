"""The runtime and the typed producer API on the embedded broker, under asyncio and trio.

What depends on a broker transition is in ``tests/contract/`` (and runs on Redis too);
here is what the runtime and the producer side do on their own: sync handlers in
threads, the job context, direct calls, per-call options, and every check that
happens before any I/O (names, payload size, connection).
"""

from __future__ import annotations

import contextvars
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import pytest

from tests.support import TEST_DEADLINE, Big, In, Out, PIn, POut, count
from typedq import (
    App,
    Backoff,
    ConfigError,
    EncodeError,
    FailureReason,
    InvalidName,
    JobCancelled,
    JobContext,
    JobFailed,
    JobState,
    NotConnected,
    PartialEnqueue,
    PayloadTooLarge,
    Producer,
    QueueFull,
    ResultTimeout,
    Worker,
)

pytestmark = pytest.mark.anyio

MEMORY = "memory://"


def make_app(app_name: str) -> App:
    return App(app_name, broker=MEMORY)


# -- handlers: sync and async, the job context ------------------------------------------


async def test_sync_handler_runs_in_a_thread_without_blocking_the_loop(app_name: str) -> None:
    app = make_app(app_name)
    loop_thread = threading.get_ident()
    handler_threads: list[int] = []
    # (start, end) of each handler's sleep, on the monotonic clock.
    spans: list[tuple[float, float]] = []

    @app.task
    def blocking(x: In) -> Out:
        handler_threads.append(threading.get_ident())
        began = time.monotonic()
        time.sleep(0.4)
        spans.append((began, time.monotonic()))
        return Out(x.n)

    ticks: list[float] = []

    async def heartbeat() -> None:
        while True:
            ticks.append(time.monotonic())
            await anyio.sleep(0.02)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4), anyio.create_task_group() as tg:
            tg.start_soon(heartbeat)
            jobs = await blocking.enqueue_many(In(i) for i in range(4))
            assert [await job.result(timeout=10) for job in jobs] == [Out(i) for i in range(4)]
            tg.cancel_scope.cancel()

    assert loop_thread not in handler_threads
    # Order, not durations (a loaded machine stretches those): the four sleeps overlapped
    # (threads side by side, not one after the other) ...
    assert len(spans) == 4
    assert max(began for began, _ in spans) < min(end for _, end in spans)
    # ... and the loop ticked while each of them slept (a sleep on the loop's own thread
    # would leave no tick inside its span).
    for began, end in spans:
        assert any(began < tick < end for tick in ticks), (began, end)


async def test_job_context_and_progress(app_name: str) -> None:
    app = make_app(app_name)
    seen: list[JobContext] = []
    reported = anyio.Event()
    proceed = anyio.Event()

    @app.task(queue="a")
    async def resize(x: In, ctx: JobContext) -> Out:
        seen.append(ctx)
        await ctx.progress({"done": 1, "of": 2})
        reported.set()
        await proceed.wait()
        return Out(ctx.attempt)

    sync_reported = anyio.Event()
    sync_proceed = threading.Event()

    @app.task(queue="s")
    def resize_sync(x: In, ctx: JobContext) -> Out:
        seen.append(ctx)
        ctx.report_progress([x.n, "half"])
        anyio.from_thread.run_sync(sync_reported.set)
        sync_proceed.wait(10)
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker() as worker:
            before = time.time()
            job = await resize.enqueue(In(1))
            await reported.wait()
            assert (await job.info()).progress == {"done": 1, "of": 2}
            proceed.set()
            assert await job.result(timeout=10) == Out(1)

            sync_job = await resize_sync.enqueue(In(5))
            await sync_reported.wait()
            assert (await sync_job.info()).progress == [5, "half"]
            sync_proceed.set()
            assert await sync_job.result(timeout=10) == Out(1)

    ctx, sync_ctx = seen
    assert ctx.job_id == job.id
    assert ctx.task == "resize"
    assert ctx.queue == "a"
    assert ctx.attempt == 1
    assert ctx.worker_id == worker.id
    assert before - 1 <= ctx.enqueued_at <= time.time()
    assert ctx.last_progress == {"done": 1, "of": 2}
    assert sync_ctx.job_id == sync_job.id
    assert sync_ctx.queue == "s"
    assert sync_ctx.last_progress == [5, "half"]


_job_var: contextvars.ContextVar[int | None] = contextvars.ContextVar("job_var", default=None)


async def test_each_job_runs_in_its_own_context(app_name: str) -> None:
    """Jobs share long-lived runners, yet what one job sets in a contextvar is its own:
    the next job on the same runner starts without it, and a sync handler's thread and
    a child task see the value of the job that started them."""
    app = make_app(app_name)
    seen: list[tuple[int, int | None, int | None, int | None]] = []

    def in_thread() -> int | None:
        return _job_var.get()

    @app.task
    async def mark(x: In) -> Out:
        before = _job_var.get()
        _job_var.set(x.n)
        await anyio.lowlevel.checkpoint()
        child: list[int | None] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _append(child))
        seen.append((x.n, before, await anyio.to_thread.run_sync(in_thread), child[0]))
        return Out(x.n)

    async def _append(into: list[int | None]) -> None:
        into.append(_job_var.get())

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1):
            jobs = [await mark.enqueue(In(n)) for n in range(1, 6)]
            assert [await j.result(timeout=10) for j in jobs] == [Out(n) for n in range(1, 6)]
    assert sorted(seen) == [(n, None, n, n) for n in range(1, 6)]
    assert _job_var.get() is None


async def test_cancelling_one_job_stops_only_its_handler(app_name: str) -> None:
    app = make_app(app_name)
    started = {1: anyio.Event(), 2: anyio.Event()}
    release = anyio.Event()

    @app.task
    async def wait(x: In) -> Out:
        started[x.n].set()
        await release.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            first, second = await wait.enqueue(In(1)), await wait.enqueue(In(2))
            await started[1].wait()
            await started[2].wait()
            assert await first.cancel() is True
            with pytest.raises(JobCancelled):
                await first.result(timeout=10)
            assert await second.status() is JobState.ACTIVE
            release.set()
            assert await second.result(timeout=10) == Out(2)


async def test_one_runner_isolates_each_jobs_end_from_the_next(app_name: str) -> None:
    """Concurrency 1: every job runs on the same long-lived runner. A job that times
    out, one cancelled while running and one whose handler crashes each get their own
    outcome, and the job after each runs to completion on that runner (no cancellation
    or deadline left over). At concurrency 1 each outcome is also sent by the runner
    itself (the settler's inline send)."""
    app = make_app(app_name)
    started = anyio.Event()
    runs: list[str] = []

    @app.task(timeout=0.05, retries=0)
    async def slow(x: In) -> Out:
        runs.append("slow")
        await anyio.sleep(10)
        return Out(x.n)

    @app.task(retries=0)
    async def hang(x: In) -> Out:
        runs.append("hang")
        started.set()
        await anyio.sleep(10)
        return Out(x.n)

    @app.task(retries=0)
    async def crash(x: In) -> Out:
        runs.append("crash")
        raise RuntimeError("boom")

    @app.task(timeout=5)
    async def fine(x: In) -> Out:
        runs.append("fine")
        await anyio.sleep(0.01)  # past the earlier jobs' deadline: none is left over
        await anyio.lowlevel.checkpoint()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1):
            timed_out = await slow.enqueue(In(1))
            with pytest.raises(JobFailed) as failed:
                await timed_out.result(timeout=10)
            assert failed.value.record.reason is FailureReason.TIMEOUT
            assert await (await fine.enqueue(In(2))).result(timeout=10) == Out(2)

            cancelled = await hang.enqueue(In(3))
            await started.wait()
            assert await cancelled.cancel() is True
            with pytest.raises(JobCancelled):
                await cancelled.result(timeout=10)
            assert await (await fine.enqueue(In(4))).result(timeout=10) == Out(4)

            crashed = await crash.enqueue(In(5))
            with pytest.raises(JobFailed) as failed:
                await crashed.result(timeout=10)
            assert failed.value.record.error_type == "RuntimeError"
            assert await (await fine.enqueue(In(6))).result(timeout=10) == Out(6)
    assert runs == ["slow", "fine", "hang", "fine", "crash", "fine"]


async def test_every_idle_runner_is_woken_for_a_claim(app_name: str) -> None:
    """Jobs claimed together while every runner waits each wake a runner of their own
    (a bare future per waiting runner on asyncio, an anyio event on trio): four jobs
    that only finish once all four run at once must all start, round after round."""
    app = make_app(app_name)
    running = 0
    all_in = anyio.Event()

    @app.task
    async def meet(x: In) -> Out:
        nonlocal running, all_in
        running += 1
        if running == 4:
            all_in.set()
        await all_in.wait()
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            for round_ in range(3):
                running, all_in = 0, anyio.Event()
                jobs = await meet.enqueue_many([In(round_ * 4 + n) for n in range(4)])
                for n, job in enumerate(jobs):
                    assert await job.result(timeout=10) == Out(round_ * 4 + n)


async def test_a_claim_short_of_its_limit_is_not_followed_by_an_empty_one(
    app_name: str,
) -> None:
    """A claim that got fewer jobs than it asked for means no more were due: the worker
    waits for new work instead of claiming again for its free slots (an empty round
    trip per wake-up), and a job enqueued later is still claimed."""
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            claim = broker.claim
            got: list[tuple[int, int]] = []  # (limit, jobs) per claim

            async def counting(queues: Any, limit: int, **kwargs: Any) -> Any:
                jobs = await claim(queues, limit, **kwargs)
                got.append((limit, len(jobs)))
                return jobs

            broker.claim = counting  # type: ignore[method-assign]
            async with app.worker(concurrency=4):
                for n in (1, 2):
                    assert await (await echo.enqueue(In(n))).result(timeout=10) == Out(n)
                    await anyio.sleep(0.2)
                    assert got[-1] == (4, 1), got  # no claim after the one that got 1 of 4
    assert got.count((4, 1)) == 2


async def test_cancel_sync_handler_cooperatively(app_name: str) -> None:
    app = make_app(app_name)
    started = anyio.Event()
    stopped: list[str] = []

    @app.task
    def crunch(x: In, ctx: JobContext) -> Out:
        anyio.from_thread.run_sync(started.set)
        try:
            for _ in range(1000):
                time.sleep(0.01)
                ctx.check_cancelled()
        except BaseException as exc:
            stopped.append(type(exc).__name__)
            raise
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await crunch.enqueue(In(1))
            await started.wait()
            assert await job.cancel() is True
            with pytest.raises(JobCancelled):
                await job.result(timeout=10)
    assert len(stopped) == 1


async def test_pydantic_models_end_to_end(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def label(item: PIn) -> POut:
        return POut(label=f"{item.qty} x {item.name}")

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            job = await label.enqueue(PIn(name="nut", qty=12))
            result = await job.result(timeout=10)
    assert isinstance(result, POut)
    assert result.label == "12 x nut"


async def test_run_until_cancelled_and_stop(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            worker = app.worker()
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                assert await (await echo.enqueue(In(1))).result(timeout=10) == Out(1)
                tg.cancel_scope.cancel()  # cancelling run() is a graceful shutdown
            other = app.worker()
            async with anyio.create_task_group() as tg:
                await tg.start(other.run)
                assert await (await echo.enqueue(In(2))).result(timeout=10) == Out(2)
                other.stop()  # run() returns by itself
            with pytest.raises(RuntimeError):
                await other.run()  # a worker runs once


# -- direct calls and per-call options ----------------------------------------------------


async def test_calling_a_task_runs_the_function(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def double(x: In) -> Out:
        return Out(x.n * 2)

    @app.task
    def triple(x: In) -> Out:
        return Out(x.n * 3)

    @app.task
    async def where(x: In, ctx: JobContext) -> Out:
        return Out(ctx.attempt)

    # No broker, no connection: a plain call.
    assert await double(In(4)) == Out(8)
    assert await triple(In(4)) == Out(12)
    assert await where(In(0)) == Out(1)
    assert double.__wrapped__.__name__ == "double"


async def test_result_timeout(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def never_run(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await never_run.enqueue(In(1))
            start = time.monotonic()
            with pytest.raises(ResultTimeout) as caught:
                await job.result(timeout=0.1)
            assert 0.05 <= time.monotonic() - start < 2
            assert isinstance(caught.value, TimeoutError)
            assert "waiting" in str(caught.value)
            assert await job.status() is JobState.WAITING


async def test_a_job_that_ends_as_the_wait_runs_out_gives_its_outcome(
    app_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ends after the wait's last look and before result() reads it once more
    (the wait's time ran out first): its outcome, not a ResultTimeout that calls a final
    state 'still cancelled' (seen in a loaded run: the cancel's notice came late)."""
    app = make_app(app_name)

    @app.task
    async def never_run(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await never_run.enqueue(In(1))
            broker = app.broker

            async def ended_after_the_last_look(
                job_id: str, timeout: float | None, **_: Any
            ) -> None:
                await broker.cancel(job_id)
                return None  # as a wait whose time ran out just before the end

            monkeypatch.setattr(broker, "wait_finished", ended_after_the_last_look)
            with pytest.raises(JobCancelled):
                await job.result(timeout=0.1)


async def test_per_call_options(app_name: str) -> None:
    app = make_app(app_name)
    order: list[int] = []

    @app.task(retries=3, backoff=Backoff(kind="fixed", base=0.0, jitter=0.0), priority=1)
    async def step(x: In, ctx: JobContext) -> Out:
        order.append(x.n)
        if x.n < 0:
            raise ValueError("negative")
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            low = await step.enqueue(In(1), priority=0)
            default = await step.enqueue(In(2))
            high = await step.enqueue(In(3), priority=9)
            no_retry = await step.enqueue(In(-1), retries=0)
            assert (await low.info()).priority == 0
            assert (await default.info()).priority == 1
            async with app.worker(concurrency=1):
                for job in (low, default, high):
                    assert await job.result(timeout=10) == Out(1)
                with pytest.raises(JobFailed) as caught:
                    await no_retry.result(timeout=10)
    assert order == [3, 2, -1, 1]  # priority, then FIFO; no_retry has the task's 1
    assert caught.value.record.attempt == 1


async def test_duplicate_task_name_is_refused(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def dup(x: In) -> Out:
        return Out(x.n)

    async def other(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(ConfigError, match="already has a task named 'dup'"):
        app.task(name="dup")(other)


# -- checks before any I/O ------------------------------------------------------------------


async def test_not_connected_outside_async_with(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(NotConnected, match="async with app"):
        await echo.enqueue(In(1))
    with pytest.raises(NotConnected):
        await echo.enqueue_many([In(1), In(2)])
    async with app:
        job = await echo.enqueue(In(1))
    with pytest.raises(NotConnected):
        await job.status()
    with pytest.raises(NotConnected):
        await echo.enqueue(In(2))


async def test_payload_too_large_before_any_io(app_name: str) -> None:
    app = App(app_name, broker=MEMORY, max_payload_bytes=200)

    @app.task
    async def store(x: Big) -> None:
        return None

    huge = Big(blob="x" * 500)
    # Raised even when not connected: the size is checked before anything is sent.
    with pytest.raises(PayloadTooLarge) as caught:
        await store.enqueue(huge)
    assert caught.value.limit == 200
    assert caught.value.size > 500
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            with pytest.raises(PayloadTooLarge):
                await store.enqueue(huge)
            fits = Big(blob="x" * 150)
            await store.enqueue(fits)
            counts = await app.broker.counts("default")
            assert count(counts, JobState.WAITING) == 1


@pytest.mark.parametrize(
    "bad",
    ["a:b", "{x}", "has space", "x" * 129, "", "-lead", "new\nline", "star*", "é"],
)
async def test_invalid_names(app_name: str, bad: str) -> None:
    with pytest.raises(InvalidName):
        App(bad, broker=MEMORY)
    app = make_app(app_name)

    async def handler(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(InvalidName):
        app.task(queue=bad)(handler)
    if bad:  # name="" means the function's name
        with pytest.raises(InvalidName):
            app.task(name=bad)(handler)
    task = app.task(name="ok", queue="q" * 128)(handler)  # the longest name is fine
    if ":" in bad:
        return  # job ids may hold ':' (order:123); names may not
    with pytest.raises(InvalidName):
        task.job(bad if len(bad) < 129 else "x" * 201)
    async with app:
        with pytest.raises(InvalidName):
            await task.enqueue(In(1), job_id=bad if len(bad) < 129 else "x" * 201)
        assert not any((await app.broker.counts(task.queue)).values())


async def test_job_id_length_limit(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app:
        job = await echo.enqueue(In(1), job_id="j" * 200)
        assert job.id == "j" * 200
        with pytest.raises(InvalidName):
            await echo.enqueue(In(1), job_id="j" * 201)


async def test_dedup_key_derives_the_job_id(app_name: str) -> None:
    app = make_app(app_name)

    @app.task(key=lambda x: f"n{x.n}")
    async def once(x: In) -> Out:
        return Out(x.n)

    @app.task(key=lambda x: f"odd key: {x.n} @ {{}}")
    async def odd(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            first = await once.enqueue(In(1))
            again = await once.enqueue(In(1))
            other = await once.enqueue(In(2))
            assert first.created is True
            assert again.created is False
            assert again.id == first.id
            assert other.id != first.id
            weird = await odd.enqueue(In(1))
            weird_again = await odd.enqueue(In(1))
            assert weird_again.id == weird.id
            assert weird_again.created is False
            assert weird.id.startswith("odd:h")  # a key outside the id grammar is hashed
            assert first.id == "once:n1"
            batch = await once.enqueue_many([In(3), In(3), In(1)])
            assert [j.created for j in batch] == [True, False, False]
            assert count(await app.broker.counts("default"), JobState.WAITING) == 4
            async with app.worker():
                assert await again.result(timeout=10) == Out(1)


async def test_enqueue_many_with_a_bad_payload_enqueues_nothing(app_name: str) -> None:
    app = App(app_name, broker=MEMORY, max_payload_bytes=200)

    @app.task
    async def store(x: Big) -> None:
        return None

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            good = [Big(blob=str(i)) for i in range(5)]
            with pytest.raises(PayloadTooLarge):
                await store.enqueue_many([*good, Big(blob="x" * 500), *good])
            with pytest.raises(EncodeError):
                await store.enqueue_many([*good, cast(Big, In(1))])
            assert not any((await app.broker.counts("default")).values())
            jobs = await store.enqueue_many(good)
            assert [j.created for j in jobs] == [True] * 5
            assert len({j.id for j in jobs}) == 5
            assert await store.enqueue_many([]) == []


async def test_enqueue_many_in_chunks(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await echo.enqueue_many(In(i) for i in range(2_345))
            assert len({j.id for j in jobs}) == 2_345
            assert count(await app.broker.counts("default"), JobState.WAITING) == 2_345
            async with app.worker(concurrency=64):
                results = [await j.result(timeout=10) for j in jobs]
    assert results == [Out(i) for i in range(2_345)]


async def test_worker_configuration_errors(app_name: str) -> None:
    app = make_app(app_name)
    with pytest.raises(ConfigError, match="no tasks"):
        app.worker()

    @app.task(queue="shared")
    async def first(x: In) -> Out:
        return Out(x.n)

    @app.task(queue="shared")
    async def second(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(ConfigError):
        app.worker(concurrency=0)
    with pytest.raises(ConfigError, match="also carries tasks \\['second'\\]"):
        Worker(first)  # its queue also carries `second`, which it cannot run
    with pytest.raises(ConfigError):
        App(app_name, broker=MEMORY, lease=0)
    with pytest.raises(ConfigError, match="queues"):
        Worker(app, queues="shared")  # a str is a Sequence[str]: caught at run time
    # A producer stub has no handler: refused by its type, whatever it is bound to.
    stub = Producer(app_name, broker=MEMORY).task("first", In, Out, queue="shared")
    with pytest.raises(ConfigError, match="is a producer stub"):
        Worker(cast(Any, stub))
    # Worker(app) is what app.worker() returns: every task, every queue of the app.
    whole = Worker(app, concurrency=3)
    assert (sorted(whole.tasks), whole.queues, whole.concurrency) == (
        ["first", "second"],
        ["shared"],
        3,
    )
    with pytest.raises(ConfigError, match=r"queue 'other' is used by no task .*: shared\)"):
        app.worker(queues=["shared", "other"])  # a typo would run nothing, quietly
    insisted = app.worker(queues=["shared", "other"], allow_unknown_queues=True)
    assert sorted(insisted.queues) == ["other", "shared"]


async def test_enqueue_many_queue_full_is_raised_as_itself(app_name: str) -> None:
    app = App(app_name, broker=MEMORY, max_queue_length=600)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            # Chunks of 500: the first is stored, the others refused; the partial
            # outcome is raised, chained to the QueueFull (tests/redis/test_producer_reliability.py).
            with pytest.raises(PartialEnqueue) as info:
                await echo.enqueue_many(In(i) for i in range(1_200))
            assert isinstance(info.value.__cause__, QueueFull)
            assert len(info.value.jobs) == 500
            waiting = count(await app.broker.counts("default"), JobState.WAITING)
            assert waiting == 500
            # Nothing stored: the refusal itself, for one chunk or several.
            with pytest.raises(QueueFull):
                await echo.enqueue_many(In(i) for i in range(101))
            with pytest.raises(QueueFull):
                await echo.enqueue_many(In(i) for i in range(1_200))


async def test_sync_handler_timeout(app_name: str) -> None:
    app = make_app(app_name)
    steps: list[int] = []

    @app.task(timeout=0.2)
    def slow_steps(x: In, ctx: JobContext) -> Out:
        for step in range(500):
            steps.append(step)
            time.sleep(0.01)
            ctx.check_cancelled()  # threads cannot be interrupted: they check
        return Out(x.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker():
            with pytest.raises(JobFailed) as caught:
                await (await slow_steps.enqueue(In(1))).result(timeout=10)
    assert caught.value.reason is FailureReason.TIMEOUT
    assert 5 <= len(steps) < 200


async def test_check_cancelled_outside_a_worker_is_a_no_op() -> None:
    JobContext.check_cancelled()  # not in a worker thread: nothing to check


async def test_enqueue_option_errors(app_name: str) -> None:
    app = make_app(app_name)

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    async with app:
        with pytest.raises(ConfigError, match="naive"):
            await echo.enqueue(In(1), eta=datetime(2030, 1, 1))
        with pytest.raises(ConfigError):
            await echo.enqueue(In(1), delay=-1)
        with pytest.raises(ConfigError):
            await echo.enqueue(In(1), retries=-1)
        with pytest.raises(ConfigError):
            await echo.enqueue(In(1), timeout=0)
        job = await echo.enqueue(In(1), eta=datetime.now(UTC) + timedelta(seconds=60))
        assert await job.status() is JobState.SCHEDULED
        assert not any(
            v
            for s, v in (await app.broker.counts("default")).items()
            if s is not JobState.SCHEDULED
        )


async def test_error_in_the_worker_block_propagates_unwrapped(app_name: str) -> None:
    app = make_app(app_name)
    started = anyio.Event()

    @app.task
    async def short(x: In) -> Out:
        started.set()
        await anyio.sleep(0.05)
        return Out(x.n)

    async def fail_inside_worker() -> None:
        async with app.worker(grace=5):
            await started.wait()
            raise KeyError("from the block")

    async def fail_inside_both() -> None:
        async with app, app.worker():
            raise ValueError("both")

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await short.enqueue(In(1))
            with pytest.raises(KeyError, match="from the block"):
                await fail_inside_worker()
            # Leaving by an error is still a graceful shutdown: the job finished.
            assert await job.status() is JobState.COMPLETED
        with pytest.raises(ValueError, match="both"):
            await fail_inside_both()
