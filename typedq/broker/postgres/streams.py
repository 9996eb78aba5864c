"""The PostgreSQL broker's capabilities EventStreams (typedq.events) and JobStreams
(typedq.streams), mixed into PostgresBroker; the tables and functions are migration 5's.

Events are written by the schema (a deferred trigger on a job's move to a final state, in
that move's transaction; only for a queue whose stream is on), numbered per queue in
commit order and trimmed near ``settings.events_max``. Job streams are one function call
per ``append_streams`` (every append of the batch fenced by its token, in one
transaction), keeping about :data:`~typedq.broker.streams.STREAM_MAX` entries per stream
and expiring ``ttl`` after the last append (the reaper's pass sweeps the expired ones).

Reads that find nothing wait on the broker's listener (no connection per reader, no
polling): ``e:<ns>:<queue>`` is notified by a commit that wrote events of the queue,
``s:<ns>:<job id>`` by an append to the job's stream. A waiter is registered before its
read, so an entry committed between the read and the wait still wakes it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import anyio

from ...names import check_name
from ..messages import EventRead, QueueEvent
from ..records import broker_failure
from ..streams import READER_TTL, STREAM_MAX, StreamAppend, StreamEntry
from .core import PostgresCore
from .rows import STATES, encode

__all__ = ["StreamOps"]

#: Seconds of a reader's registration that must be left beyond a read's wait, else the
#: read refreshes it first (as on Redis: about one write every 5 s of a reader's reads).
REFRESH_MARGIN = READER_TTL / 2
#: Registrations this broker remembers before it forgets the ones already ended.
_HELD_MAX = 1024
#: Expired streams (and ended readers) one reaper's pass deletes at most.
_SWEEP = 1000


class StreamOps(PostgresCore):
    """Event streams and job streams of the PostgreSQL broker."""

    #: Readers waiting for a queue's next event, by queue (woken by ``e:``).
    _event_waiters: dict[str, set[anyio.Event]]
    #: Readers waiting for a job stream's next entry, by job id (woken by ``s:``).
    _stream_waiters: dict[str, set[anyio.Event]]
    #: (job id, reader) -> until when (monotonic) its row in ``stream_readers`` holds.
    _reader_until: dict[tuple[str, str], float]

    # -- event streams -----------------------------------------------------------------

    async def enable_events(self, queue: str) -> int:
        last = await self._fetchval(
            "enable_events",
            self._sql["enable_events"],
            self.ns,
            check_name("queue", queue),
            max(1, int(self.settings.events_max)),
        )
        return int(last)

    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead:
        check_name("queue", queue)
        limit = max(1, limit)
        rows = await self._wait_rows(
            self._event_waiters,
            queue,
            timeout,
            "read_events",
            self._sql["read_events"],
            self.ns,
            queue,
            after,
            limit,
        )
        events = [_event_of(row) for row in rows]
        missed = events[0].seq - after - 1 if events and events[0].seq > after + 1 else 0
        return EventRead(events=events, missed=missed)

    # -- job streams -------------------------------------------------------------------

    async def append_streams(self, appends: Sequence[StreamAppend]) -> list[bool]:
        if not appends:
            self._check()
            return []
        # In job id order (a job's appends keep theirs): each append locks its stream's
        # row until the call commits, so two batches never wait on each other in a cycle.
        order = sorted(range(len(appends)), key=lambda i: appends[i].job_id)
        appends = [appends[i] for i in order]
        items: list[bytes] = []
        for a in appends:
            items.extend(a.items)
        taken = await self._fetchval(
            "append_streams",
            self._sql["append_streams"],
            self.ns,
            [a.job_id for a in appends],
            [a.token for a in appends],
            [a.attempt for a in appends],
            [a.seq for a in appends],
            [a.fresh for a in appends],
            [a.end for a in appends],
            [a.ttl for a in appends],
            [len(a.items) for a in appends],
            items,
            STREAM_MAX,
            self.channel,
        )
        answers = [False] * len(order)
        for i, t in zip(order, taken, strict=True):
            answers[i] = bool(t)
        return answers

    async def read_stream(
        self,
        job_id: str,
        *,
        queue: str,
        after: str,
        timeout: float,
        limit: int = 1000,
        reader: str = "",
    ) -> list[StreamEntry]:
        check_name("queue", queue)
        at = int(after) if after else 0
        if reader:
            await self._join_readers(job_id, reader, max(0.0, timeout))
        rows = await self._wait_rows(
            self._stream_waiters,
            job_id,
            timeout,
            "read_stream",
            self._sql["read_stream"],
            self.ns,
            job_id,
            at,
            max(1, limit),
        )
        return [
            StreamEntry(
                position=str(row[0]),
                attempt=row[1],
                seq=row[2],
                data=row[3],
                end=None if row[4] is None else STATES[row[4]],
            )
            for row in rows
        ]

    async def _join_readers(self, job_id: str, reader: str, wait: float) -> None:
        """Count ``reader`` among the stream's readers for the read about to wait
        ``wait`` seconds: one write when its row would end within the read plus
        :data:`REFRESH_MARGIN` (so once every few seconds of a reader's reads, never
        per entry read); else nothing."""
        now = time.monotonic()
        held = self._reader_until.get((job_id, reader))
        if held is not None and held >= now + wait + REFRESH_MARGIN:
            return
        ttl = wait + READER_TTL
        await self._fetch("read_stream", self._sql["join_stream"], self.ns, job_id, reader, ttl)
        held_map = self._reader_until
        if len(held_map) >= _HELD_MAX:
            for gone in [k for k, t in held_map.items() if t < now]:
                del held_map[gone]
        held_map[(job_id, reader)] = now + ttl

    async def leave_stream(self, job_id: str, *, queue: str, reader: str) -> None:
        check_name("queue", queue)
        self._reader_until.pop((job_id, reader), None)
        await self._fetch("leave_stream", self._sql["leave_stream"], self.ns, job_id, reader)

    async def _sweep_streams(self) -> None:
        """The reaper's pass: delete expired streams and the readers whose time passed."""
        await self._fetch("sweep_streams", self._sql["sweep_streams"], self.ns, _SWEEP)

    # -- waiting -----------------------------------------------------------------------

    async def _wait_rows(
        self,
        waiters: dict[str, set[anyio.Event]],
        key: str,
        timeout: float,
        op: str,
        sql: str,
        *args: Any,
    ) -> list[Any]:
        """``sql``'s rows; none yet: wait up to ``timeout`` for ``key``'s notification,
        then read again. The waiter is in place before the first read."""
        self._check()
        event = anyio.Event()
        held = waiters.setdefault(key, set())
        held.add(event)
        try:
            rows = await self._fetch(op, sql, *args, read=True)
            if rows or timeout <= 0:
                return rows
            with anyio.move_on_after(timeout):
                await event.wait()
            return await self._fetch(op, sql, *args, read=True)
        finally:
            held.discard(event)
            if not held and waiters.get(key) is held:
                del waiters[key]


def _event_of(row: Any) -> QueueEvent:
    """An ``events`` row as the seam's event; a failure record the broker wrote itself
    (a cancel, a stall) is encoded from its parts, as ``rows.record_of`` does."""
    data: bytes | None = row["data"]
    kind: str | None = row["br_kind"]
    if kind is not None:
        data = encode(
            broker_failure(
                "stalled" if kind == "stalled" else "cancelled",
                row["br_message"],
                attempt=row["attempt"],
                failed_at=row["finished_at"],
                worker_id=None if kind == "cancelled" else row["worker_id"],
            )
        )
    return QueueEvent(
        seq=row["seq"],
        id=row["id"],
        task=row["task"],
        state=STATES[row["state"]],
        data=data or b"",
        attempt=row["attempt"],
    )
