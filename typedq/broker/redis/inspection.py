"""The Redis broker's reads and operator actions, mixed into RedisBroker: jobs by id,
counts, purge, listing, retry and remove (``typedq inspect``), queue stats and per-minute
history, the worker and queue registries, and the event stream (:mod:`typedq.events`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from ...names import check_name, check_worker_id
from ..base import (
    HISTORY_MINUTES,
    EventRead,
    JobList,
    JobMessage,
    JobRecord,
    JobState,
    MinuteRollup,
    QueueEvent,
    QueueStats,
    RetryOutcome,
    WorkerInfo,
    bad_cursor,
)
from .codec import STATES, as_int, decode_job, encode, from_us, text
from .connection import SOCKET_TIMEOUT
from .core import RedisCore
from .flows import Handoff, unwrap
from .keys import STATE_LETTERS

__all__ = ["InspectOps", "check_cursor"]


#: What one purge.lua call may spend, in plain jobs' worth (~5-10 µs of Redis time each;
#: a job of a flow, and the jobs of the flows its deletion ends, weigh more: see
#: purge.lua): a call stays near 1-3 ms, past it by one flow end's first chunk at most
#: (1000 jobs per call took 20-60 ms on a loaded box; issue 31).
PURGE_CHUNK = 200

#: The order purge deletes the states of a queue in (see purge).
_PURGE_ORDER = (
    JobState.ACTIVE,
    JobState.SCHEDULED,
    JobState.WAITING,
    JobState.COMPLETED,
    JobState.FAILED,
    JobState.CANCELLED,
)


class InspectOps(RedisCore):
    """Read and operator methods of the Redis broker."""

    async def get(self, ids: Sequence[str], *, queue: str | None = None) -> list[JobRecord | None]:
        if not ids:
            self._conn()
            return []
        if queue is not None:
            check_name("queue", queue)
            rows = await self._eval(
                "get", [self.keys.counts(queue)], [self.keys.prefix, queue, *ids]
            )
            return [self._record(job_id, row) for job_id, row in zip(ids, rows, strict=True)]
        # No queue given: look in every known queue at once (one script per queue, one
        # round trip); an id found in several queues answers the first by name.
        queues = await self.known_queues()
        if not queues:
            return [None] * len(ids)
        replies = await self._eval_many(
            [("get", [self.keys.counts(q)], [self.keys.prefix, q, *ids]) for q in queues]
        )
        out: list[JobRecord | None] = [None] * len(ids)
        for rows in replies:
            for i, (job_id, row) in enumerate(zip(ids, rows, strict=True)):
                if out[i] is None:
                    out[i] = self._record(job_id, row)
        return out

    def _record(self, job_id: str, row: Any) -> JobRecord | None:
        if not isinstance(row, list):
            return None
        s, m, a, e, r, st, fa, res, err, pg, k, cr, w, q, eh = row
        state = STATES.get(text(s))
        if state is None:
            return None
        try:
            message = decode_job(job_id, text(q or b""), m or b"")
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Undecodable bytes: show the job anyway (its error record says why).
            message = JobMessage(id=job_id, task="", queue=text(q or b""), payload=b"")
        return JobRecord(
            message=message,
            state=state,
            attempt=as_int(a),
            enqueued_at=from_us(e),
            run_at=from_us(r),
            started_at=from_us(st),
            finished_at=from_us(fa),
            result=res,
            error=err,
            progress=pg,
            stalls=as_int(k),
            cancel_requested=bool(cr),
            worker_id=None if w is None else text(w),
            errors=_error_history(eh, err),
        )

    async def counts(self, queue: str) -> dict[JobState, int]:
        with self._translate("counts"):
            raw = await self._conn().hgetall(self.keys.counts(queue))
        counts = dict.fromkeys(JobState, 0)
        for letter, value in raw.items():
            state = STATES.get(text(letter))
            if state is not None:
                counts[state] = max(0, as_int(value))
        return counts

    # -- operations (``typedq inspect``) -----------------------------------------------

    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        k = self.keys
        removed = 0
        # Active jobs first, then scheduled and waiting ones (which flows ended by the
        # deletions reach: deleted in passing when their state is purged too), then the
        # final states (where those flows' other jobs end): each job in a purged state
        # is deleted and counted once, whatever order the flows react in.
        wanted = set(states)
        order = [s for s in _PURGE_ORDER if s in wanted]
        letters = "".join(STATE_LETTERS[s.value] for s in order)
        # Each call is bounded (PURGE_CHUNK). A flow a deletion ends goes on ending in
        # bounded steps, driven here after the call that began it (outbox entries
        # '<F>|z|<n>' that carry the purge: each step deletes the flow's jobs in the
        # purged states on this queue, as the purge would, and answers how many; at
        # once, before the reaper pass could apply them, which would leave them out of
        # the count). On Redis Cluster a flow across slots reacts to a deletion through
        # hand-offs to other queues' slots; they are delivered once every state is
        # purged (a flow ended by the deletions then finds its other jobs on this queue
        # gone, as on one Redis), and what the reactions put in the purged states goes
        # in another round (as the embedded broker does). A purge stopped between two
        # calls leaves each flow it ended marked ended, its next step in the outbox for
        # the reaper pass.
        while True:
            handoffs: list[Handoff] = []
            for state in order:
                cursor = 0
                while cursor >= 0:
                    args = [
                        k.prefix,
                        queue,
                        STATE_LETTERS[state.value],
                        PURGE_CHUNK,
                        cursor,
                        letters,
                    ]
                    reply = await self._eval_one("purge", [k.active(queue)], args)
                    fresh: list[Handoff] = []
                    n, cursor = unwrap(reply, fresh)
                    removed += int(n)
                    cursor = int(cursor)
                    handoffs += [h for h in fresh if "|z|" not in h.entry]
                    ends = [h for h in fresh if "|z|" in h.entry]
                    if ends:
                        removed += await self._deliver(ends)
            if not handoffs:
                return removed
            removed += await self._deliver(handoffs)

    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        ids, _ = await self._list(queue, state, "", max(0, offset), max(0, min(limit, 1000)))
        return ids

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        # The cursor is list.lua's: a place in the state's order (a sorted set's
        # '<score>|<id>', the active jobs' '<start>|<order>'), or the waiting entries'
        # position; a page costs the entries it passes, not the pages before it.
        limit = max(0, min(limit, 1000))
        start = "" if cursor is None else check_cursor(cursor, state)
        ids, at = await self._list(queue, state, start, 0, limit)
        if at is not None and ids:
            # A full page may end at the state's last job: answer a cursor only if
            # another job follows.
            more, _ = await self._list(queue, state, at, 0, 1)
            if not more:
                at = None
        return JobList(ids, None if at is None or not ids else at)

    async def _list(
        self, queue: str, state: JobState, cursor: str, skip: int, limit: int
    ) -> tuple[list[str], str | None]:
        """Up to ``limit`` ids from ``cursor`` ('': the start) after skipping ``skip``
        jobs, and the cursor after them (None at the end of the state). One list.lua call
        examines a bounded number of entries; calls go on from where the last one stopped
        until the page is full or the state ends, so a page is short only at the end."""
        k = self.keys
        ids: list[str] = []
        at: str | None = cursor
        while at is not None and len(ids) < limit:
            reply = await self._eval(
                "list",
                [k.active(queue)],
                [k.prefix, queue, STATE_LETTERS[state.value], at, skip, limit - len(ids)],
            )
            at = text(reply[0]) or None
            skip = as_int(reply[1])
            ids += [text(i) for i in reply[2:]]
        return ids, at

    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        if not ids:
            self._conn()
            return []
        k = self.keys
        queues = await self._queues_of(ids, queue)
        reply = await self._per_queue(
            "retry",
            queues,
            lambda q, idx: ([k.seq(q)], [k.prefix, q, *(ids[i] for i in idx)]),
            "not_found",
        )
        return [RetryOutcome(text(o)) for o in reply]

    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]:
        if not ids:
            self._conn()
            return []
        k = self.keys
        letters = "" if states is None else "".join(STATE_LETTERS[s.value] for s in states)
        if states is not None and not letters:
            return [False] * len(ids)
        queues = await self._queues_of(ids, queue)
        reply = await self._per_queue(
            "remove",
            queues,
            lambda q, idx: ([k.active(q)], [k.prefix, q, letters, *(ids[i] for i in idx)]),
            0,
        )
        return [bool(r) for r in reply]

    # -- observability -------------------------------------------------------------

    async def _over_queues(self, name: str, queues: Sequence[str], extra: list[Any]) -> list[Any]:
        """Read-only script ``name`` (ARGV: P, *extra, queue...) over ``queues``: one call
        on standalone Redis, one per queue (its own slot) on Cluster, in one round trip;
        the replies in order, each covering its queues in order."""
        k = self.keys
        if self.cluster:
            return await self._eval_many(
                [(name, [k.counts(q)], [k.prefix, *extra, q]) for q in queues]
            )
        return [await self._eval(name, [k.counts(queues[0])], [k.prefix, *extra, *queues])]

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        if not queues:
            self._conn()
            return []
        parts = await self._over_queues("queue_stats", queues, [])
        reply = [item for part in parts for item in part]
        stats = []
        for i, queue in enumerate(queues):
            flat, age = reply[2 * i], reply[2 * i + 1]
            counts = dict.fromkeys(JobState, 0)
            trimmed: dict[JobState, int] = {}
            for field, value in zip(flat[::2], flat[1::2], strict=True):
                letter = text(field)
                if letter[:1] == "t":  # 't<state>': finished jobs retention deleted
                    trimmed_state = STATES.get(letter[1:])
                    if trimmed_state is not None and as_int(value) > 0:
                        trimmed[trimmed_state] = as_int(value)
                    continue
                state = STATES.get(letter)
                if state is not None:
                    counts[state] = max(0, as_int(value))
            stats.append(
                QueueStats(queue=queue, counts=counts, oldest_waiting=from_us(age), trimmed=trimmed)
            )
        return stats

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        if not queues:
            self._conn()
            return []
        # Each reply starts with its current minute (on Cluster one per queue: the same
        # one, barring a minute turning over between them), then a row per queue.
        parts = await self._over_queues("history", queues, [minutes])
        first = (as_int(parts[0][0]) - minutes + 1) * 60
        out = []
        for row in (row for part in parts for row in part[1:]):
            values = [as_int(v) for v in row]
            out.append(
                [MinuteRollup(first + 60 * i, *values[3 * i : 3 * i + 3]) for i in range(minutes)]
            )
        return out

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        check_worker_id(info.id)
        k = self.keys
        await self._eval(
            "worker",
            [k.workers, k.queues],
            [k.prefix, "beat", info.id, max(1, round(ttl * 1000)), encode(info), *info.queues],
        )

    async def unregister_worker(self, worker_id: str) -> None:
        k = self.keys
        await self._eval("worker", [k.workers, k.queues], [k.prefix, "drop", worker_id, 0])

    async def list_workers(self) -> list[WorkerInfo]:
        k = self.keys
        reply = await self._eval("workers", [k.workers, k.queues], [k.prefix, "w"])
        workers = []
        for raw in reply:
            try:
                workers.append(msgspec.msgpack.decode(raw, type=WorkerInfo))
            except msgspec.DecodeError:
                continue  # an entry of another typedq version
        return sorted(workers, key=lambda w: w.id)

    async def list_queues(self) -> list[str]:
        k = self.keys
        reply = await self._eval("workers", [k.workers, k.queues], [k.prefix, "q"])
        return sorted(text(q) for q in reply)

    # -- events (typedq.events) ----------------------------------------------------------

    async def enable_events(self, queue: str) -> int:
        key = self.keys.events_config(check_name("queue", queue))
        with self._translate("enable_events"):
            # Not a MULTI: a Redis Cluster pipeline has none, and both commands touch one
            # key (the event number only ever grows, so reading it after the HSET is safe).
            async with self._conn().pipeline(transaction=False) as pipe:
                pipe.hset(key, "cap", max(1, int(self.settings.events_max)))
                pipe.hget(key, "n")
                _, last = await pipe.execute()
        return as_int(last)

    async def read_events(
        self, queue: str, after: int, *, timeout: float, limit: int = 500
    ) -> EventRead:
        key = self.keys.events(check_name("queue", queue))
        # XREAD BLOCK holds one pooled connection while it waits; it must answer before
        # the socket timeout, so a long wait is several reads (each returns at once when
        # an event comes: no polling).
        block = max(1, min(int(timeout * 1000), int(SOCKET_TIMEOUT * 1000) - 1000))
        with self._translate("read_events"):
            reply: Any = await self._conn().xread(
                {key: f"{max(0, after)}-1"}, count=max(1, limit), block=block
            )
        # RESP2 (the default): [[key, entries]]; nothing new: None.
        entries: list[Any] = reply[0][1] if reply else []
        events = []
        for entry_id, fields in entries:
            seq = as_int(text(entry_id).partition("-")[0])
            f = {text(k): v for k, v in fields.items()}
            state = STATES.get(text(f.get("s", b"")))
            if state is None:
                continue
            data = f.get("d", b"")
            events.append(
                QueueEvent(
                    seq=seq,
                    id=text(f.get("i", b"")),
                    task=text(f.get("k", b"")),
                    state=state,
                    data=data if isinstance(data, bytes) else str(data).encode(),
                    attempt=as_int(f.get("a")),
                )
            )
        missed = events[0].seq - after - 1 if events and events[0].seq > after + 1 else 0
        return EventRead(events=events, missed=missed)


_decode_history = msgspec.msgpack.Decoder(list[bytes]).decode


def _error_history(raw: bytes | None, last: bytes | None) -> tuple[bytes, ...]:
    """The job hash's ``eh`` (a msgpack array of records); a job stored before the
    history existed (or garbage there) has just its last record."""
    if raw is not None:
        try:
            return tuple(_decode_history(raw))
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
    return () if last is None else (last,)


#: The forms of list.lua's cursors: a position and the id of the job there, and its
#: gate's name when a limit parked it (waiting),
#: '<score>|<id>' (scheduled and final states), '<start>|<order>' (active).
_CURSOR_FORMS = {
    JobState.WAITING: re.compile(r"[0-9]{1,18}(\|[^|]+(\|g.+)?)?"),
    JobState.ACTIVE: re.compile(r"-?[0-9.e+-]{1,30}\|-?[0-9.e+-]{1,30}"),
}
_PLACE = re.compile(r"-?[0-9.e+-]{1,30}\|[^|]+")


def check_cursor(cursor: str, state: JobState) -> str:
    """``cursor`` if it has the form of a list.lua cursor of ``state``, else ValueError."""
    if not _CURSOR_FORMS.get(state, _PLACE).fullmatch(cursor):
        raise bad_cursor(cursor)
    if state is not JobState.WAITING:
        numbers = cursor.split("|")[: 2 if state is JobState.ACTIVE else 1]
        try:
            if not all(math.isfinite(float(n)) for n in numbers):
                raise bad_cursor(cursor)
        except ValueError:
            raise bad_cursor(cursor) from None
    return cursor
