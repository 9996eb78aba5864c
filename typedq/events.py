"""Completion events a program can follow, typed by the task.

::

    async for event in app.events(send_invoice):
        match event:
            case CompletedEvent(job_id=job_id, result=receipt):  # receipt: Receipt
                ...
            case FailedEvent(record=record):  # record: FailureRecord | None
                ...
            case EventGap(missed=n):  # fell behind the cap
                ...

Each queue has one event stream on the broker: every job of the queue that reaches a
final state (completed, failed, cancelled) adds an event, written atomically with that
transition (inside the completion/failure scripts on Redis). The stream is capped near
``App(events_max=...)`` events (Redis ``XADD MAXLEN ~``; a ring on the embedded broker),
so it stays bounded whether anyone reads it or not. :meth:`EventStream` reads the
task's queue and keeps the events of its task.

A stream is off until it is turned on: by the first ``app.events(...)`` of any program
on that queue, or by workers of an ``App(event_streams=True)`` at start-up. Off, a
transition pays one lookup per queue per broker call.

Position: from now (the events after the subscription) by default; ``replay=True``
starts at the oldest event the stream still holds; ``after=event.seq`` resumes after
an event seen before. A reader that falls more than the cap behind gets an
:class:`EventGap` saying how many events it missed, then goes on with the oldest still
held: never silence. Waiting is never polling: Redis ``XREAD BLOCK``, an anyio event
on the embedded broker.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Self, TypeAlias

from .broker.base import JobState
from .errors import FailureRecord
from .job import decode_failure
from .task import TaskBase, TOut

if TYPE_CHECKING:
    from types import TracebackType

    from .client import Client

__all__ = ["CompletedEvent", "Event", "EventGap", "EventStream", "FailedEvent"]

#: Seconds one broker read waits for an event before it waits again.
_WAIT = 4.0


@dataclass(frozen=True, slots=True)
class CompletedEvent(Generic[TOut]):
    """A job of the task completed.

    :ivar seq: the event's number in its queue's stream (``after=`` resumes after it)
    :ivar job_id: the job's id
    :ivar task: the task's name
    :ivar result: the handler's result, decoded as the task's output type
    :ivar attempt: the attempt that completed it
    """

    seq: int
    job_id: str
    task: str
    result: TOut
    attempt: int


@dataclass(frozen=True, slots=True)
class FailedEvent:
    """A job of the task failed for good, or was cancelled (``cancelled``).

    :ivar seq: the event's number in its queue's stream
    :ivar job_id: the job's id
    :ivar task: the task's name
    :ivar record: the structured failure (None for a job cancelled with no record)
    :ivar cancelled: the job ended cancelled rather than failed
    :ivar attempt: the attempt that ended it (0: it never ran)
    """

    seq: int
    job_id: str
    task: str
    record: FailureRecord | None
    cancelled: bool
    attempt: int


@dataclass(frozen=True, slots=True)
class EventGap:
    """The reader fell behind the stream's cap: ``missed`` events (of any task of the
    queue) after ``after`` are gone; the next events are the oldest still held."""

    after: int
    missed: int


#: What ``app.events(task)`` yields for a ``Task[..., TOut]``.
Event: TypeAlias = CompletedEvent[TOut] | FailedEvent | EventGap


class EventStream(Generic[TOut]):
    """The events of one task, as an async iterator (made by ``app.events(task)``).

    The position is fixed when the stream starts: ``async with app.events(t) as
    events:`` (then nothing that completes inside the block is missed), or the first
    ``async for`` step.

    :param client: a connected client of the task's app
    :param task: the task whose events to yield
    :param after: resume after this event number (``event.seq``)
    :param replay: start at the oldest event still held
    :param batch: the most events one broker read returns
    """

    def __init__(
        self,
        client: Client,
        task: TaskBase[Any, TOut],
        *,
        after: int | None = None,
        replay: bool = False,
        batch: int = 500,
    ) -> None:
        self.client = client
        self.task = task
        self.queue = task.queue
        self._after = after
        self._replay = replay and after is None
        self._batch = batch
        self._position: int | None = None
        self._pending: deque[CompletedEvent[TOut] | FailedEvent | EventGap] = deque()

    def __repr__(self) -> str:
        return f"EventStream({self.task.name!r}, queue={self.queue!r}, at={self._position})"

    @property
    def position(self) -> int | None:
        """The number of the last event read (None before the stream started)."""
        return self._position

    async def start(self) -> Self:
        """Fix the position (turning the queue's stream on); later calls do nothing."""
        if self._position is None:
            last = await self.client.broker.enable_events(self.queue)
            self._position = self._after if self._after is not None else 0 if self._replay else last
        return self

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> CompletedEvent[TOut] | FailedEvent | EventGap:
        await self.start()
        while not self._pending:
            await self._read()
        return self._pending.popleft()

    async def _read(self) -> None:
        position = self._position
        assert position is not None
        read = await self.client.broker.read_events(
            self.queue, position, timeout=_WAIT, limit=self._batch
        )
        if read.missed and not self._replay:
            self._pending.append(EventGap(after=position, missed=read.missed))
        if read.events:
            self._replay = False  # only the first read of a replay may start past 0
        name = self.task.name
        for event in read.events:
            self._position = event.seq
            if event.task != name:
                continue
            if event.state is JobState.COMPLETED:
                self._pending.append(
                    CompletedEvent(
                        seq=event.seq,
                        job_id=event.id,
                        task=name,
                        result=self.task.output.decode(event.data),
                        attempt=event.attempt,
                    )
                )
            else:
                self._pending.append(
                    FailedEvent(
                        seq=event.seq,
                        job_id=event.id,
                        task=name,
                        record=decode_failure(event.data, event.id) if event.data else None,
                        cancelled=event.state is JobState.CANCELLED,
                        attempt=event.attempt,
                    )
                )
