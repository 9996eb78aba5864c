"""Views of flow control (capability FlowViews, docs/flow-control.md "Inspecting flow
control"): fair keys with jobs waiting (and their weights), debounce keys, unique keys
held, job streams (and their readers), paged and bounded, on every broker."""

from __future__ import annotations

import time
from datetime import timedelta

import anyio
import msgspec
import pytest

import typedq.broker.memory.broker
import typedq.broker.postgres.streams
import typedq.broker.redis.streams
from tests.support import TEST_DEADLINE, claim_one, connected, msg, sleep_until
from typedq import App, Debounce, Fair, JobContext
from typedq.broker.base import Broker, Completion
from typedq.broker.flowviews import FlowKey, FlowKind
from typedq.broker.streams import StreamAppend

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class Doc(msgspec.Struct, frozen=True):
    doc: str


class Token(msgspec.Struct, frozen=True):
    text: str


async def walk(broker: Broker, queue: str, kind: FlowKind, limit: int) -> list[FlowKey]:
    """Every key of ``kind``, following the cursors (each page at most ``limit``)."""
    out: list[FlowKey] = []
    cursor: str | None = None
    for _ in range(10_000):
        page = await broker.flow_keys(queue, kind, cursor=cursor, limit=limit)
        assert len(page.keys) <= limit
        out += page.keys
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the cursors never ended")


async def test_views_show_fair_keys_debounced_jobs_and_unique_keys(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="fv", fair=Fair(key=lambda d: d.doc, weights={"big": 3}))
    async def share(d: Doc) -> None:
        pass

    @app.task(queue="fv", debounce=Debounce(key=lambda d: d.doc, wait=600.0, max_wait=3600.0))
    async def settle(d: Doc) -> None:
        pass

    @app.task(queue="fv", key=lambda d: d.doc, unique_for=timedelta(hours=1))
    async def once(d: Doc) -> None:
        pass

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            for kind in ("fair", "debounce", "unique"):
                assert (await walk(broker, "fv", kind, 10)) == []
            debounced = await settle.enqueue(Doc("d1"))
            held = await once.enqueue(Doc("u1"))
            done = await once.enqueue(Doc("u2"))
            # u2 completes: held for its window, which now has an end.
            claimed = await broker.claim(["fv"], 10, worker_id="w", lease=30)
            mine = [c for c in claimed if c.message.id == done.id]
            assert mine
            await broker.complete([Completion(done.id, mine[0].token, b"")])

            for doc in ("big", "big", "small"):
                await share.enqueue(Doc(doc))
            fair = {
                (k.task, k.key): (k.waiting, k.weight, k.priority)
                for k in await walk(broker, "fv", "fair", 10)
            }
            # Jobs waiting and the jobs one turn takes, the same on every broker.
            assert fair == {("share", "big"): (2, 3, 0), ("share", "small"): (1, 1, 0)}
            # The task's weights changed: a key's weight is its newest job's.
            newer = msg(queue="fv", task="share", payload=msgspec.msgpack.encode(Doc("big")))
            await broker.enqueue([msgspec.structs.replace(newer, fair_key="big", fair_weight=5)])
            fair = {
                (k.task, k.key): (k.waiting, k.weight, k.priority)
                for k in await walk(broker, "fv", "fair", 10)
            }
            assert fair == {("share", "big"): (3, 5, 0), ("share", "small"): (1, 1, 0)}
            debounce = await walk(broker, "fv", "debounce", 10)
            assert [(k.task, k.key, k.job_id) for k in debounce] == [("settle", "d1", debounced.id)]
            assert debounce[0].until is not None
            unique = {k.key: k for k in await walk(broker, "fv", "unique", 10)}
            assert unique["u1"].job_id == held.id
            assert unique["u1"].until is None or held.id in {c.message.id for c in claimed}
            assert unique["u2"].job_id == done.id
            assert unique["u2"].until is not None
            # Another queue sees none of them.
            assert await walk(broker, "other", "unique", 10) == []


async def test_pages_are_bounded_and_cover_every_key(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="fp", fair=Fair(key=lambda d: d.doc))
    async def share(d: Doc) -> None:
        pass

    @app.task(queue="fp", key=lambda d: d.doc, unique_for=timedelta(hours=1))
    async def once(d: Doc) -> None:
        pass

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            for i in range(25):
                await share.enqueue(Doc(f"k{i}"))
                await once.enqueue(Doc(f"u{i}"))
            fair = await walk(app.broker, "fp", "fair", 4)
            assert {k.key for k in fair} == {f"k{i}" for i in range(25)}
            assert all(k.waiting == 1 and k.weight == 1 for k in fair)
            unique = await walk(app.broker, "fp", "unique", 3)
            assert {k.key for k in unique} == {f"u{i}" for i in range(25)}
            page = await app.broker.flow_keys("fp", "unique", limit=5000)
            assert len(page.keys) <= 1000
            with pytest.raises(ValueError, match="invalid page cursor"):
                await app.broker.flow_keys("fp", "unique", cursor="nonsense")


