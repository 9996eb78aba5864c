"""The Redis broker class: one method per broker operation, one Lua script per transition.

See :mod:`typedq.broker.redis` for the guarantees; the pieces live beside this module:
stored bytes in :mod:`.codec`, scripts in :mod:`.scripts`, client settings in
:mod:`.connection`, error translation in :mod:`.errors`, server checks in :mod:`.health`
and pub/sub wake-ups in :mod:`.listener`.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NoReturn

import anyio
import msgspec
import redis.asyncio as aioredis
import redis.exceptions as rexc
from anyio.abc import TaskStatus

from ...errors import (
    BrokerError,
    ConfigError,
    FailureReason,
    FailureRecord,
    NotConnected,
    RedisDataLost,
)
from ...names import check_job_id, check_name, check_worker_id
from .. import redact_url
from ..base import (
    HISTORY_MINUTES,
    Broker,
    BrokerSettings,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueOutcome,
    EventRead,
    Failure,
    FinishOutcome,
    JobMessage,
    JobRecord,
    JobState,
    LeaseStatus,
    MinuteRollup,
    QueueEvent,
    QueueStats,
    Release,
    RetryOutcome,
    WorkerInfo,
    check_claim_id,
)
from ..flow import FlowSpec, FlowState
from ..keys import STATE_LETTERS, Keys
from .codec import (
    FINISH,
    LEASE,
    MICRO,
    STATES,
    as_int,
    decode_job,
    encode,
    encode_body,
    from_us,
    text,
    us,
)
from .connection import (
    HEALTH_CHECK_INTERVAL,
    MAX_CONNECTIONS,
    SOCKET_TIMEOUT,
    answers_plain_text,
    make_client,
)
from .errors import broker_error, scrub
from .flows import flow_args, flow_outcome
from .health import EpochWatch, MemoryWatch, check_config, log
from .listener import Notifications
from .schedules import ScheduleOps
from .scripts import SCRIPTS

__all__ = ["RedisBroker"]

#: Bounds of one pipeline of enqueue_batches: scripts, and bytes of job bodies.
_PIPELINE_SCRIPTS = 32
_PIPELINE_BYTES = 8 * 1024 * 1024


def _request_token() -> str:
    """A random token for one call (claim, enqueue, cancel): the key of its request
    record, which makes a re-sent script return the first copy's answer."""
    return secrets.token_hex(8)


