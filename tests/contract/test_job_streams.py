"""Typed job streams on every broker (``@app.task(emits=...)``, ``ctx.emit``,
``job.stream()``; docs/streams.md): order, the end, replay, retries, the cap, and the
errors of a wrong emit."""

from __future__ import annotations

from typing import Any, cast

import anyio
import anyio.lowlevel
import msgspec
import pytest

from tests.support import TEST_DEADLINE, In, Out, claim_one, connected, msg
from typedq import (
    App,
    Backoff,
    ConfigError,
    JobContext,
    JobFailed,
    Producer,
    StreamRestarted,
    StreamTruncated,
)
from typedq.broker.base import Completion, Failure, FinishOutcome
from typedq.broker.messages import JobState
from typedq.broker.streams import STREAM_MAX, StreamAppend
from typedq.testing import job_context, run_worker

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class Token(msgspec.Struct, frozen=True):
    text: str
    i: int = 0


class Other(msgspec.Struct, frozen=True):
    n: int


async def test_items_arrive_in_order_and_the_stream_ends(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    go = anyio.Event()

    @app.task(emits=Token)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        await go.wait()
        for i in range(p.n):
            await ctx.emit(Token(f"t{i}", i))
            if i % 50 == 0:
                await anyio.lowlevel.checkpoint()  # some batches of one, some of many
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await generate.enqueue(In(300))
            stream = job.stream(poll=0.2)
            got: list[Token] = []
            go.set()  # the reader is there before the first item
            async for token in stream:
                got.append(token)
            assert [t.i for t in got] == list(range(300))
            assert got[7] == Token("t7", 7)
            assert stream.attempt == 1
            assert await job.result(timeout=5) == Out(300)


async def test_a_finished_jobs_stream_replays(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(emits=Token)
    def generate(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            ctx.emit_sync(Token("x", i))  # a sync handler, in a worker thread
        return Out(p.n)

    @app.task(emits=Token)
    async def silent(p: In, ctx: JobContext[Token]) -> Out:
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await generate.enqueue(In(20))
            quiet = await silent.enqueue(In(1))
            assert await job.result(timeout=5) == Out(20)
            assert await quiet.result(timeout=5) == Out(1)
            for handle in (job, generate.job(job.id)):
                assert [t.i async for t in handle.stream(poll=0.2)] == list(range(20))
            assert [t async for t in quiet.stream(poll=0.2)] == []


async def test_a_retried_job_restarts_its_stream(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    first_read = anyio.Event()

    @app.task(emits=Token, retries=1, backoff=Backoff(kind="fixed", base=0))
    async def flaky(p: In, ctx: JobContext[Token]) -> Out:
        if ctx.attempt == 1:
            await ctx.emit(Token("a"))
            await ctx.emit(Token("b"))
            await first_read.wait()
            raise RuntimeError("the model went away")
        await ctx.emit(Token("c"))
        await ctx.emit(Token("d"))
        return Out(ctx.attempt)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            job = await flaky.enqueue(In(0))
            stream = job.stream(poll=0.2)
            seen: list[str] = []
            restarts: list[int] = []
            while True:
                try:
                    async for token in stream:
                        seen.append(token.text)
                        if token.text == "b":
                            first_read.set()
                    break
                except StreamRestarted as exc:
                    restarts.append(exc.attempt)
                    seen.append("|")
            assert seen == ["a", "b", "|", "c", "d"]
            assert restarts == [2]
            assert stream.attempt == 2
            assert await job.result(timeout=5) == Out(2)
            # A replay reads the last attempt's items only: no restart in it.
            assert [t.text async for t in job.stream(poll=0.2)] == ["c", "d"]


async def test_a_reader_behind_the_cap_is_told_what_it_missed(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    total = STREAM_MAX + 500

    @app.task(emits=Token)
    async def flood(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token("", i))
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE * 2):
        async with app, app.worker(concurrency=1):
            job = await flood.enqueue(In(total))
            assert await job.result(timeout=30) == Out(total)
            stream = job.stream(poll=0.2)
            with pytest.raises(StreamTruncated) as info:
                await stream.__anext__()
            missed = info.value.missed
            # The embedded broker keeps exactly STREAM_MAX entries (the end entry is one);
            # Redis trims whole nodes (MAXLEN ~): at least STREAM_MAX.
            assert 1 <= missed <= 501
            rest = [t.i async for t in stream]  # the same iterator goes on
            assert rest == list(range(missed, total))


async def test_emitting_the_wrong_model_fails_the_attempt(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(emits=Token)
    async def wrong(p: In, ctx: JobContext[Token]) -> Out:
        await ctx.emit(Token("fine"))
        await cast(Any, ctx).emit(Other(1))  # what mypy refuses, at run time
        return Out(0)

    with pytest.raises(TypeError, match="emits Token, not Other"):
        await wrong(In(0))  # a direct call checks too
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1):
            job = await wrong.enqueue(In(0))
            with pytest.raises(JobFailed) as info:
                await job.result(timeout=5)
            assert info.value.record.error_type == "TypeError"
            assert "task 'wrong' emits Token, not Other" in info.value.record.message
            # What it emitted before the error is there, then the stream ends.
            assert [t.text async for t in job.stream(poll=0.2)] == ["fine"]


async def test_emit_from_a_task_without_emits_is_a_clear_error(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task
    async def plain(p: In, ctx: JobContext) -> Out:
        await cast(Any, ctx).emit(Token("x"))  # JobContext[Never]: mypy refuses it
        return Out(0)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1):
            job = await plain.enqueue(In(0))
            with pytest.raises(JobFailed) as info:
                await job.result(timeout=5)
            assert info.value.record.error_type == "typedq.errors.ConfigError"
            assert "@app.task(emits=Model)" in info.value.record.message
            assert not hasattr(job, "stream")  # a plain task's handle has no stream


async def test_a_job_cancelled_before_it_ran_has_an_empty_stream(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(emits=Token)
    async def later(p: In, ctx: JobContext[Token]) -> Out:
        await ctx.emit(Token("never"))
        return Out(0)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            job = await later.enqueue(In(0), delay=3600)
            assert await job.cancel()
            # No end entry (it never ran): the look at the job ends the stream.
            assert [t async for t in job.stream(poll=0.2)] == []


def test_emits_must_be_a_model() -> None:
    app = App("streams-config")

    async def bad(p: In) -> Out:
        return Out(0)

    with pytest.raises(ConfigError, match=r"emits=<class .int.> must be a msgspec\.Struct"):
        cast(Any, app.task)(emits=int)(bad)  # mypy refuses emits=int


# -- the broker seam: fences, runs, the end entry ------------------------------------


def _append(
    job_id: str, token: str, attempt: int, seq: int, items: list[bytes], **more: Any
) -> StreamAppend:
    return StreamAppend(
        job_id=job_id, queue="q", token=token, attempt=attempt, seq=seq, items=items, **more
    )


async def test_appends_are_fenced_by_the_runs_token(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="s"), msg(job_id="w")])
        run = await claim_one(broker)
        assert run.message.id == "s"
        # A waiting job, an unknown job, a stranger's token: refused, nothing stored.
        assert await broker.append_streams(
            [
                _append("w", run.token, 1, 0, [b"x"]),
                _append("nope", run.token, 1, 0, [b"x"]),
                _append("s", "stranger", 1, 0, [b"x"]),
                _append("s", run.token, 1, 0, [b"a", b"b"], fresh=True),
                _append("s", run.token, 1, 2, [b"c"]),
            ]
        ) == [False, False, False, True, True]
        entries = await broker.read_stream("s", queue="q", after="", timeout=0)
        assert [(e.data, e.seq, e.attempt, e.end) for e in entries] == [
            (b"a", 0, 1, None),
            (b"b", 1, 1, None),
            (b"c", 2, 1, None),
        ]
        assert await broker.read_stream("w", queue="q", after="", timeout=0) == []
        # Positions grow; reading after one gives what follows it.
        after = await broker.read_stream("s", queue="q", after=entries[0].position, timeout=0)
        assert [e.data for e in after] == [b"b", b"c"]
        # The end entry only once the job is final by this token.
        assert await broker.append_streams([_append("s", run.token, 1, 3, [], end=True)]) == [False]
        assert await broker.complete([Completion("s", run.token, b"\xc0")]) == [FinishOutcome.OK]
        # After the finish, items are refused; the end is taken and records the state.
        assert await broker.append_streams(
            [_append("s", run.token, 1, 3, [b"late"]), _append("s", run.token, 1, 3, [], end=True)]
        ) == [False, True]
        tail = await broker.read_stream("s", queue="q", after=entries[-1].position, timeout=0)
        assert [(e.data, e.seq, e.end) for e in tail] == [(b"", 3, JobState.COMPLETED)]


async def test_a_new_run_empties_the_stream_and_positions_keep_growing(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="r")])
        first = await claim_one(broker)
        assert await broker.append_streams(
            [_append("r", first.token, 1, 0, [b"a", b"b"], fresh=True)]
        ) == [True]
        old = await broker.read_stream("r", queue="q", after="", timeout=0)
        failure = Failure(id="r", token=first.token, error=b"\x90", retry_delay=0.0)
        assert await broker.fail([failure]) == [FinishOutcome.OK]
        second = await claim_one(broker)
        assert second.attempt == 2
        # The old run's token no longer writes; the new run's first write empties it.
        assert await broker.append_streams(
            [
                _append("r", first.token, 1, 2, [b"stale"]),
                _append("r", second.token, 2, 0, [b"c"], fresh=True),
            ]
        ) == [False, True]
        everything = await broker.read_stream("r", queue="q", after="", timeout=0)
        assert [(e.data, e.attempt, e.seq) for e in everything] == [(b"c", 2, 0)]
        # A reader positioned in the old run gets the new run's entries after it.
        follow = await broker.read_stream("r", queue="q", after=old[-1].position, timeout=0)
        assert [e.data for e in follow] == [b"c"]


async def test_a_read_waits_for_the_next_append(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="l")])
        run = await claim_one(broker)
        got: list[bytes] = []

        async def read() -> None:
            entries = await broker.read_stream("l", queue="q", after="", timeout=3.0)
            got.extend(e.data for e in entries)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            await anyio.sleep(0.2)  # the reader waits (not polling: woken by the append)
            assert got == []
            ok = await broker.append_streams([_append("l", run.token, 1, 0, [b"x"], fresh=True)])
            assert ok == [True]
        assert got == [b"x"]
        # Nothing after: a read with a timeout comes back empty once it ran out.
        last = await broker.read_stream("l", queue="q", after="", timeout=0)
        assert await broker.read_stream("l", queue="q", after=last[-1].position, timeout=0.1) == []


