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
a broker in trouble never gets a round trip per item. The callers of a batch re-sent
item by item get their answers together, once the last item has its own.

A caller that stops waiting (cancelled) does not take its item back: it may be in the
broker's hands already, so it is sent with its batch and its answer dropped.

Cost per item is a list append and a wait on its batch's one event: batches wait in a
plain deque, ``max_in_flight`` long-lived sender tasks take them, and a sender that
has nothing to do parks on an event of its own that a new batch sets (issue 13).

With ``inline=True`` a caller that finds nothing in flight and nothing waiting sends the
batch itself, in its own task, after one checkpoint in which the callers of the same
event-loop turn join it (runners woken together finish together): a lone item then
costs no hand-off to a sender and back (two task switches), which is most of a worker's
settle at concurrency 1, and batches stay as large as with the senders. Items that
arrive while it is sent batch up for the senders as usual, and the inline send counts
against ``max_in_flight``. Only for callers that are not cancelled while their batch is
sent (a worker's runners): a cancelled inline sender stops that send, and its batch
mates get the error of a cancelled send (a caller cancelled before the send hands the
batch to the senders instead). With ``max_callers=1`` (a worker of concurrency 1: one
runner) nobody can join, so the inline send skips that checkpoint: one
event-loop turn less per item, the item leaving with no suspension before its own I/O.
The caller still yields to the other tasks once per item: after the send, unless the
send itself suspended (a broker doing real I/O always does; the embedded one never
does, and a worker draining it must not starve the loop).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import types
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Sequence
from typing import Any, Generic, Protocol, TypeVar

import anyio
import anyio.lowlevel
from anyio.abc import TaskStatus

from .errors import BrokerUnavailable, NotConnected, QueueFull, RedisDataLost

__all__ = ["Batcher", "is_batch_wide"]

log = logging.getLogger("typedq.batching")

I = TypeVar("I")  # noqa: E741 -- item
R = TypeVar("R")
T = TypeVar("T")


class _Event(Protocol):
    """What the batcher needs of an event: ``anyio.Event``, or :class:`_LoopEvent` on
    asyncio."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...

    def wait(self) -> Awaitable[object]: ...


class _LoopEvent:
    """An event of one asyncio event loop: each wait is a bare future of that loop.

    ``asyncio.Event`` looks the running loop up on every wait (a ``getpid`` system call
    each time on Linux, the check that the loop was not inherited through a fork) and
    waits in a coroutine of its own; nearly every item waits on its batch's event, so
    that is a cost per item. An event is set once (a batch's answer, a sender's wake),
    so the futures of waiters that went away (cancelled) are simply skipped then.
    """

    __slots__ = ("_is_set", "_loop", "_waiters")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._waiters: list[asyncio.Future[None]] = []
        self._is_set = False

    def set(self) -> None:
        if not self._is_set:
            self._is_set = True
            for waiter in self._waiters:
                if not waiter.done():  # done: its waiter was cancelled
                    waiter.set_result(None)
            self._waiters.clear()

    def is_set(self) -> bool:
        return self._is_set

    def wait(self) -> Awaitable[object]:
        """Awaited until the event is set (at once if it is)."""
        waiter = self._loop.create_future()
        if self._is_set:
            waiter.set_result(None)
        else:
            self._waiters.append(waiter)
        return waiter


class _Batch(Generic[I, R]):
    """Items gathered for one send, and their outcome.

    Callers join the open batch at the tail of the line and wait on its one event (an
    event per batch, not per item); they read their answer by their index in it.
    """

    __slots__ = ("done", "error", "errors", "items", "results")

    def __init__(self, event: Callable[[], _Event] = anyio.Event) -> None:
        self.items: list[I] = []
        self.done = event()
        self.results: Sequence[R] = ()
        #: The error of every item (the whole batch failed), else None.
        self.error: BaseException | None = None
        #: Item by item answers when the batch was re-sent one item at a time: an
        #: item's error, or None when ``results`` holds its value.
        self.errors: list[BaseException | None] | None = None

    def answer(self, index: int) -> R:
        if self.error is not None:
            raise self.error
        if self.errors is not None and (error := self.errors[index]) is not None:
            raise error
        return self.results[index]


#: Re-sending a failed batch item by item stops when this many first items fail exactly
#: as the batch did (and none succeeded): the broker refuses everything, not one item.
SAME_FAILURES_BEFORE_GIVING_UP = 3


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # an exception whose __str__ raises still gets a description
        return f"{type(exc).__name__} (unprintable)"


@types.coroutine
def _noting_suspension(coro: Coroutine[Any, Any, T], note: list[None]) -> Generator[Any, Any, T]:
    """Await ``coro`` in the current task, appending to ``note`` each time it suspends
    (yields to the event loop). What the loop sends or throws in is passed on unchanged
    (cancellation included), as in a plain await."""
    send, throw = coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is None:
                yielded = send(value)
            else:
                thrown, error = error, None
                yielded = throw(thrown)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]  # the coroutine's T
        note.append(None)
        try:
            value = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            error = exc


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
    :param inline: a caller that finds nothing in flight sends its item itself (see the
        module's docstring); for callers that are not cancelled mid-send
    :param max_callers: how many tasks may ever submit (None: any number); with 1 an
        inline send does not wait a turn for batch mates (there can be none)
    """

    def __init__(
        self,
        send: Callable[[list[I]], Awaitable[Sequence[R]]],
        *,
        max_batch: int = 500,
        max_in_flight: int = 4,
        name: str = "batcher",
        batch_wide: Callable[[Exception], bool] = is_batch_wide,
        inline: bool = False,
        max_callers: int | None = None,
    ) -> None:
        self._send = send
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.name = name
        self._batch_wide = batch_wide
        self._running = False
        # Batches not yet sent, oldest first; only the last one is open to new items.
        # (A deque and events rather than an anyio memory stream, an event per item and
        # a task per batch: a blocked stream receive costs several times more.) A
        # sender with nothing to do parks on its own event in ``_idle``; a new batch
        # wakes one of them, so a lone item is sent at once, and a busy sender takes the
        # next batch when its send returns.
        self._pending: deque[_Batch[I, R]] = deque()
        self._idle: deque[_Event] = deque()
        self._inline = inline
        #: Whether an inline send waits one checkpoint for callers of the same turn
        #: (else it yields after its send if the send did not).
        self._gather = max_callers is None or max_callers > 1
        #: Makes the batches' events: the running event loop's own class, set by run()
        #: (``anyio.Event()`` finds the backend anew on every call).
        self._event: Callable[[], _Event] = anyio.Event
        #: Batches being sent by their own caller (``inline``), at most one at a time,
        #: and that batch while it is still open to callers of the same turn.
        self._inline_busy = 0
        self._gathering: _Batch[I, R] | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Flush submitted items until cancelled. Runs in its owner's task group."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend (trio)
            self._event = type(anyio.Event())
        else:
            # On asyncio bare futures of the loop (_LoopEvent): anyio's event wraps an
            # asyncio.Event, one more coroutine per waiting caller (nearly every item
            # waits). A batch is never set before its callers wait, so anyio's extra
            # checkpoint on a set event is never missed.
            self._event = functools.partial(_LoopEvent, loop)
        try:
            async with anyio.create_task_group() as tg:
                for _ in range(self.max_in_flight):
                    tg.start_soon(self._sender)
                self._running = True
                task_status.started()
        finally:
            self._running = False
            self._idle.clear()
            # Anything still queued will never be sent: fail it instead of hanging.
            while self._pending:
                batch = self._pending.popleft()
                batch.error = NotConnected(f"{self.name} closed before the item was sent")
                batch.done.set()

    async def _sender(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                wake = self._event()
                self._idle.append(wake)
                try:
                    await wake.wait()
                finally:
                    if not wake.is_set():  # cancelled while parked
                        self._idle.remove(wake)
                continue
            # Taken and sent with no await in between: a batch is either still in
            # ``_pending`` (failed by run() on stop) or being delivered (failed here).
            batch = pending.popleft()
            if pending:
                self._wake_sender()  # more work than this sender: wake another
            await self._deliver(batch)

    async def _deliver(self, batch: _Batch[I, R]) -> None:
        try:
            try:
                results = await self._send(batch.items)
            except Exception as exc:
                if len(batch.items) == 1 or self._batch_wide(exc):
                    raise
                log.warning(
                    "%s: a batch of %d items failed (%s); re-sending them one by one so "
                    "only the item at fault gets the error",
                    self.name,
                    len(batch.items),
                    _describe(exc),
                )
                await self._one_by_one(batch, exc)
            else:
                if len(results) != len(batch.items):
                    raise RuntimeError(
                        f"sent {len(batch.items)} items but got {len(results)} results"
                    )
                batch.results = results
        except BaseException as exc:
            self._fail(batch, exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            batch.done.set()

    async def _one_by_one(self, batch: _Batch[I, R], batch_error: Exception) -> None:
        # In order, one at a time: the items keep their relative order (FIFO of enqueues).
        # A backstop for refusals no predicate knows (a read-only replica, say): when the
        # first items all fail exactly as the batch did, the broker refuses everything,
        # so the rest get that error without a round trip each. The callers are answered
        # together when the last item is done (one event per batch).
        items = batch.items
        results: list[R | None] = [None] * len(items)
        errors: list[BaseException | None] = [None] * len(items)
        batch.results = results  # type: ignore[assignment]  # None only where errors say so
        batch.errors = errors
        same_as_batch = 0
        any_sent = False
        index = 0
        try:
            for index, item in enumerate(items):
                try:
                    (result,) = await self._send([item])
                except Exception as exc:
                    errors[index] = exc
                    if any_sent or _describe(exc) != _describe(batch_error):
                        continue
                    same_as_batch += 1
                    if same_as_batch >= SAME_FAILURES_BEFORE_GIVING_UP:
                        log.warning(
                            "%s: the first %d items failed alone as the whole batch did "
                            "(%s): failing the other %d without re-sending them",
                            self.name,
                            same_as_batch,
                            _describe(exc),
                            len(items) - index - 1,
                        )
                        errors[index + 1 :] = [exc] * (len(items) - index - 1)
                        return
                else:
                    any_sent = True
                    results[index] = result
        except BaseException as exc:
            # Stopped half-way: the items answered keep their answer, the rest fail.
            errors[index:] = [self._stop_error(exc)] * (len(items) - index)
            raise

    def _stop_error(self, exc: BaseException) -> BaseException:
        # A cancellation belongs to this task; the submitters get a plain error.
        if isinstance(exc, Exception):
            return exc
        return NotConnected(f"{self.name} stopped while the item was being sent")

    def _fail(self, batch: _Batch[I, R], exc: BaseException) -> None:
        if batch.errors is None:  # else _one_by_one answered each item itself
            batch.error = self._stop_error(exc)

    def _wake_sender(self) -> None:
        """Wake a parked sender for a waiting batch, unless that would put more than
        ``max_in_flight`` batches in flight (an inline send counts; a busy sender takes
        the batch when its send returns)."""
        if len(self._idle) > self._inline_busy:
            self._idle.popleft().set()

    async def submit(self, item: I) -> R:
        """Send ``item`` in the next batch and return its result."""
        if not self._running:
            raise NotConnected(f"{self.name} is not running: use `async with app:` first")
        pending = self._pending
        gathering = self._gathering
        if gathering is not None and len(items := gathering.items) < self.max_batch:
            open_batch = gathering  # an inline batch still open: go with it
            index = len(items)
            items.append(item)
        elif pending and len(items := pending[-1].items) < self.max_batch:
            open_batch = pending[-1]
            index = len(items)
            items.append(item)
        elif (
            self._inline
            and not pending
            and not self._inline_busy
            and len(self._idle) == self.max_in_flight
        ):
            # Nothing in flight, nothing waiting: send it from here, no hand-off.
            return await self._send_inline(item)
        else:  # a new batch: wake a parked sender, if any (else a busy one takes it next)
            open_batch = _Batch(self._event)
            open_batch.items.append(item)
            index = 0
            pending.append(open_batch)
            self._wake_sender()
        await open_batch.done.wait()
        if open_batch.error is None and open_batch.errors is None:
            return open_batch.results[index]  # answer(), inline: this runs per item
        return open_batch.answer(index)

    async def _send_inline(self, item: I) -> R:
        batch: _Batch[I, R] = _Batch(self._event)
        batch.items.append(item)
        self._inline_busy += 1
        turned: list[None] | None = None
        if self._gather:
            self._gathering = batch
            try:
                # Callers of this same turn (runners woken together) join the batch.
                await anyio.lowlevel.checkpoint()
            except BaseException:
                # Cancelled before sending: the senders take the batch (its other callers
                # still get their answers; this one's item goes with it, answer dropped).
                self._gathering = None
                self._inline_busy -= 1
                if self._running:
                    self._pending.appendleft(batch)
                    self._wake_sender()
                else:
                    batch.error = NotConnected(f"{self.name} closed before the item was sent")
                    batch.done.set()
                raise
            self._gathering = None
        try:
            if self._gather:
                await self._deliver(batch)
            else:
                # The only caller there can be: no batch mates to wait for. Noted: whether
                # the send suspended (let the loop turn).
                turned = []
                await _noting_suspension(self._deliver(batch), turned)
        finally:
            self._inline_busy -= 1
            if self._pending:
                # Batches formed meanwhile may have waited for this slot of max_in_flight.
                self._wake_sender()
        if turned is not None and not turned:
            # The send never suspended: let the other tasks run once before the caller
            # goes on (as the checkpoint before the send would have).
            await anyio.lowlevel.checkpoint()
        return batch.answer(0)

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