class RedisBroker(ScheduleOps, Broker):
    """The durable broker on Redis 7+ (standalone, or one Redis Cluster slot per app).

    :param url: ``redis://[[user]:password@]host:port/db``, ``rediss://...`` (TLS; CA
        and client certificates as ``?ssl_ca_certs=...`` query options) or
        ``unix:///path?db=0``; redis-py connection options in the query override
        the defaults of :mod:`typedq.broker.redis.connection`
    :param settings: namespace, retention, stall limit and queue bounds
    """

    def __init__(self, url: str, settings: BrokerSettings) -> None:
        self.url = url
        self.settings = settings
        self.keys = Keys(check_name("app", settings.namespace))
        self._redis: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._notes = Notifications(self.keys)
        self._where = "Redis"
        self._password: str | None = None
        self._epoch = EpochWatch(settings.namespace, self.keys.epoch)
        #: Queues this process already added to the queue registry (at its first enqueue
        #: to each, so producer-only queues are discovered too).
        self._registered: set[str] = set()
        self._register_failed: dict[str, float] = {}
        self._memory = MemoryWatch()

    def __repr__(self) -> str:
        return f"RedisBroker({redact_url(self.url)!r}, namespace={self.settings.namespace!r})"

    @property
    def data_lost(self) -> RedisDataLost | None:
        """The last loss of data noticed (see :meth:`check_epoch`), or None."""
        return self._epoch.data_lost

    @property
    def at_maxmemory(self) -> bool:
        """Whether Redis was at maxmemory at the last look (see :meth:`check_memory`)."""
        return self._memory.at_maxmemory

    # -- connection ----------------------------------------------------------------

    async def connect(self) -> None:
        if self._redis is not None:
            return
        name = f"typedq:{self.settings.namespace}"
        try:
            self._redis = make_client(
                self.url,
                client_name=name,
                max_connections=MAX_CONNECTIONS,
                health_check_interval=HEALTH_CHECK_INTERVAL,
            )
            # The subscriber pings on its own schedule (see listener); it needs one connection.
            self._sub_client = make_client(
                self.url, client_name=name, max_connections=2, health_check_interval=0
            )
        except ValueError as exc:
            raise ConfigError(f"bad Redis URL {redact_url(self.url)!r}: {exc}") from None
        kwargs = self._redis.connection_pool.connection_kwargs
        self._password = kwargs.get("password")
        if "path" in kwargs:
            self._where = f"Redis at {kwargs['path']}"
        else:
            self._where = f"Redis at {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        self._notes.open(self._sub_client, where=self._where, password=self._password)
        try:
            await self._startup_checks()
        except BaseException:
            await self.close()
            raise

    async def _startup_checks(self) -> None:
        redis = self._conn()
        try:
            await redis.ping()
        except (rexc.RedisError, OSError) as exc:
            if self.url.startswith("rediss://") and isinstance(
                exc, rexc.ConnectionError | rexc.TimeoutError | OSError
            ):
                raise await self._tls_failure(exc) from None
            self._raise(exc, "connect")
        try:
            memory = await redis.info("memory")
            persistence = await redis.info("persistence")
        except rexc.NoPermissionError:
            log.warning(
                "%s: INFO is not allowed for this user; skipped the eviction and persistence "
                "checks",
                self._where,
            )
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, "connect")
        else:
            check_config(self._where, memory, persistence)
        with self._translate("loading scripts"):
            pipe = redis.pipeline(transaction=False)
            for source, _ in SCRIPTS.values():
                pipe.script_load(source)
            await pipe.execute()
        self._epoch.known = None
        await self.check_epoch()

    async def _tls_failure(self, exc: BaseException) -> BrokerError:
        """The error for a ``rediss://`` connect that failed: a plain-text Redis on the
        port (the usual mistake) stays silent during the handshake, which redis-py
        reports as a timeout; one plain PING tells the two apart."""
        kwargs = self._conn().connection_pool.connection_kwargs
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        if await answers_plain_text(host, port):
            return BrokerError(
                f"TLS handshake with {self._where} failed: it answers in plain text (a "
                "Redis without TLS on this port); use redis:// for it, or rediss:// with "
                "the port of its TLS listener (tls-port)"
            )
        error = self._error(exc, "connect")
        if isinstance(exc, rexc.TimeoutError) or "SSL" in str(exc) or "ssl" in str(exc):
            detail = scrub(str(exc), self._password)
            return type(error)(f"TLS handshake with {self._where} failed (connect): {detail}")
        return error

    async def check_epoch(self) -> bool:
        """Check the app's epoch key; False when Redis lost its data since the last check.

        A loss (the key vanished or changed: a restart without persistence, FLUSHALL,
        a failover to an empty replica) is logged once as an error and recorded in
        :attr:`data_lost`; the broker then adopts the new epoch and carries on. Called
        at connect, then at most every
        :data:`~typedq.broker.redis.health.EPOCH_CHECK_INTERVAL` seconds by a worker's
        recovery pass (``recover_stalled``) and before an enqueue.
        """
        self._epoch.looking()
        candidate = secrets.token_hex(8)
        epoch = text(await self._eval("epoch", [self.keys.epoch], [self.keys.prefix, candidate]))
        return self._epoch.saw(epoch, candidate, self._where)

    async def check_memory(self) -> bool:
        """Look at ``INFO memory``; True when Redis is at maxmemory.

        Logs one warning when Redis reaches maxmemory and one info line when it is
        below again; kept in :attr:`at_maxmemory`. Run by a worker's recovery pass at
        most every :data:`~typedq.broker.redis.health.MEMORY_CHECK_INTERVAL` seconds.
        Quietly skipped when the ACL user may not run INFO, and on errors (the recovery
        script meets them too).
        """
        self._memory.looking()
        try:
            info = await self._conn().info("memory")
        except rexc.NoPermissionError:
            self._memory.denied()
            return self.at_maxmemory
        except (rexc.RedisError, OSError):
            return self.at_maxmemory
        return self._memory.saw(info, self._where)

    async def close(self) -> None:
        await self._notes.close()
        for client in (self._sub_client, self._redis):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()
                    await client.connection_pool.disconnect()
        self._redis = self._sub_client = None

    def _conn(self) -> aioredis.Redis:
        if self._redis is None:
            raise NotConnected(
                f"{self!r} is not connected: use `async with app:` first (or "
                "`await broker.connect()` for a broker used on its own)"
            )
        return self._redis

    async def _redis_time_us(self) -> int:
        """Redis ``TIME`` in integer microseconds (schedules: the broker's clock)."""
        with self._translate("time"):
            seconds, micro = await self._conn().time()
        return int(seconds) * MICRO + int(micro)

    async def _hgetall(self, key: str) -> dict[Any, Any]:
        with self._translate("hgetall"):
            reply: dict[Any, Any] = await self._conn().hgetall(key)
        return reply

    # -- errors and scripts ------------------------------------------------------------

    def _raise(self, exc: BaseException, op: str) -> NoReturn:
        raise self._error(exc, op) from None

    def _error(self, exc: BaseException, op: str) -> BrokerError:
        """The typedq error for a Redis client error met by ``op``."""
        return broker_error(
            exc, op, where=self._where, prefix=self.keys.prefix, password=self._password
        )

    @contextlib.contextmanager
    def _translate(self, op: str) -> Iterator[None]:
        try:
            yield
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, op)

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        source, sha = SCRIPTS[name]
        redis = self._conn()
        execute: Any = redis.execute_command  # untyped in redis-py
        try:
            try:
                return await execute("EVALSHA", sha, len(keys), *keys, *args)
            except rexc.NoScriptError:
                # Script cache flushed (SCRIPT FLUSH, restart, failover): EVAL sends the
                # source and caches it again; it cannot meet NOSCRIPT even if another
                # flush comes right now.
                return await execute("EVAL", source, len(keys), *keys, *args)
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, name)

    async def _eval_pipelined(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run several scripts in one round trip, in order (not as a transaction).

        A script that meets NOSCRIPT did not run; it is re-sent on its own as EVAL. Each
        script is idempotent when re-sent, so redis-py's retry of the whole pipeline
        after a connection error is safe too.
        """
        pipe = self._conn().pipeline(transaction=False)
        execute: Any = pipe.execute_command  # untyped in redis-py
        for name, keys, args in calls:
            execute("EVALSHA", SCRIPTS[name][1], len(keys), *keys, *args)
        try:
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, calls[0][0])
        for i, (reply, (name, keys, args)) in enumerate(zip(replies, calls, strict=True)):
            if isinstance(reply, rexc.NoScriptError):
                replies[i] = await self._eval(name, keys, args)
            elif isinstance(reply, Exception):
                self._raise(reply, name)
        return replies

    def _retention(self, *, completed: bool) -> tuple[int, int]:
        r = self.settings.retention
        if completed:
            return us(r.completed_ttl), r.completed_max
        return us(r.failed_ttl), r.failed_max

    # -- producer side -------------------------------------------------------------

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        if not messages:
            self._conn()
            return []
        keys, args, _ = self._enqueue_call(messages)
        if self._epoch.is_due():
            await self.check_epoch()
        await self._register_queues(messages)
        created = await self._eval("enqueue", keys, args)
        return [EnqueueOutcome(m.id, bool(c)) for m, c in zip(messages, created, strict=True)]

    async def _register_queues(self, messages: Iterable[JobMessage]) -> None:
        """Add the queues of ``messages`` that this process has not enqueued to yet to
        the queue registry: one SADD the first time, nothing after. A failed SADD is
        not retried for a minute (the enqueue meets the same trouble and reports it)."""
        new = {m.queue for m in messages} - self._registered
        if not new:
            return
        now = time.monotonic()
        new -= {q for q, until in self._register_failed.items() if until > now}
        if not new:
            return
        try:
            await self._conn().sadd(self.keys.queues, *sorted(new))
        except (rexc.RedisError, OSError):
            self._register_failed.update(dict.fromkeys(new, now + 60.0))
            return
        self._registered |= new

    def _enqueue_call(self, messages: Sequence[JobMessage]) -> tuple[list[str], list[Any], int]:
        """Keys and arguments of one enqueue script, and the bytes of its job bodies."""
        args: list[Any] = [self.keys.prefix, self.settings.max_queue_length, len(messages)]
        size = 0
        for m in messages:
            check_job_id(m.id)
            check_name("queue", m.queue)
            body = encode_body(m)
            size += len(body)
            args += (m.id, m.queue, str(int(m.priority)), us(m.eta), us(m.delay), body)
        return [self.keys.seq, self.keys.request(_request_token())], args, size

    async def enqueue_batches(
        self, batches: Sequence[Sequence[JobMessage]]
    ) -> list[list[EnqueueOutcome] | Exception]:
        """Store ``batches`` in order, each atomically: one enqueue script per batch,
        pipelined in order on one connection (at most 32 scripts or ~8 MB of bodies per
        round trip), so Redis runs them in input order (FIFO across the batches) and each
        checks ``max_queue_length`` itself.

        Per batch: its outcomes, or the error that refused it (:class:`QueueFull`, a
        :class:`BrokerError` such as maxmemory), which stored nothing of it. When the
        connection fails (after redis-py's retries, whose re-sent scripts answer what
        their first copies answered) during the first round trip, it raises
        :class:`BrokerUnavailable`; during a later one, the batches of that round trip
        and after it get a :class:`BrokerUnavailable` each: those may or may not be
        stored, and sending them again with the same ids is safe (ids deduplicate).
        """
        calls = [self._enqueue_call(batch) if batch else None for batch in batches]
        if self._epoch.is_due() and any(calls):
            await self.check_epoch()
        await self._register_queues(m for batch in batches for m in batch)
        results: list[list[EnqueueOutcome] | Exception] = []
        i = 0
        while i < len(batches):
            # One pipeline: consecutive batches up to the bounds (at least one).
            j, size = i, 0
            while j < len(batches) and j - i < _PIPELINE_SCRIPTS:
                call = calls[j]
                extra = call[2] if call is not None else 0
                if j > i and size + extra > _PIPELINE_BYTES:
                    break
                size += extra
                j += 1
            sent = [(n, c) for n in range(i, j) if (c := calls[n]) is not None]
            replies: list[Any] = []
            if sent:
                pipe = self._conn().pipeline(transaction=False)
                execute: Any = pipe.execute_command  # untyped in redis-py
                sha = SCRIPTS["enqueue"][1]
                for _, (keys, args, _) in sent:
                    execute("EVALSHA", sha, len(keys), *keys, *args)
                try:
                    replies = await pipe.execute(raise_on_error=False)
                except (rexc.RedisError, OSError) as exc:
                    error = self._error(exc, "enqueue")
                    if not results:
                        raise error from None
                    results.extend(error for _ in range(i, len(batches)))
                    return results
            by_batch = dict(zip((n for n, _ in sent), replies, strict=True))
            for n in range(i, j):
                call, batch = calls[n], batches[n]
                if call is None:
                    results.append([])
                    continue
                reply = by_batch[n]
                if isinstance(reply, rexc.NoScriptError):
                    # Script cache flushed: nothing of this batch ran; send it alone.
                    try:
                        reply = await self._eval("enqueue", call[0], call[1])
                    except BrokerError as exc:
                        reply = exc
                elif isinstance(reply, Exception):
                    reply = self._error(reply, "enqueue")
                if isinstance(reply, Exception):
                    results.append(reply)
                else:
                    results.append(
                        [EnqueueOutcome(m.id, bool(c)) for m, c in zip(batch, reply, strict=True)]
                    )
            i = j
        return results

    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        """Store workflows: one ``flow_enqueue`` script per group of flows (up to ~8 MB
        of bodies), pipelined in one round trip; each flow is stored atomically, whole."""
        if not flows:
            self._conn()
            return []
        if self._epoch.is_due():
            await self.check_epoch()
        await self._register_queues(m for f in flows for m in (*f.members, *f.steps))
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        groups: list[list[FlowSpec]] = []
        args: list[Any] = []
        group: list[FlowSpec] = []
        size = 0
        for spec in flows:
            more, extra = flow_args(spec)
            if group and size + extra > _PIPELINE_BYTES:
                groups.append(group)
                calls.append(self._flow_call(group, args))
                group, args, size = [], [], 0
            group.append(spec)
            args += more
            size += extra
        groups.append(group)
        calls.append(self._flow_call(group, args))
        replies = await self._eval_pipelined(calls)
        return [
            flow_outcome(spec, answer)
            for group, reply in zip(groups, replies, strict=True)
            for spec, answer in zip(group, reply, strict=True)
        ]

    async def flow_state(self, flow_id: str) -> FlowState | None:
        reply = await self._eval("flow_info", [], [self.keys.prefix, flow_id])
        if not isinstance(reply, list):
            return None
        steps, members, pending = (int(v) for v in reply[:3])
        return FlowState(id=text(reply[3]), steps=steps, members=members, pending=pending)

    def _flow_call(
        self, group: Sequence[FlowSpec], args: list[Any]
    ) -> tuple[str, Sequence[str], Sequence[Any]]:
        head = [self.keys.prefix, self.settings.max_queue_length, len(group)]
        return "flow_enqueue", [self.keys.seq, self.keys.request(_request_token())], head + args

    async def get(self, ids: Sequence[str]) -> list[JobRecord | None]:
        if not ids:
            self._conn()
            return []
        rows = await self._eval("get", [], [self.keys.prefix, *ids])
        return [self._record(job_id, row) for job_id, row in zip(ids, rows, strict=True)]

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

    async def wait_finished(
        self,
        job_id: str,
        timeout: float | None,
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> JobRecord | None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        self._conn()
        with self._notes.done_waiter(job_id) as waiter:
            await self._notes.subscribe(self.keys.done_channel, wait=deadline)
            # Subscribed and registered: a finish announced from now on wakes the waiter,
            # and one announced before is seen by the first look below.
            task_status.started()
            while True:
                # A fresh event before each look, so a notice that lands between the
                # read and the wait still wakes us.
                waiter.event = anyio.Event()
                (record,) = await self.get([job_id])
                if record is None or record.state.is_final:
                    return record
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._redis is None:
                    return None
                with anyio.move_on_after(remaining):
                    await waiter.event.wait()

    async def cancel(self, job_id: str) -> CancelOutcome:
        ttl, cap = self._retention(completed=False)
        outcome = await self._eval(
            "cancel",
            [self.keys.done_cancelled, self.keys.request(_request_token())],
            [self.keys.prefix, ttl, cap, job_id],
        )
        return CancelOutcome(text(outcome))

    async def counts(self, queue: str) -> dict[JobState, int]:
        with self._translate("counts"):
            raw = await self._conn().hgetall(self.keys.counts(queue))
        counts = dict.fromkeys(JobState, 0)
        for letter, value in raw.items():
            state = STATES.get(text(letter))
            if state is not None:
                counts[state] = max(0, as_int(value))
        return counts

    # -- worker side ---------------------------------------------------------------

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        keys, args = self._claim_call(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )
        reply = await self._eval("claim", keys, args)
        return await self._claimed(queues, reply, worker_id)

    def _claim_call(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None,
    ) -> tuple[list[str], list[Any]]:
        if not queues:
            raise ConfigError("claim needs at least one queue")
        self._notes.claim_sent(queues)
        token = _request_token() if claim_id is None else check_claim_id(claim_id)
        # The claim record is keyed by this claim's token, not by the worker: a worker
        # has several claims in flight (claim loop, complete_and_claim), and a re-send
        # of one must find its own record, not a sibling's. The worker re-sends a claim
        # whose answer it lost with the same id (and redis-py re-sends the script).
        keys = [self.keys.active, self.keys.seq, self.keys.request(token)]
        args: list[Any] = [
            self.keys.prefix,
            max(0, limit),
            max(1, us(lease)),
            token,
            worker_id,
            len(queues),
            *queues,
        ]
        if self.limits:
            # The limits of this process's tasks travel with every claim (a few numbers
            # per limited task); without any, the script skips all limit work.
            args.append(len(self.limits))
            for task, spec in self.limits.items():
                args += (task, spec.rate, spec.per_us, spec.concurrency)
        return keys, args

    async def _claimed(self, queues: Sequence[str], reply: Any, worker_id: str) -> list[ClaimedJob]:
        """Decode a claim script's reply; fail (for good) jobs whose bytes are garbage."""
        self._notes.claim_answered(queues, int(reply[0]))
        claimed: list[ClaimedJob] = []
        broken: list[Failure] = []
        for i in range(1, len(reply), 7):
            job_id, raw, tok, attempt, enqueued, stalls, queue = reply[i : i + 7]
            job_id, tok = text(job_id), text(tok)
            try:
                message = decode_job(job_id, text(queue), raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                broken.append(self._decode_failure(job_id, tok, raw, exc, int(attempt), worker_id))
                continue
            claimed.append(
                ClaimedJob(
                    message=message,
                    token=tok,
                    attempt=int(attempt),
                    enqueued_at=int(enqueued) / MICRO,
                    stalls=int(stalls),
                )
            )
        if broken:
            # Bytes that are not a job envelope: fail those jobs for good, here, so
            # the worker never sees them and the other jobs keep flowing.
            log.error(
                "%d claimed jobs hold bytes that are not a typedq envelope; failed with "
                "reason decode_error: %s",
                len(broken),
                ", ".join(f.id for f in broken),
            )
            await self.fail(broken)
            # More jobs may wait behind these: the caller's next wait_for_jobs returns
            # at once instead of waiting for a notification (none comes for them).
            self._notes.look_again(queues)
        return claimed

    def _decode_failure(
        self, job_id: str, token: str, raw: bytes, exc: Exception, attempt: int, worker_id: str
    ) -> Failure:
        record = FailureRecord(
            reason=FailureReason.DECODE_ERROR,
            error_type="DecodeError",
            message=(
                f"job {job_id}: the stored envelope is not a typedq job ({exc}); "
                f"{len(raw)} bytes, starting {raw[:48]!r}"
            ),
            attempt=attempt,
            retryable=False,
            worker_id=worker_id,
            failed_at=time.time(),
        )
        return Failure(id=job_id, token=token, error=encode(record))

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._conn()
        await self._notes.wait_for_work(queues, timeout)

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        if not leases:
            self._conn()
            return []
        args: list[Any] = [self.keys.prefix, max(1, us(lease)), len(leases)]
        for job_id, token in leases:
            args += (job_id, token)
        reply = await self._eval("renew", [self.keys.active], args)
        return [LEASE[int(s)] for s in reply]

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        keys, args = self._complete_call(items)
        reply = await self._eval("complete", keys, args)
        return [FINISH[int(o)] for o in reply]

    def _complete_call(self, items: Sequence[Completion]) -> tuple[list[str], list[Any]]:
        ttl, cap = self._retention(completed=True)
        args: list[Any] = [self.keys.prefix, ttl, cap, len(items)]
        for item in items:
            args += (item.id, item.token, item.result)
        return [self.keys.active, self.keys.done_completed], args

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
        """Both scripts in one pipelined round trip; Redis runs the completion first."""
        if not items or limit <= 0:
            return await super().complete_and_claim(
                items, queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
        complete_keys, complete_args = self._complete_call(items)
        claim_keys, claim_args = self._claim_call(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )
        done, reply = await self._eval_pipelined(
            [("complete", complete_keys, complete_args), ("claim", claim_keys, claim_args)]
        )
        return [FINISH[int(o)] for o in done], await self._claimed(queues, reply, worker_id)

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        ttl, cap = self._retention(completed=False)
        args: list[Any] = [self.keys.prefix, ttl, cap, len(items)]
        for item in items:
            if item.cancelled:
                mode, delay = "x", 0
            elif item.retry_delay is None:
                mode, delay = "f", 0
            else:
                mode, delay = "l" if item.refund else "r", us(item.retry_delay)
            args += (item.id, item.token, item.error, mode, delay, "")
        reply = await self._eval(
            "fail",
            [self.keys.active, self.keys.done_failed, self.keys.done_cancelled, self.keys.seq],
            args,
        )
        return [FINISH[int(o)] for o in reply]

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        ttl, cap = self._retention(completed=False)
        args: list[Any] = [self.keys.prefix, ttl, cap, len(items)]
        for item in items:
            args += (item.id, item.token)
        reply = await self._eval("release", [self.keys.active, self.keys.done_cancelled], args)
        return [FINISH[int(o)] for o in reply]

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        ok = await self._eval("progress", [], [self.keys.prefix, job_id, token, progress])
        return bool(ok)

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            self._conn()
            return []
        reply = await self._eval("cancel_requests", [], [self.keys.prefix, *ids])
        return [text(i) for i in reply]

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._conn()
        await self._notes.wait_cancel(timeout, task_status=task_status)

    async def recover_stalled(self, limit: int = 1000) -> int:
        if self._epoch.is_due():
            await self.check_epoch()
        if self._memory.is_due():
            await self.check_memory()
        cttl, ccap = self._retention(completed=True)
        fttl, fcap = self._retention(completed=False)
        k = self.keys
        recovered = await self._eval(
            "recover",
            [k.active, k.done_completed, k.done_failed, k.done_cancelled],
            [k.prefix, max(0, limit), self.settings.max_stalls, cttl, ccap, fttl, fcap],
        )
        return int(recovered)

    async def purge(self, queue: str, states: Sequence[JobState]) -> int:
        k = self.keys
        removed = 0
        for state in dict.fromkeys(states):
            cursor = 0
            while cursor >= 0:
                n, cursor = await self._eval(
                    "purge",
                    [k.active, k.done_completed, k.done_failed, k.done_cancelled],
                    [k.prefix, queue, STATE_LETTERS[state.value], 1000, cursor],
                )
                removed += int(n)
                cursor = int(cursor)
        return removed

    # -- operations (``typedq inspect``) -----------------------------------------------

    async def list_jobs(
        self, queue: str, state: JobState, *, offset: int = 0, limit: int = 100
    ) -> list[str]:
        k = self.keys
        ids = await self._eval(
            "list",
            [k.active, k.done_completed, k.done_failed, k.done_cancelled],
            [
                k.prefix,
                queue,
                STATE_LETTERS[state.value],
                max(0, offset),
                max(0, min(limit, 1000)),
            ],
        )
        return [text(i) for i in ids]

    async def retry(self, ids: Sequence[str]) -> list[RetryOutcome]:
        if not ids:
            self._conn()
            return []
        k = self.keys
        reply = await self._eval(
            "retry", [k.seq, k.done_failed, k.done_cancelled], [k.prefix, *ids]
        )
        return [RetryOutcome(text(o)) for o in reply]

    async def remove(
        self, ids: Sequence[str], *, states: Sequence[JobState] | None = None
    ) -> list[bool]:
        if not ids:
            self._conn()
            return []
        k = self.keys
        letters = "" if states is None else "".join(STATE_LETTERS[s.value] for s in states)
        if states is not None and not letters:
            return [False] * len(ids)
        reply = await self._eval(
            "remove",
            [k.active, k.done_completed, k.done_failed, k.done_cancelled],
            [k.prefix, letters, *ids],
        )
        return [bool(r) for r in reply]

    # -- observability -------------------------------------------------------------

    async def queue_stats(self, queues: Sequence[str]) -> list[QueueStats]:
        if not queues:
            self._conn()
            return []
        k = self.keys
        reply = await self._eval("queue_stats", [k.counts(q) for q in queues], [k.prefix, *queues])
        stats = []
        for i, queue in enumerate(queues):
            flat, age = reply[2 * i], reply[2 * i + 1]
            counts = dict.fromkeys(JobState, 0)
            for letter, value in zip(flat[::2], flat[1::2], strict=True):
                state = STATES.get(text(letter))
                if state is not None:
                    counts[state] = max(0, as_int(value))
            stats.append(QueueStats(queue=queue, counts=counts, oldest_waiting=from_us(age)))
        return stats

    async def history(self, queues: Sequence[str], minutes: int = 60) -> list[list[MinuteRollup]]:
        if not 1 <= minutes <= HISTORY_MINUTES:
            raise ValueError(f"minutes must be 1 to {HISTORY_MINUTES}, not {minutes}")
        if not queues:
            self._conn()
            return []
        k = self.keys
        reply = await self._eval(
            "history", [k.counts(q) for q in queues], [k.prefix, minutes, *queues]
        )
        first = (as_int(reply[0]) - minutes + 1) * 60
        out = []
        for row in reply[1:]:
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
            async with self._conn().pipeline(transaction=True) as pipe:
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
