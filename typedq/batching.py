"""Coalescing many concurrent single calls into batched broker calls.

:class:`Batcher` is how concurrent ``enqueue`` calls from many coroutines become one
round trip (auto-batching), and how workers ack in batches. A lone call is not
delayed: when nothing is in flight the first item is sent at once; items that
arrive while batches are in flight are sent together as soon as a slot frees up.

One bad item never fails its neighbours: when a batch of several items fails with an
error that may belong to one item (anything but the broker being out of reach, a
full queue or lost data, see :func:`is_batch_wide`), its items are re-sent one by one,
in order, so only the culprit gets the error. The items must therefore be safe to
send twice, which enqueue (ids fixed by the client), complete and fail (fenced by
token) are. Should the first few items each fail alone exactly as the batch did, the
refusal is the broker's own (a read-only replica, say) and the rest fail with it, so
a broker in trouble never gets a round trip per item.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .errors import BrokerUnavailable, NotConnected, QueueFull, RedisDataLost

__all__ = ["Batcher", "is_batch_wide"]

log = logging.getLogger("typedq.batching")

I = TypeVar("I")  # noqa: E741 -- item
R = TypeVar("R")


class _Slot(Generic[R]):
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: R | None = None
        self.error: BaseException | None = None


#: Re-sending a failed batch item by item stops when this many first items fail exactly
#: as the batch did (and none succeeded): the broker refuses everything, not one item.
SAME_FAILURES_BEFORE_GIVING_UP = 3


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises still gets a description
        return f"{type(exc).__name__} (unprintable)"


def is_batch_wide(exc: Exception) -> bool:
    """True for errors about the broker, not about one item: re-sending the items one by
    one would fail each the same way (and multiply the load on a broker in trouble).

    The broker out of reach (its answer may be lost, so nothing is known about the
    batch), the batcher stopped, a full queue (a state of the queue: the batch is
    refused as a whole, like any enqueue at the bound) and lost Redis data.
    """
    return isinstance(exc, BrokerUnavailable | NotConnected | QueueFull | RedisDataLost)


class Batcher(Generic[I, R]):
    """Sends items through ``send`` in batches of at most ``max_batch``.

    :param send: takes a batch, returns one result per item, in order
    :param max_batch: the largest batch sent in one call
    :param max_in_flight: how many batches may be in flight at once
    :param batch_wide: which errors of a batch are the whole batch's; on any other
        error a batch of several items is re-sent one item at a time (items must be
        idempotent to re-send), so one bad item fails alone
    """

    def __init__(
        self,
        send: Callable[[list[I]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 500,
        max_in_flight: int = 4,
        name: str = "batcher",
        batch_wide: Callable[[Exception], bool] = is_batch_wide,
    ) -> None:
        self._send = send
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.name = name
        self._batch_wide = batch_wide
        self._sender: MemoryObjectSendStream[tuple[I, _Slot[R]]] | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush submitted items until cancelled. Runs in its owner's task group."""
        sender, receiver = anyio.create_memory_object_stream[tuple[I, _Slot[R]]](math.inf)
        # A semaphore, not a CapacityLimiter: the flusher acquires, the delivering task releases.
        limiter = anyio.Semaphore(self.max_in_flight)
        try:
            async with anyio.create_task_group() as tg:
                self._sender = sender
                task_status.started()
                await self._flush_forever(receiver, limiter, tg)
        finally:
            self._sender = None
            sender.close()
            # Anything still queued will never be sent: fail it instead of hanging.
            while True:
                try:
                    _, slot = receiver.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                slot.error = NotConnected(f"{self.name} closed before the item was sent")
                slot.done.set()
            receiver.close()

    async def _flush_forever(
        self,
        receiver: MemoryObjectReceiveStream[tuple[I, _Slot[R]]],
        limiter: anyio.Semaphore,
        tg: anyio.abc.TaskGroup,
    ) -> None:
        while True:
            # A free slot first, then an item: an item taken off the stream while waiting
            # for a slot would be neither sent nor failed if the batcher stopped meanwhile.
            await limiter.acquire()
            try:
                first = await receiver.receive()
            except BaseException:
                limiter.release()
                raise
            batch = [first]
            while len(batch) < self.max_batch:
                try:
                    batch.append(receiver.receive_nowait())
                except anyio.WouldBlock:
                    break
            tg.start_soon(self._deliver, batch, limiter)

    async def _deliver(self, batch: list[tuple[I, _Slot[R]]], limiter: anyio.Semaphore) -> None:
        try:
            try:
                results = await self._send([item for item, _ in batch])
            except Exception as exc:
                if len(batch) == 1 or self._batch_wide(exc):
                    raise
                log.warning(
                    "%s: a batch of %d items failed (%s); re-sending them one by one so "
                    "only the item at fault gets the error",
                    self.name,
                    len(batch),
                    _describe(exc),
                )
                await self._one_by_one(batch, exc)
            else:
                self._settle(batch, results)
        except BaseException as exc:
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            limiter.release()

    async def _one_by_one(self, batch: list[tuple[I, _Slot[R]]], batch_error: Exception) -> None:
        # In order, one at a time: the items keep their relative order (FIFO of enqueues).
        # A backstop for refusals no predicate knows (a read-only replica, say): when the
        # first items all fail exactly as the batch did, the broker refuses everything,
        # so the rest get that error without a round trip each.
        same_as_batch = 0
        any_sent = False
        for index, (item, slot) in enumerate(batch):
            try:
                (result,) = await self._send([item])
            except Exception as exc:
                slot.error = exc
                slot.done.set()
                if any_sent or _describe(exc) != _describe(batch_error):
                    continue
                same_as_batch += 1
                if same_as_batch >= SAME_FAILURES_BEFORE_GIVING_UP:
                    log.warning(
                        "%s: the first %d items failed alone as the whole batch did (%s): "
                        "failing the other %d without re-sending them",
                        self.name,
                        same_as_batch,
                        _describe(exc),
                        len(batch) - index - 1,
                    )
                    for _, rest in batch[index + 1 :]:
                        rest.error = exc
                        rest.done.set()
                    return
            else:
                any_sent = True
                slot.value = result
                slot.done.set()

    @staticmethod
    def _settle(batch: list[tuple[I, _Slot[R]]], results: Sequence[R]) -> None:
        if len(results) != len(batch):
            raise RuntimeError(f"sent {len(batch)} items but got {len(results)} results")
        for (_, slot), result in zip(batch, results, strict=True):
            slot.value = result
            slot.done.set()

    def _fail(self, batch: list[tuple[I, _Slot[R]]], exc: BaseException) -> None:
        # A cancellation belongs to this task; the submitters get a plain error.
        error = (
            exc
            if isinstance(exc, Exception)
            else NotConnected(f"{self.name} stopped while the item was being sent")
        )
        for _, slot in batch:
            if not slot.done.is_set():
                slot.error = error
                slot.done.set()

    async def submit(self, item: I) -> R:
        """Send ``item`` in the next batch and return its result."""
        if self._sender is None:
            raise NotConnected(f"{self.name} is not running: use `async with app:` first")
        slot: _Slot[R] = _Slot()
        self._sender.send_nowait((item, slot))
        await slot.done.wait()
        if slot.error is not None:
            raise slot.error
        return slot.value  # type: ignore[return-value]  # set together with done

    async def submit_many(self, items: Sequence[I], *, chunk: int | None = None) -> list[R]:
        """Send ``items`` in chunks concurrently (up to ``max_in_flight`` at once).

        The chunks may reach the broker in any order, and the first failing chunk is
        raised without saying what the others did: for enqueues,
        ``Client.enqueue_many`` uses ``Broker.enqueue_batches`` instead (in order, an
        answer per chunk).
        """
        size = chunk or self.max_batch
        chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
        if len(chunks) <= 1:
            return list(await self._send(chunks[0])) if chunks else []
        results: list[Sequence[R] | None] = [None] * len(chunks)
        errors: list[Exception | None] = [None] * len(chunks)
        limiter = anyio.CapacityLimiter(self.max_in_flight)

        async def one(index: int) -> None:
            async with limiter:
                try:
                    results[index] = await self._send(chunks[index])
                except Exception as exc:
                    # Raised below as itself (QueueFull, say), not wrapped in a group.
                    errors[index] = exc

        async with anyio.create_task_group() as tg:
            for index in range(len(chunks)):
                tg.start_soon(one, index)
        for error in errors:
            if error is not None:
                raise error
        return [r for part in results if part is not None for r in part]