async def test_streams_of_a_queue_are_listed_with_their_entries(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="s1"), msg(job_id="s2"), msg(job_id="other", queue="o")])
        runs = [await claim_one(broker) for _ in range(2)]
        for i, run in enumerate(runs):
            items = [b"x"] * (i + 2)
            appended = await broker.append_streams(
                [
                    StreamAppend(
                        job_id=run.message.id,
                        queue="q",
                        token=run.token,
                        attempt=1,
                        seq=0,
                        items=items,
                        fresh=True,
                    )
                ]
            )
            assert appended == [True]
        streams = await walk(broker, "q", "stream", 1)
        by_id = {k.job_id: k for k in streams}
        assert {i: k.waiting for i, k in by_id.items()} == {
            runs[0].message.id: 2,
            runs[1].message.id: 3,
        }
        # No reader read them.
        assert all(k.readers == 0 for k in streams)
        assert await walk(broker, "o", "stream", 10) == []
        # Readers count while they read, each once however often it reads, until they
        # leave.
        first, second = runs[0].message.id, runs[1].message.id
        for reader in ("r1", "r2", "r1"):
            got = await broker.read_stream(first, queue="q", after="", timeout=0, reader=reader)
            assert len(got) == 2
        await broker.read_stream(second, queue="q", after="", timeout=0, reader="r3")

        async def readers() -> dict[str, int | None]:
            return {k.job_id: k.readers for k in await walk(broker, "q", "stream", 10)}

        assert await readers() == {first: 2, second: 1}
        await broker.leave_stream(first, queue="q", reader="r1")
        await broker.leave_stream(second, queue="q", reader="r3")
        await broker.leave_stream(second, queue="q", reader="r3")  # again: nothing
        assert await readers() == {first: 1, second: 0}


async def test_a_reader_that_stops_reading_drops_out(
    app_name: str, broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A reader that never leaves (its process died) stops counting READER_TTL after its
    # last read's wait: a short one here. It still counts while the TTL runs: checked when
    # the first walk answered within it (a walk of a Cluster on a box at load 9 took over
    # 1 s: a walk that answers later cannot tell), and no longer counts after it.
    ttl = 1.5
    monkeypatch.setattr(typedq.broker.memory.broker, "READER_TTL", ttl)
    monkeypatch.setattr(typedq.broker.redis.streams, "READER_TTL", ttl)
    monkeypatch.setattr(typedq.broker.postgres.streams, "READER_TTL", ttl)
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="d1")])
        run = await claim_one(broker)
        append = StreamAppend(
            job_id="d1", queue="q", token=run.token, attempt=1, seq=0, items=[b"x"], fresh=True
        )
        assert await broker.append_streams([append]) == [True]
        before_read = time.time()
        await broker.read_stream("d1", queue="q", after="", timeout=0, reader="gone")
        read_at = time.time()
        counted = [k.readers for k in await walk(broker, "q", "stream", 10)]
        if time.time() < before_read + ttl:  # answered before the reader's TTL could end
            assert counted == [1]
        await sleep_until(read_at + ttl, margin=0.2)
        assert [k.readers for k in await walk(broker, "q", "stream", 10)] == [0]


async def test_job_stream_readers_are_counted_until_they_end_or_close(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    go = anyio.Event()

    @app.task(queue="sr", emits=Token)
    async def talk(d: Doc, ctx: JobContext[Token]) -> None:
        await ctx.emit(Token("a"))
        await go.wait()
        await ctx.emit(Token("b"))

    async def readers() -> list[int | None]:
        return [k.readers for k in await walk(app.broker, "sr", "stream", 10)]

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(queues=["sr"]):
            job = await talk.enqueue(Doc("x"))
            follow, leave = job.stream(poll=0.2), job.stream(poll=0.2)
            assert (await anext(follow)).text == "a"
            assert (await anext(leave)).text == "a"
            assert await readers() == [2]
            # One stops early and closes; the other reads to the end.
            await leave.aclose()
            assert await readers() == [1]
            assert [t async for t in leave] == []
            go.set()
            assert [t.text async for t in follow] == ["b"]
            assert await readers() == [0]
            await job.result(timeout=5)