async def test_a_direct_call_emits_into_the_tests_list() -> None:
    app = App("streams-direct")

    @app.task(emits=Token)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token("t", i))
        return Out(p.n)

    tokens: list[Token] = []
    assert await generate(In(3), job_context(emitted=tokens)) == Out(3)
    assert [t.i for t in tokens] == [0, 1, 2]
    assert await generate(In(2)) == Out(2)  # no list: checked and dropped


async def test_poll_must_be_positive() -> None:
    app = App("streams-poll")

    @app.task(emits=Token)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        return Out(p.n)

    job = generate.job("j1")
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"job.stream\(poll=.*\): poll must be"):
            job.stream(poll=bad)


async def test_a_producer_stub_streams_the_workers_items(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(emits=Token)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token("p", i))
        return Out(p.n)

    # The producer service: no handler, the task declared with emits= (typedq stubs).
    producer = Producer(app_name, broker=app.broker if broker_url == "memory://" else broker_url)
    stub = producer.task("generate", In, Out, emits=Token)
    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=1), producer:
            job = await stub.enqueue(In(5))
            assert [t.i async for t in job.stream(poll=0.2)] == list(range(5))
            assert await job.result(timeout=5) == Out(5)


async def test_streams_under_the_test_harness() -> None:
    """typedq.testing.run_worker (an embedded broker on a virtual clock)."""
    app = App("streams-harness")

    @app.task(emits=Token, timeout=60)
    async def generate(p: In, ctx: JobContext[Token]) -> Out:
        for i in range(p.n):
            await ctx.emit(Token("h", i))
        return Out(p.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app):
            job = await generate.enqueue(In(4))
            assert [t.i async for t in job.stream()] == [0, 1, 2, 3]
            assert await job.result(timeout=5) == Out(4)
