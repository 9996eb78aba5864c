"""The PostgreSQL broker's producer side and reads, mixed into PostgresBroker: enqueue
(also within the caller's transaction, :mod:`.within`), cancel, the job records, waiting
for a job's end, counts, queue stats, and the listings (offsets and keyset cursors)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import anyio
from anyio.abc import TaskStatus

from ...errors import InvalidOption
from ...options import check_numbers
from ..base import (
    CancelOutcome,
    EnqueueOutcome,
    JobList,
    JobMessage,
    JobRecord,
    JobState,
    QueueStats,
)
from ..records import cancelled_while
from .core import PostgresCore
from .rows import CANCEL, CODE, STATES, page_cursor, record_of
from .statements import page_args
from .within import enqueue_within, within_error

__all__ = ["JobStore"]


class JobStore(PostgresCore):
    """Enqueue, cancel and the reads of the PostgreSQL broker."""

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        self._check()
        args = self._enqueue_args(messages)
        if not messages:
            return []
        await self._register_queues(args[2])
        created = await self._fetchval("enqueue", self._sql["enqueue_waking"], *args, cap=args[7])
        return [EnqueueOutcome(m.id, bool(c)) for m, c in zip(messages, created, strict=True)]

    async def enqueue_batches(
        self, batches: Sequence[Sequence[JobMessage]]
    ) -> list[list[EnqueueOutcome] | Exception]:
        # Every batch's numbers are checked before any is stored: an envelope out of
        # range is the caller's mistake, refused whole (as on the other brokers).
        for batch in batches:
            check_numbers(batch)
        return await super().enqueue_batches(batches)

    async def enqueue_within(
        self, conn: object, messages: Sequence[JobMessage]
    ) -> list[EnqueueOutcome]:
        """Store ``messages`` in the transaction open on ``conn`` (see
        :mod:`typedq.broker.postgres.within`): they exist if and only if it commits."""
        self._check()
        args = self._enqueue_args(messages)
        if not messages:
            return []
        await self._register_queues(args[2])
        try:
            created = await enqueue_within(conn, self.target.schema, self._sql["enqueue"], args)
        except InvalidOption:
            raise
        except Exception as exc:
            raise within_error(exc, self.target.safe, args[7]) from exc
        return [EnqueueOutcome(m.id, c) for m, c in zip(messages, created, strict=True)]

    async def get(self, ids: Sequence[str], *, queue: str | None = None) -> list[JobRecord | None]:
        if not ids:
            self._check()
            return []
        rows = await self._fetch("get", self._sql["get"], self.ns, list(ids), read=True)
        found = {row["id"]: record_of(row) for row in rows}
        return [found.get(i) for i in ids]

    async def wait_finished(
        self,
        job_id: str,
        timeout: float | None,
        *,
        queue: str | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> JobRecord | None:
        self._check()
        deadline = None if timeout is None else anyio.current_time() + timeout
        started = False
        while True:
            event = anyio.Event()
            self._finished.setdefault(job_id, set()).add(event)
            try:
                if not started:
                    task_status.started()
                    started = True
                    # Marked before the first read: the job's end is notified from now
                    # on (migration 17 notifies only watched jobs).
                    # (Idempotent: sent again after a lost connection, as a read.)
                    await self._fetch("watch", self._sql["watch"], self.ns, job_id, read=True)
                (record,) = await self.get([job_id], queue=queue)
                if record is None or record.state.is_final:
                    return record
                left = math.inf if deadline is None else deadline - anyio.current_time()
                if left <= 0:
                    return None
                with anyio.move_on_after(left):
                    await event.wait()
                if self._pool is None:
                    return None
            finally:
                events = self._finished.get(job_id)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._finished[job_id]

    async def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        ttls, caps = self._final_bounds()
        code, pending = await self._fetchval(
            "cancel",
            self._sql["cancel"],
            self.ns,
            job_id,
            cancelled_while("waiting"),
            cancelled_while("scheduled"),
            ttls[1],
            caps[1],
            self.channel,
        )
        if pending:
            await self._finish_flows()
        return CANCEL[int(code)]

    async def counts(self, queue: str) -> dict[JobState, int]:
        rows = await self._fetch("counts", self._sql["counts"], self.ns, queue, read=True)
        counts = dict.fromkeys(JobState, 0)
        for state, n in rows:
            counts[STATES[state]] = n
        return counts

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        rows = await self._fetch(
            "queue_stats", self._sql["stats"], self.ns, list(queues), read=True
        )
        counts = {q: dict.fromkeys(JobState, 0) for q in queues}
        oldest: dict[str, float] = {}
        trimmed: dict[str, dict[JobState, int]] = {q: {} for q in queues}
        now = 0.0
        for queue, kind, state, value in rows:
            if kind == "c":
                counts[queue][STATES[state]] = int(value)
            elif kind == "o":
                oldest[queue] = value
            elif kind == "t":
                trimmed[queue][STATES[state]] = int(value)
            else:
                now = value
        return [
            QueueStats(
                queue=q,
                counts=counts[q],
                oldest_waiting=max(0.0, now - oldest[q]) if q in oldest else 0.0,
                trimmed=trimmed[q],
            )
            for q in queues
        ]

    # -- listing -----------------------------------------------------------------------

    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        limit = max(0, min(limit, 1000))
        rows = await self._fetch(
            "list_jobs",
            self._list_sql[state],
            self.ns,
            queue,
            CODE[state],
            max(0, offset),
            limit,
            read=True,
        )
        return [row[0] for row in rows]

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        limit = max(0, min(limit, 1000))
        args = page_args(state, cursor, limit)
        rows = await self._fetch(
            "page_jobs", self._page_sql[state], self.ns, queue, *args, read=True
        )
        ids = [row["id"] for row in rows[:limit]]
        if len(rows) <= limit or not ids:
            return JobList(ids, None)
        return JobList(ids, page_cursor(state, rows[limit - 1]))
