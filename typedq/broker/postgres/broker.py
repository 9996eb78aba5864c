"""The PostgreSQL broker: the core store of the seam on one jobs table.

Every transition is one call of a function of the schema (:mod:`.schema`), so one round
trip and one transaction: a claim takes up to n jobs with ``FOR UPDATE SKIP LOCKED``
(priority, then FIFO; due scheduled jobs join their line first), leases are fenced by
their token, and the waits are woken by LISTEN/NOTIFY (:class:`.connection.Listener`),
never by polling in the steady state.

What this broker has: the 14 core methods, plus ``wait_for_jobs``, ``wait_finished``,
``cancel_requests`` and ``wait_cancel_requests`` pushed by notifications, and
``complete_and_claim``, ``queue_stats`` and ``page_jobs`` (keyset cursors) of its own;
and the capabilities OperatorActions (retry, remove, purge), Observability (per-minute
rollups, the worker and queue registries), Schedules (compare-and-set firing on the
database's clock) and TransactionalEnqueue. Every other capability (flows, limits, event
streams, runs, flow control, flow views, the schema registry, job streams) keeps the seam's Unsupported default: an app that declares
one of those it needs at connect fails there in one line (docs/brokers.md).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Sequence
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from ...errors import ConfigError, InvalidOption, NotConnected, Unsupported
from ...names import check_worker_id
from ...options import check_numbers
from ..base import (
    ERROR_HISTORY,
    HISTORY_MINUTES,
    Broker,
    BrokerSettings,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueOutcome,
    Failure,
    FinishOutcome,
    FireOutcome,
    JobList,
    JobMessage,
    JobRecord,
    JobState,
    LeaseStatus,
    MinuteRollup,
    QueueStats,
    Release,
    RetryOutcome,
    ScheduleState,
    TickFiring,
    WorkerInfo,
    check_claim_id,
    new_claim_id,
)
from ..memory.listing import CURSOR_LETTERS, cursor_place
from ..records import (
    CANCELLED_ON_HAND_BACK,
    CANCELLED_WORKER_LOST,
    broker_failure,
    cancelled_while,
    stalled_message,
)
from .connection import (
    READ_TRIES,
    Listener,
    asyncpg_module,
    call,
    channel_of,
    migrate,
    parse_url,
    schema_version,
)
from .schema import MIGRATIONS, STATE_CODES
from .statements import statements
from .within import EnqueueArgs, enqueue_within, within_error

__all__ = ["PostgresBroker"]

_encode = msgspec.msgpack.Encoder().encode
_decode_message = msgspec.msgpack.Decoder(JobMessage).decode
_decode_worker = msgspec.msgpack.Decoder(WorkerInfo).decode

_STATES = [JobState(name) for name in STATE_CODES]
_CODE = {state: code for code, state in enumerate(_STATES)}
_FINISH = list(FinishOutcome)
_FIRE = [
    FireOutcome.FIRED,
    FireOutcome.STALE,
    FireOutcome.OVERLAP_SKIPPED,
    FireOutcome.HELD,
    FireOutcome.FULL,
]
_RETRY = [RetryOutcome.RETRIED, RetryOutcome.NOT_RETRYABLE, RetryOutcome.NOT_FOUND]
_CANCEL = [
    CancelOutcome.CANCELLED,
    CancelOutcome.REQUESTED,
    CancelOutcome.ALREADY_FINAL,
    CancelOutcome.NOT_FOUND,
]

#: Seconds ``close`` waits for the pool's connections to come back before dropping them.
_CLOSE_TIMEOUT = 5.0

#: stalled_message as a format() template of PostgreSQL: %1$s stalls, %2$s max_stalls.
_STALLED = stalled_message(111_111_111, 222_222_222).replace("111111111", "%1$s")
_STALLED = _STALLED.replace("222222222", "%2$s")


class PostgresBroker(Broker):
    """A broker on a PostgreSQL database (``postgresql://user@host:port/db?schema=NAME``).

    :param url: the database; ``schema`` (default ``typedq``) is where the broker's
        tables live, created and migrated on first connect
    :param settings: the app's broker settings; its ``namespace`` keeps apps apart in
        one schema
    """

    def __init__(self, url: str, settings: BrokerSettings | None = None) -> None:
        self.settings = settings or BrokerSettings()
        self.target = parse_url(url)
        self.ns = self.settings.namespace
        self.channel = channel_of(self.target.schema)
        self._sql, self._page_sql, self._list_sql = statements(self.target.schema)
        self._pool: Any = None
        self._listener: Listener | None = None
        self._users = 0
        #: Waiters for work: (queues, event), woken by ``w:`` notifications of a queue.
        self._work: set[tuple[frozenset[str], anyio.Event]] = set()
        #: Waiters for a job's end, by job id, woken by its ``f:`` notification.
        self._finished: dict[str, set[anyio.Event]] = {}
        self._cancels: set[anyio.Event] = set()
        #: Queues this process has put in the queue registry (``list_queues``).
        self._registered: set[str] = set()

    def __repr__(self) -> str:
        return f"PostgresBroker({self.target.safe!r})"

    # -- lifetime ----------------------------------------------------------------------

    async def connect(self) -> None:
        self._users += 1
        if self._users > 1:
            return
        try:
            asyncpg = _driver()
            where = self.target.safe
            self._pool = await call(
                "connect",
                where,
                lambda: asyncpg.create_pool(self.target.dsn, min_size=1, max_size=10),
            )

            async def _migrate() -> int:
                async with self._pool.acquire() as conn:
                    return await migrate(conn, self.target.schema)

            await call("migrate", where, _migrate)
            listener = Listener(self.target.dsn, self.channel, self._notified, self._wake_all)
            await call("listen", where, listener.start)
            self._listener = listener
        except BaseException:
            self._users = 0
            await self._teardown()
            raise

    async def schema_versions(self, *, apply: bool) -> tuple[int, int]:
        """``(the schema's version, the newest)``, on a connection of its own (no
        pool, no listener); with ``apply`` the schema is migrated first and the version it
        had is returned (``typedq migrate``; ``connect`` migrates too)."""
        asyncpg = _driver()
        where = self.target.safe
        conn = await call("connect", where, lambda: asyncpg.connect(self.target.dsn))
        try:
            if apply:
                had = await call("migrate", where, lambda: migrate(conn, self.target.schema))
            else:
                had = await call("version", where, lambda: schema_version(conn, self.target.schema))
        finally:
            await conn.close()
        return int(had), len(MIGRATIONS)

    async def close(self) -> None:
        if self._users == 0:
            return
        self._users -= 1
        if self._users == 0:
            await self._teardown()

    async def _teardown(self) -> None:
        listener, self._listener = self._listener, None
        pool, self._pool = self._pool, None
        self._wake_all()
        if listener is not None:
            await listener.close()
        if pool is not None:
            try:
                # Graceful: calls in flight end first; a connection that does not come
                # back within the bound (a dead server) is dropped.
                await asyncio.wait_for(pool.close(), _CLOSE_TIMEOUT)
            except (TimeoutError, OSError):
                pool.terminate()

    def _check(self) -> Any:
        pool = self._pool
        if pool is None:
            raise NotConnected(
                "the PostgreSQL broker is not connected: use `async with app:` before "
                "enqueueing or running workers (or `await broker.connect()`)"
            )
        return pool

    # -- notifications -----------------------------------------------------------------

    def _notified(self, payload: str) -> None:
        # ``<kind>:<ns>:<key>``: names have no ':' (a job id may), so the first two split.
        kind, _, rest = payload.partition(":")
        ns, _, key = rest.partition(":")
        if ns != self.ns:
            return
        if kind == "w":  # key: a queue
            for queues, event in list(self._work):
                if key in queues:
                    event.set()
        elif kind == "f":  # key: a job id
            for event in self._finished.get(key, ()):
                event.set()
        elif kind == "c":
            for event in list(self._cancels):
                event.set()

    def _wake_all(self) -> None:
        """Wake every waiter (the listener was remade: a notification may be lost)."""
        for _, event in list(self._work):
            event.set()
        for events in self._finished.values():
            for event in events:
                event.set()
        for event in self._cancels:
            event.set()

    # -- calls -------------------------------------------------------------------------

    async def _fetchval(self, op: str, sql: str, *args: Any, cap: int = 0) -> Any:
        pool = self._check()
        return await call(op, self.target.safe, lambda: pool.fetchval(sql, *args), cap)

    async def _fetch(self, op: str, sql: str, *args: Any, read: bool = False) -> list[Any]:
        pool = self._check()
        rows: list[Any] = await call(
            op, self.target.safe, lambda: pool.fetch(sql, *args), tries=READ_TRIES if read else 1
        )
        return rows

    def _final_bounds(self) -> tuple[list[float], list[int]]:
        r = self.settings.retention
        return [r.completed_ttl, r.failed_ttl], [r.completed_max, r.failed_max]

    # -- producer side -----------------------------------------------------------------

    def _enqueue_args(self, messages: Sequence[JobMessage]) -> EnqueueArgs:
        """The enqueue function's arguments for ``messages`` (checked first)."""
        check_numbers(messages)
        for message in messages:
            if not isinstance(message.payload, bytes):
                raise TypeError(
                    f"job {message.id!r}: the payload must be bytes (an encoded model), "
                    f"not {type(message.payload).__name__}"
                )
            if message.fair_weight:
                # Refused, not stored FIFO: a task declared fair must not quietly lose it.
                raise Unsupported(
                    f"PostgresBroker does not enforce fair shares yet (task "
                    f"{message.task!r} has fair=): drop fair= or use redis://"
                )
        queues = [m.queue for m in messages]
        return (
            self.ns,
            [m.id for m in messages],
            queues,
            [_encode(m) for m in messages],
            [m.priority for m in messages],
            [m.eta for m in messages],
            [m.delay for m in messages],
            self.queue_cap(set(queues)),
            self.channel,
        )

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        self._check()
        args = self._enqueue_args(messages)
        if not messages:
            return []
        await self._register_queues(args[2])
        created = await self._fetchval("enqueue", self._sql["enqueue"], *args, cap=args[7])
        return [EnqueueOutcome(m.id, bool(c)) for m, c in zip(messages, created, strict=True)]

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
        found = {row["id"]: _record(row) for row in rows}
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
        code = await self._fetchval(
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
        return _CANCEL[int(code)]

    async def counts(self, queue: str) -> dict[JobState, int]:
        rows = await self._fetch("counts", self._sql["counts"], self.ns, queue, read=True)
        counts = dict.fromkeys(JobState, 0)
        for state, n in rows:
            counts[_STATES[state]] = n
        return counts

    # -- worker side -------------------------------------------------------------------

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
            "claim", self._sql["claim"], self.ns, list(queues), limit, worker_id, lease, claim_id
        )
        return _claimed(rows)

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._check()
        event = anyio.Event()
        entry = (frozenset(queues), event)
        self._work.add(entry)
        try:
            rows = await self._fetch(
                "wait_for_jobs", self._sql["due"], self.ns, list(queues), read=True
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
        return [
            LeaseStatus.LOST
            if row[0] is None
            else (LeaseStatus.CANCEL_REQUESTED if row[0] else LeaseStatus.OK)
            for row in rows
        ]

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        if not items:
            self._check()
            return []
        r = self.settings.retention
        codes = await self._fetchval(
            "complete",
            self._sql["complete"],
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            [i.result for i in items],
            r.completed_ttl,
            r.completed_max,
            self.channel,
        )
        return [_FINISH[c] for c in codes]

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
        r = self.settings.retention
        rows = await self._fetch(
            "complete_and_claim",
            self._sql["complete_and_claim"],
            self.ns,
            [i.id for i in items],
            [i.token for i in items],
            [i.result for i in items],
            r.completed_ttl,
            r.completed_max,
            self.channel,
            list(queues),
            limit,
            worker_id,
            lease,
            claim_id,
        )
        outcomes = [_FINISH[c] for c in rows[0]["codes"]]
        return outcomes, _claimed([row for row in rows if row["n"] is not None])

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        if not items:
            self._check()
            return []
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
        )
        return [_FINISH[c] for c in codes]

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
        return [_FINISH[c] for c in codes]

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

        return await call("recover_stalled", self.target.safe, send)

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
                counts[queue][_STATES[state]] = int(value)
            elif kind == "o":
                oldest[queue] = value
            elif kind == "t":
                trimmed[queue][_STATES[state]] = int(value)
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

    # -- observability (capability Observability) ------------------------------------

    async def _register_queues(self, queues: Sequence[str]) -> None:
        """Put the queues this process has not registered yet in the queue registry
        (once per queue and process: a round trip at its first enqueue, none after)."""
        new = set(queues) - self._registered
        if new:
            await self._fetch("register_queues", self._sql["register_queues"], self.ns, sorted(new))
            self._registered |= new

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        if not queues:
            self._check()
            return []
        rows = await self._fetch(
            "history", self._sql["history"], self.ns, list(queues), minutes, read=True
        )
        current = int(rows[0]["cur"])
        found: dict[tuple[str, int], tuple[int, int, int]] = {
            (row["queue"], int(row["minute"])): (row["completed"], row["failed"], row["retried"])
            for row in rows
            if row["queue"] is not None
        }
        span = range(current - minutes + 1, current + 1)
        return [
            [MinuteRollup(m * 60, *found.get((queue, m), (0, 0, 0))) for m in span]
            for queue in queues
        ]

    async def register_worker(self, info: WorkerInfo, *, ttl: float) -> None:
        check_worker_id(info.id)
        await self._fetch(
            "register_worker",
            self._sql["register_worker"],
            self.ns,
            info.id,
            float(ttl),
            _encode(info),
            list(info.queues),
        )

    async def unregister_worker(self, worker_id: str) -> None:
        await self._fetch(
            "unregister_worker", self._sql["unregister_worker"], self.ns, worker_id, read=True
        )

    async def list_workers(self) -> list[WorkerInfo]:
        rows = await self._fetch("list_workers", self._sql["list_workers"], self.ns, read=True)
        workers = []
        for row in rows:
            try:
                workers.append(_decode_worker(row["info"]))
            except msgspec.DecodeError:
                continue  # an entry of another typedq version
        return workers

    async def list_queues(self) -> list[str]:
        rows = await self._fetch("list_queues", self._sql["list_queues"], self.ns, read=True)
        return [row[0] for row in rows]

    # -- schedules (capability Schedules) ----------------------------------------------

    async def broker_time_us(self) -> int:
        now: int = await self._fetchval("broker_time_us", self._sql["now_us"])
        return now

    async def sleep_until_us(self, when_us: int) -> None:
        delta = (when_us - await self.broker_time_us()) / 1_000_000
        if delta > 0:
            await anyio.sleep(delta)

    async def sync_schedules(
        self, schedules: Sequence[tuple[str, str]], *, prune: bool
    ) -> list[ScheduleState]:
        rows = await self._fetch(
            "sync_schedules",
            self._sql["sync_schedules"],
            self.ns,
            [name for name, _ in schedules],
            [digest for _, digest in schedules],
            prune,
            read=True,  # idempotent: a re-sent call finds the states it made
        )
        return [_schedule(row) for row in rows]

    async def fire_schedules(
        self, firings: Sequence[TickFiring]
    ) -> list[tuple[FireOutcome, ScheduleState | None]]:
        if not firings:
            self._check()
            return []
        messages = [m for f in firings for m in f.messages]
        args = self._enqueue_args(messages)
        starts = []
        at = 1
        for f in firings:
            starts.append(at)
            at += len(f.messages)
        await self._register_queues(args[2])
        rows = await self._fetch(
            "fire_schedules",
            self._sql["fire_schedules"],
            self.ns,
            [f.name for f in firings],
            [f.digest for f in firings],
            [f.expected_last_us for f in firings],
            [f.new_last_us for f in firings],
            [f.skipped for f in firings],
            [f.overlap for f in firings],
            starts,
            [len(f.messages) for f in firings],
            [self.queue_cap({m.queue for m in f.messages}) for f in firings],
            *args[1:7],
            self.channel,
        )
        rows.sort(key=lambda row: row["k"])
        return [
            (_FIRE[row["outcome"]], None if row["name"] is None else _schedule(row)) for row in rows
        ]

    async def schedule_states(self) -> list[ScheduleState]:
        rows = await self._fetch(
            "schedule_states", self._sql["schedule_states"], self.ns, read=True
        )
        return [_schedule(row) for row in rows]

    # -- operator actions (capability OperatorActions; no workflows here yet) ----------

    async def retry(self, ids: Sequence[str], *, queue: str | None = None) -> list[RetryOutcome]:
        if not ids:
            self._check()
            return []
        codes = await self._fetchval("retry", self._sql["retry"], self.ns, list(ids), self.channel)
        return [_RETRY[c] for c in codes]

    async def remove(
        self,
        ids: Sequence[str],
        *,
        states: Sequence[JobState] | None = None,
        queue: str | None = None,
    ) -> list[bool]:
        if not ids:
            self._check()
            return []
        codes = None if states is None else [_CODE[state] for state in states]
        gone = set(
            await self._fetchval(
                "remove", self._sql["remove"], self.ns, list(ids), codes, None, self.channel
            )
        )
        # Ids are acted on in order: an id repeated is deleted by its first mention.
        out = []
        for job_id in ids:
            out.append(job_id in gone)
            gone.discard(job_id)
        return out

    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        if not states:
            self._check()
            return 0
        gone = await self._fetchval(
            "purge",
            self._sql["remove"],
            self.ns,
            None,
            [_CODE[state] for state in states],
            queue,
            self.channel,
        )
        return len(gone)

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
            _CODE[state],
            max(0, offset),
            limit,
            read=True,
        )
        return [row[0] for row in rows]

    async def page_jobs(
        self, queue: str, state: JobState, *, cursor: str | None = None, limit: int = 100
    ) -> JobList:
        letter = CURSOR_LETTERS[state]
        after = (-math.inf, 0, "") if cursor is None else cursor_place(cursor, letter)
        limit = max(0, min(limit, 1000))
        rows = await self._fetch(
            "page_jobs",
            self._page_sql[state],
            self.ns,
            queue,
            _CODE[state],
            float(after[0]),
            int(after[1]) if cursor is not None else -(2**62),
            after[2],
            limit + 1,
            read=True,
        )
        ids = [row["id"] for row in rows[:limit]]
        if len(rows) <= limit or not ids:
            return JobList(ids, None)
        last = rows[limit - 1]
        integral = state is not JobState.SCHEDULED and state is not JobState.ACTIVE
        return JobList(ids, f"{letter}{_place_text(last['a'], integral)}:{last['b']}:{last['id']}")


