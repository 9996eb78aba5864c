"""Typed streams from a task: ``@app.task(emits=Token)``, ``await ctx.emit(Token(...))`` in
the handler, ``async for token in job.stream()`` at the producer (docs/streams.md).

Two halves:

- :class:`Emitter` (worker side, one per run of an emitting task): ``ctx.emit`` encodes
  the item and puts it in a buffer; a flush loop sends the buffer as one
  ``append_streams`` call whenever it is idle, so every emit made while the previous
  batch was on its way goes in the next one (a handler emitting in a tight loop sends a
  batch per round trip, not per item). Back-pressure: ``emit`` waits while
  :data:`BUFFER_MAX` items are unsent. The rest is flushed when the handler returns or
  raises, *before* the attempt settles; once the job is final, the worker writes the
  stream's end entry.
- :class:`JobStream` (producer side, ``job.stream()``): reads the stream in order and
  ends at the end entry, or, without one (a worker died, a job cancelled before it
  ran), when a read that found nothing is followed by a look at the job that finds it
  final, then a last read (the items of a run are all stored before its job can be
  final, so that read misses none).

A stream holds the items of the job's *current run* (attempt): a retried job's new run
starts it again. A reader that was in the middle of the previous run gets
:class:`~typedq.errors.StreamRestarted` once, then the new run's items from its first;
a reader that fell more than :data:`~typedq.broker.streams.STREAM_MAX` items behind
gets :class:`~typedq.errors.StreamTruncated` (how many it missed), then the oldest item
still kept. Both leave the iterator usable: iterate it again to go on.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections import deque
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Generic

import anyio
import anyio.abc
import msgspec
import pydantic
from typing_extensions import TypeVar

from .broker.messages import JobState
from .broker.streams import StreamAppend, StreamEntry
from .errors import (
    BrokerUnavailable,
    JobNotFound,
    StreamRestarted,
    StreamTruncated,
)

if TYPE_CHECKING:
    from .broker.base import Broker
    from .broker.messages import ClaimedJob
    from .clock import Clock
    from .job import Job
    from .serde import Codec

__all__ = ["BUFFER_MAX", "Emitter", "JobStream", "LocalEmitter"]

log = logging.getLogger("typedq.streams")

T_co = TypeVar("T_co", bound=msgspec.Struct | pydantic.BaseModel, covariant=True)

#: Unsent items an emitting run may have before ``ctx.emit`` waits (back-pressure).
BUFFER_MAX = 5_000
#: Seconds between two looks at a streamed job's state while its stream is quiet.
POLL = 2.0
#: Entries one read asks for.
READ_LIMIT = 1_000
_FINAL = frozenset((JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED))
#: Backoff between re-sends of a batch the broker could not take (seconds).
_RESEND = (0.05, 1.0)


def check_item(codec: Codec[Any], item: object, task: str) -> None:
    """Raise TypeError unless ``item`` is an instance of the task's ``emits`` model."""
    if not isinstance(item, codec.type):
        raise TypeError(
            f"task {task!r} emits {codec.type.__qualname__}, not {type(item).__qualname__}: "
            f"emit {codec.type.__qualname__}(...) instances, or change @app.task(emits=...)"
        )


class LocalEmitter:
    """The emitter of a handler called directly (``await task(payload)``, no worker):
    it checks and keeps the items in :attr:`items`, for unit tests."""

    def __init__(self, codec: Codec[Any], task: str) -> None:
        self._codec = codec
        self._task = task
        #: The items emitted so far, in order.
        self.items: list[Any] = []

    async def emit(self, item: Any) -> None:
        check_item(self._codec, item, self._task)
        self._codec.encode(item)  # what a worker would send must encode
        self.items.append(item)


