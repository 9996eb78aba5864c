"""The PostgreSQL broker's worker side, mixed into PostgresBroker: the claim (``FOR
UPDATE SKIP LOCKED``, one function call; also after completions in the same call), waiting
for work, leases renewed and fenced by their token, the settles (complete, fail,
release), progress, cancel requests, and stall recovery."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from ...errors import FailureReason, FailureRecord
from ..base import (
    ERROR_HISTORY,
    MAX_SPAN_LINKS,
    ClaimedJob,
    Completion,
    Failure,
    FinishOutcome,
    LeaseStatus,
    Release,
    check_claim_id,
    new_claim_id,
)
from ..records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WORKER_LOST,
    parked_trimmed_message,
    stalled_message,
)
from .connection import call
from .core import PostgresCore
from .limits import limit_args
from .rows import FINISH, claimed_jobs, encode

__all__ = ["LeaseOps"]

#: stalled_message as a format() template of PostgreSQL: %1$s stalls, %2$s max_stalls.
_STALLED = stalled_message(111_111_111, 222_222_222).replace("111111111", "%1$s")
_STALLED = _STALLED.replace("222222222", "%2$s")


def _park_record(item: Failure) -> bytes:
    """The record a parked job's flow fails with if failed-job retention deletes the job
    before an operator retried it: the job's own reason, error type and attempt, and a
    message that says what happened (``failed_at`` set by the trim: the last 8 bytes)."""
    try:
        own = msgspec.msgpack.decode(item.error, type=FailureRecord)
    except (msgspec.DecodeError, msgspec.ValidationError):
        own = FailureRecord(
            reason=FailureReason.SCHEMA_MISMATCH,
            error_type="SchemaMismatch",
            message="",
            attempt=0,
            retryable=False,
        )
    return encode(
        FailureRecord(
            reason=own.reason,
            error_type=own.error_type,
            message=parked_trimmed_message(item.id, own.message),
            attempt=own.attempt,
            retryable=False,
            failed_at=0.0,
        )
    )


#: The renew statement's answer per lease (statements.py).
_RENEWED = (LeaseStatus.OK, LeaseStatus.LOST, LeaseStatus.CANCEL_REQUESTED)


class LeaseOps(PostgresCore):
    """The worker's calls of the PostgreSQL broker."""

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if limit <= 0 or not queues:
            self._check()
            return []
        rows = await self._fetch(
            "claim",
            self._sql["claim"],
            self.ns,
            list(queues),
            limit,
            worker_id,
            lease,
            claim_id,
            *limit_args(self.limits),
        )
        return claimed_jobs(rows)

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._check()
        event = anyio.Event()
        entry = (frozenset(queues), event)
        self._work.add(entry)
        try:
            # Marks the queues first (migration 17): from then on an enqueue to them
            # notifies, and one in flight is seen by the read.
            rows = await self._fetch(
                "wait_for_jobs", self._sql["sleep_due"], self.ns, list(queues), read=True
            )
            waiting, due_in = rows[0][0], rows[0][1]
            if waiting:
                return
            wait = timeout if due_in is None else min(timeout, max(0.0, due_in))
            if wait <= 0:
                return
            with anyio.move_on_after(wait):
                await event.wait()
        finally:
            self._work.discard(entry)

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        if not leases:
            self._check()
            return []
        rows = await self._fetch(
            "renew",
            self._sql["renew"],
            self.ns,
            [job_id for job_id, _ in leases],
            [token for _, token in leases],
            lease,
        )
        return [_RENEWED[row[0]] for row in rows]

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        if not items:
            self._check()
            return []
        await self._note_spans(items)
        codes = await self._fetchval(
            "complete", self._sql["complete"], *self._completion_args(items)
        )
        return [FINISH[c] for c in codes]

    async def _note_spans(self, items: Sequence[Completion] | Sequence[Failure]) -> None:
        """Keep the process spans of traced fan-out members for their fan-in callback's
        links (``flow_note_spans``), before their settle: a call of its own, made only
        when an item carries a span (tracing on, a member of a flow), so a plain
        settle pays nothing for it."""
        if not any(i.span for i in items):
            return
        await self._fetchval(
            "note_spans",
            self._sql["note_spans"],
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            [i.span for i in items],
            MAX_SPAN_LINKS,
        )

    def _completion_args(self, items: Sequence[Completion]) -> tuple[Any, ...]:
        """The arguments ``complete`` and ``complete_and_claim`` start with: the
        namespace, the completions as columns, the retention bounds, the channel."""
        r = self.settings.retention
        return (
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            [i.result for i in items],
            r.completed_ttl,
            r.completed_max,
            self.channel,
        )

    async def complete_and_claim(
        self,
        items: Sequence[Completion],
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> tuple[list[FinishOutcome], list[ClaimedJob]]:
        # One round trip, one transaction: the completions, then the claim.
        claim_id = new_claim_id() if claim_id is None else check_claim_id(claim_id)
        if not items:
            claimed = await self.claim(
                queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
            return [], claimed
        if limit <= 0 or not queues:
            return await self.complete(items), []
        await self._note_spans(items)
        rows = await self._fetch(
            "complete_and_claim",
            self._sql["complete_and_claim"],
            *self._completion_args(items),
            list(queues),
            limit,
            worker_id,
            lease,
            claim_id,
            *limit_args(self.limits),
        )
        outcomes = [FINISH[c] for c in rows[0]["codes"]]
        return outcomes, claimed_jobs([row for row in rows if row["n"] is not None])

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        if not items:
            self._check()
            return []
        await self._note_spans(items)
        ttls, caps = self._final_bounds()
        codes = await self._fetchval(
            "fail",
            self._sql["fail"],
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            [i.error for i in items],
            [i.retry_delay for i in items],
            [i.cancelled for i in items],
            [i.refund for i in items],
            ERROR_HISTORY,
            ttls,
            caps,
            self.channel,
            [_park_record(i) if i.park else None for i in items],
        )
        return [FINISH[c] for c in codes]

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        if not items:
            self._check()
            return []
        ttls, caps = self._final_bounds()
        codes = await self._fetchval(
            "release",
            self._sql["release"],
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            CANCELLED_ON_HAND_BACK,
            ttls[1],
            caps[1],
            self.channel,
        )
        return [FINISH[c] for c in codes]

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        status = await self._fetchval(
            "set_progress",
            self._sql["progress"] + " RETURNING true",
            self.ns,
            job_id,
            token,
            progress,
        )
        return bool(status)

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            self._check()
            return []
        rows = await self._fetch(
            "cancel_requests", self._sql["cancels"], self.ns, list(ids), read=True
        )
        asked = {row[0] for row in rows}
        return [i for i in ids if i in asked]

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._check()
        event = anyio.Event()
        self._cancels.add(event)
        try:
            task_status.started()
            with anyio.move_on_after(timeout):
                await event.wait()
        finally:
            self._cancels.discard(event)

    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        ttls, caps = self._final_bounds()
        pool = self._check()
        sql = self._sql["recover"]

        async def send() -> int:
            # ``holding`` is read when the call is sent (a live view stays current): once
            # a connection is in hand and the statement prepared, so that no round trip
            # (a new connection's, a prepare's) comes between the read and the send. A job
            # claimed meanwhile whose handler then blocks the loop past its lease is left
            # alone. (The reaper's pass is rare: the extra prepare costs nothing much.)
            async with pool.acquire() as conn:
                statement = await conn.prepare(sql)
                return await _recover(statement)

        async def _recover(statement: Any) -> int:
            got: int = await statement.fetchval(
                self.ns,
                limit,
                list(holding),
                self.settings.max_stalls,
                ERROR_HISTORY,
                CANCELLED_WORKER_LOST,
                _STALLED,
                ttls,
                caps,
                self.channel,
            )
            return got

        recovered = await call("recover_stalled", self.target.safe, send)
        await self._fetchval("flow_finish", self._sql["flow_finish"], self.ns)
        await self._forget_idle()
        await self._sweep_streams()
        return recovered