def _claimed(rows: list[Any]) -> list[ClaimedJob]:
    """The rows of a claim as ClaimedJobs, in claim order."""
    rows.sort(key=lambda row: row["n"])
    return [
        ClaimedJob(
            message=_decode_message(row["message"]),
            token=row["token"],
            attempt=row["attempt"],
            enqueued_at=row["enqueued_at"],
            stalls=row["stalls"],
            run_at=row["run_at"],
        )
        for row in rows
    ]


def _schedule(row: Any) -> ScheduleState:
    return ScheduleState(
        name=row["name"],
        digest=row["digest"],
        last_tick_us=row["last_tick_us"],
        last_job=row["last_job"],
        last_fired_us=row["last_fired_us"],
        fired=row["fired"],
        skipped=row["skipped"],
    )


def _place_text(value: float, integral: bool) -> str:
    return repr(int(value)) if integral else repr(value)


def _driver() -> Any:
    """asyncpg, once the running event loop is asyncio's (it runs on no other)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigError(
            "the PostgreSQL broker runs on asyncio (its driver, asyncpg, is "
            "asyncio-only): run the app under anyio's asyncio backend"
        ) from None
    try:
        return asyncpg_module()
    except ImportError:
        raise ConfigError(
            "postgresql:// needs the asyncpg driver: pip install 'typedq[postgres]'"
        ) from None


def _record(row: Any) -> JobRecord:
    """A job's row as its snapshot; a failure record the broker wrote itself (a cancel,
    a stall) is encoded here from its parts."""
    error: bytes | None = row["error"]
    errors: tuple[bytes, ...] = tuple(row["errors"] or ())
    kind: str | None = row["br_kind"]
    if kind is not None:
        record = _encode(
            broker_failure(
                "stalled" if kind == "stalled" else "cancelled",
                row["br_message"],
                attempt=row["attempt"],
                failed_at=row["finished_at"],
                worker_id=None if kind == "cancelled" else row["worker_id"],
            )
        )
        error = record
        if kind == "stalled":
            errors = (*errors, record)[-ERROR_HISTORY:]
    return JobRecord(
        message=_decode_message(row["message"]),
        state=_STATES[row["state"]],
        attempt=row["attempt"],
        enqueued_at=row["enqueued_at"],
        run_at=row["run_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        error=error,
        progress=row["progress"],
        stalls=row["stalls"],
        cancel_requested=row["cancel_requested"],
        worker_id=row["worker_id"],
        errors=errors,
    )
