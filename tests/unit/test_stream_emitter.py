"""The worker side of job streams (typedq.streams.Emitter) on the embedded broker:
batching, back-pressure, the end of an attempt, a lost lease, a broker that fails."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from tests.support import msg
from typedq.broker.base import ClaimedJob
from typedq.broker.memory import MemoryBroker
from typedq.clock import VirtualClock
from typedq.errors import NotConnected
from typedq.serde import codec_for
from typedq.streams import Emitter

pytestmark = pytest.mark.anyio


class Token(msgspec.Struct, frozen=True):
    i: int


async def _claimed(broker: MemoryBroker) -> ClaimedJob:
    await broker.enqueue([msg(job_id="j", task="t")])
    (claimed,) = await broker.claim(["q"], 1, worker_id="w", lease=60)
    return claimed


async def _items(broker: MemoryBroker) -> list[int]:
    entries = await broker.read_stream("j", queue="q", after="", timeout=0)
    return [msgspec.msgpack.decode(e.data, type=Token).i for e in entries]


async def test_emits_made_while_a_batch_is_on_its_way_go_in_the_next_one() -> None:
    broker = MemoryBroker()
    await broker.connect()
    claimed = await _claimed(broker)
    emitter = Emitter(broker, claimed, codec_for(Token), VirtualClock())
    sizes: list[int] = []
    first_sent = anyio.Event()
    send = broker.append_streams

    async def slow(appends: list[object]) -> list[bool]:
        sizes.extend(len(a.items) for a in appends)  # type: ignore[attr-defined]
        if len(sizes) == 1:
            await first_sent.wait()  # the first batch's round trip lasts until told
        return await send(appends)  # type: ignore[arg-type]

    broker.append_streams = slow  # type: ignore[method-assign,assignment]
    async with anyio.create_task_group() as tg:
        await tg.start(emitter.run)
        await emitter.emit(Token(0))
        await anyio.wait_all_tasks_blocked()  # the loop sends the first item alone
        for i in range(1, 100):
            await emitter.emit(Token(i))  # no wait: buffered meanwhile
        first_sent.set()
        await emitter.flush()
        tg.cancel_scope.cancel()
    assert await _items(broker) == list(range(100))
    assert sizes == [1, 99]
    assert emitter.sent == 100


async def test_emit_waits_while_the_buffer_is_full() -> None:
    broker = MemoryBroker()
    await broker.connect()
    emitter = Emitter(
        broker, await _claimed(broker), codec_for(Token), VirtualClock(), buffer_max=3
    )
    for i in range(3):
        await emitter.emit(Token(i))  # the flush loop is not running: they stay buffered
    done = anyio.Event()

    async def fourth() -> None:
        await emitter.emit(Token(3))
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(fourth)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()  # back-pressure
        await emitter.flush()  # takes the three: room again
        await done.wait()
    await emitter.flush()
    assert await _items(broker) == [0, 1, 2, 3]


async def test_after_close_items_are_dropped_not_waited_for() -> None:
    broker = MemoryBroker()
    await broker.connect()
    emitter = Emitter(
        broker, await _claimed(broker), codec_for(Token), VirtualClock(), buffer_max=1
    )
    await emitter.emit(Token(0))
    emitter.close()
    with anyio.fail_after(1):
        await emitter.emit(Token(1))  # the buffer is full, but the attempt is over
    await emitter.flush()
    assert await _items(broker) == [0]


async def test_a_lost_lease_drops_the_runs_items() -> None:
    broker = MemoryBroker()
    await broker.connect()
    claimed = await _claimed(broker)
    stranger = msgspec.structs.replace(claimed, token="not-the-lease")  # noqa: S106
    emitter = Emitter(broker, stranger, codec_for(Token), VirtualClock())
    await emitter.emit(Token(0))
    await emitter.flush()
    assert emitter.refused
    await emitter.emit(Token(1))  # dropped quietly: the handler is being stopped
    await emitter.flush()
    assert await _items(broker) == []


async def test_a_broker_error_reaches_the_handler() -> None:
    broker = MemoryBroker()
    await broker.connect()
    emitter = Emitter(broker, await _claimed(broker), codec_for(Token), VirtualClock())
    await broker.close()
    async with anyio.create_task_group() as tg:
        await tg.start(emitter.run)
        await emitter.emit(Token(0))
        await anyio.wait_all_tasks_blocked()
        with pytest.raises(NotConnected):
            await emitter.emit(Token(1))
        with pytest.raises(NotConnected):
            await emitter.flush()
        tg.cancel_scope.cancel()


async def test_an_item_of_another_model_is_a_type_error() -> None:
    broker = MemoryBroker()
    await broker.connect()
    emitter = Emitter(broker, await _claimed(broker), codec_for(Token), VirtualClock())
    with pytest.raises(TypeError, match="task 't' emits Token, not int"):
        await emitter.emit(5)