class Emitter:
    """The emits of one run of an emitting task (see the module).

    :param broker: where the stream is
    :param claimed: the run's claim (its token fences every append)
    :param codec: the task's ``emits`` model
    :param clock: the worker's clock (re-send backoff)
    :param buffer_max: unsent items before ``emit`` waits
    """

    def __init__(
        self,
        broker: Broker,
        claimed: ClaimedJob,
        codec: Codec[Any],
        clock: Clock,
        *,
        buffer_max: int = BUFFER_MAX,
    ) -> None:
        self._broker = broker
        self._claimed = claimed
        self._codec = codec
        self._clock = clock
        self._max = max(1, buffer_max)
        self._buffer: list[bytes] = []
        self._wake = anyio.Event()
        self._room: anyio.Event | None = None
        self._lock = anyio.Lock()
        #: The number (in the run) of the next item sent.
        self.sent = 0
        self._fresh = True
        #: The broker refused an append: this run no longer holds the job (its lease
        #: was lost); later items are dropped.
        self.refused = False
        #: The attempt is over: later items (a sync handler's thread that runs on after
        #: its timeout) are dropped, never waited for.
        self.closed = False
        #: Why a batch could not be stored (not an outage of the broker, which is
        #: retried): the next ``emit`` raises it.
        self.error: Exception | None = None

    async def emit(self, item: Any) -> None:
        """Queue ``item`` for the stream; waits only while the buffer is full.

        :raises BrokerError: the broker could not store an earlier batch (or another
            error that stopped the flush loop)
        """
        check_item(self._codec, item, self._claimed.message.task)
        data = self._codec.encode(item)
        while len(self._buffer) >= self._max and self._open():
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()
        if self.error is not None:
            raise self.error
        if not self._open():
            return
        self._buffer.append(data)
        self._wake.set()

    def _open(self) -> bool:
        return not (self.refused or self.closed or self.error is not None)

    def _make_room(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    def close(self) -> None:
        """The attempt is over: drop later items, wake an ``emit`` waiting for room."""
        self.closed = True
        self._make_room()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """The flush loop: send what the buffer holds whenever it holds something."""
        task_status.started()
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self.flush()
            except Exception as exc:
                # Kept for the handler: its next emit (or the final flush) raises it.
                self.error = exc
                self._make_room()
                return

    async def flush(self) -> None:
        """Send every buffered item (in order with a batch already on its way).

        :raises BrokerError: the broker could not store a batch (now or before)
        """
        async with self._lock:
            if self.error is not None:
                raise self.error
            while self._buffer:
                batch, self._buffer = self._buffer, []
                self._make_room()
                await self._send(batch, end=False, ttl=None)

    async def end(self, ttl: float) -> bool:
        """Write the end entry (the job is final by this run); the stream then expires
        after ``ttl`` seconds. False: the broker refused (not final by this run)."""
        async with self._lock:
            return await self._send([], end=True, ttl=ttl)

    async def _send(self, items: list[bytes], *, end: bool, ttl: float | None) -> bool:
        if self.refused:
            return False
        claimed = self._claimed
        append = StreamAppend(
            job_id=claimed.message.id,
            queue=claimed.message.queue,
            token=claimed.token,
            attempt=claimed.attempt,
            seq=self.sent,
            items=items,
            fresh=self._fresh,
            end=end,
        )
        if ttl is not None:
            append = msgspec.structs.replace(append, ttl=ttl)
        delay = _RESEND[0]
        while True:
            try:
                (ok,) = await self._broker.append_streams([append])
                break
            except BrokerUnavailable as exc:
                if end:
                    raise
                # The run goes on (its lease is renewed meanwhile); emits wait once the
                # buffer is full. Re-sending is safe: a batch is stored whole or not at
                # all (one script call), with the same numbers.
                if delay == _RESEND[0]:
                    log.warning(
                        "job %s (%s): could not append to its stream (%s); retrying",
                        claimed.message.id,
                        claimed.message.task,
                        exc,
                    )
                await self._clock.sleep(delay)
                delay = min(_RESEND[1], delay * 2)
        if not ok:
            if not end:
                self.refused = True
                self._buffer.clear()
                self._make_room()
            return False
        self.sent += len(items)
        self._fresh = False
        return True


class JobStream(AsyncIterator[T_co], Generic[T_co]):
    """The items a job emits, in order (``job.stream()``); see the module.

    :ivar attempt: the attempt whose items it reads (None before the first entry)
    """

    def __init__(self, job: Job[Any], codec: Codec[T_co], *, poll: float = POLL) -> None:
        self._job = job
        self._codec = codec
        self._poll = poll
        self._queue = job.queue
        self._position = ""
        self._pending: deque[StreamEntry] = deque()
        self._expect = 0
        self._looked = False
        self._final = False
        self._done = False
        #: This reader's id among the stream's readers (``flow_keys`` counts them), and
        #: whether the broker may count it now (it read, and has not left).
        self._reader = secrets.token_hex(8)
        self._joined = False
        self.attempt: int | None = None

    def __aiter__(self) -> JobStream[T_co]:
        return self

    async def aclose(self) -> None:
        """Stop reading: the stream no longer counts this reader (``typedq inspect
        --streams``), and iterating it again ends at once. A reader that stops early
        (``break``) calls it, e.g. with ``contextlib.aclosing(job.stream())``; one that
        does not drops out of the count a few seconds later
        (:data:`~typedq.broker.streams.READER_TTL`)."""
        self._done = True
        self._pending.clear()
        await self._leave()

    async def _leave(self) -> None:
        if not self._joined or self._queue is None:
            return
        self._joined = False
        # The count is only a view: a broker that cannot be told now forgets the reader
        # when its registration's time passes.
        with contextlib.suppress(Exception):
            await self._job._client.broker.leave_stream(
                self._job.id, queue=self._queue, reader=self._reader
            )

    async def __anext__(self) -> T_co:
        while True:
            if self._done:
                await self._leave()
                raise StopAsyncIteration
            if not self._pending:
                await self._fill()
                continue
            entry = self._pending[0]
            if self.attempt is not None and (
                entry.attempt != self.attempt or entry.seq < self._expect
            ):
                restarted = self._expect > 0
                self.attempt, self._expect = entry.attempt, 0
                if restarted:
                    raise StreamRestarted(self._job.id, self._job.task, entry.attempt)
            self.attempt = entry.attempt
            if entry.seq > self._expect:
                missed = entry.seq - self._expect
                self._expect = entry.seq
                raise StreamTruncated(self._job.id, self._job.task, missed)
            self._pending.popleft()
            self._expect = entry.seq + 1
            if entry.end is not None:
                self._done = True
                continue
            return self._codec.decode(entry.data)

    async def _fill(self) -> None:
        """Read the next entries; end the stream when there are none and the job is final."""
        broker = self._job._client.broker
        if self._queue is None:
            self._queue = (await self._job._record()).message.queue
        # The first read and the reads after the job was seen final do not wait.
        wait = 0.0 if not self._looked or self._final else self._poll
        self._joined = True
        entries = await broker.read_stream(
            self._job.id,
            queue=self._queue,
            after=self._position,
            timeout=wait,
            limit=READ_LIMIT,
            reader=self._reader,
        )
        if entries:
            self._pending.extend(entries)
            self._position = entries[-1].position
            return
        if self._final:
            self._done = True  # final, and nothing after the last read: the end
            return
        self._looked = True
        try:
            state = await self._job.status()
        except JobNotFound:
            if self.attempt is None:
                await self._leave()
                raise
            self._done = True  # read, then removed or trimmed: nothing more will come
            return
        # Final: every item of its last run was stored before it became final, so one
        # more read (next round) finds any that came since the read above.
        self._final = state in _FINAL
