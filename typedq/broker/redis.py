"""The Redis broker (``redis://``, ``rediss://``, ``unix://``): durable, shared, batch-first.

Every state transition is one Lua script from ``lua/`` (loaded once, run by SHA,
re-sent as EVAL on ``NOSCRIPT``), so a job is never half-moved. Key names live in
:mod:`typedq.broker.keys`; every key of an app shares its hash tag.

Waiting for work, for results and for cancel requests blocks on one dedicated
pub/sub connection per broker (no polling): scripts ``PUBLISH`` when a queue gets
work, when jobs reach a final state, and when a running job is asked to cancel.
Every (re)subscription counts as a notification, so nothing published while the
connection was down is missed: waiters look at Redis again.

Client settings (under test in tests/test_redis_faults.py): socket timeout 5 s,
connect timeout 2 s, TCP keepalive, health checks every 10 s, and at most
:data:`RETRIES` automatic retries on connection errors and timeouts with jittered
exponential backoff (50 ms to 1 s). Automatic retries are safe because every
script is idempotent when re-sent, and a re-sent script answers what its first copy
answered: claim, enqueue and cancel carry a token the client makes per call, and
the script keeps its answer under that token for a minute (``P r:<token>``), so a
re-sent claim returns the same jobs, a re-sent enqueue still answers
``created=True`` for the jobs its first copy created and a re-sent cancel still
answers ``CANCELLED``; finishes fenced by a token answer ``ALREADY_FINISHED`` the
second time.

Maxmemory: at the limit (``noeviction``), Redis refuses enqueues (and progress
writes) whole, with :class:`~typedq.errors.BrokerError` naming maxmemory; every
script that moves, finishes or deletes jobs (claim, complete, fail, release, renew,
recover, cancel, retry, remove, purge) carries ``#!lua flags=allow-oom`` and keeps
running, so workers drain the backlog and retention frees memory. A worker's
recovery pass looks at ``INFO memory`` at most every :data:`MEMORY_CHECK_INTERVAL`
seconds and logs one warning when Redis reaches maxmemory and one info line when it
is below again.

Memory: a job that no worker has claimed yet is one Redis string (a short text
header and the compact job body), not a hash: a hash whose envelope field is over
Redis's default ``hash-max-listpack-value`` (64 bytes) falls back to the hashtable
encoding, more than twice the size. Claim and cancel turn the string into the job
hash. The layout is in :mod:`typedq.broker.keys`.

Data loss: on connect the broker writes the app's epoch key if it is missing and
remembers its value; :meth:`RedisBroker.check_epoch` (run at most every
:data:`EPOCH_CHECK_INTERVAL` seconds, by a worker's recovery pass or before an enqueue)
notices when it vanished or changed, logs one error, records
:class:`~typedq.errors.RedisDataLost` in ``data_lost`` and carries on with the new
epoch. Connect also warns when Redis runs without AOF (no persistence at all when it
has taken no RDB snapshot either).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import secrets
import socket
import time
from collections.abc import Iterator, Sequence
from importlib import resources
from typing import Any, NoReturn

import anyio
import msgspec
import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from ..errors import (
    BrokerError,
    BrokerUnavailable,
    ConfigError,
    FailureReason,
    FailureRecord,
    NotConnected,
    QueueFull,
    RedisDataLost,
)
from ..names import check_job_id, check_name
from . import redact_url
from .base import (
    Broker,
    BrokerSettings,
    CancelOutcome,
    ClaimedJob,
    Completion,
    EnqueueOutcome,
    Failure,
    FinishOutcome,
    JobMessage,
    JobRecord,
    JobState,
    LeaseStatus,
    Release,
    RetryOutcome,
    check_claim_id,
)
from .keys import STATE_LETTERS, Keys

__all__ = [
    "CONNECT_TIMEOUT",
    "EPOCH_CHECK_INTERVAL",
    "HEALTH_CHECK_INTERVAL",
    "MEMORY_CHECK_INTERVAL",
    "RETRIES",
    "SOCKET_TIMEOUT",
    "RedisBroker",
]

log = logging.getLogger("typedq.broker.redis")

#: Seconds a command may wait for its reply before it counts as failed.
SOCKET_TIMEOUT = 5.0
#: Seconds to open a connection.
CONNECT_TIMEOUT = 2.0
#: Idle seconds after which a pooled connection is PINGed before use.
HEALTH_CHECK_INTERVAL = 10
#: Automatic retries of a command on ConnectionError/TimeoutError (scripts are idempotent).
RETRIES = 3
#: Connections in the command pool; callers beyond it wait (bounded) for one.
MAX_CONNECTIONS = 64
#: Seconds of silence on the pub/sub connection before we PING it ourselves.
_PUBSUB_PING_AFTER = 10.0
#: At most one check of the epoch key per this many seconds (recovery passes and enqueues).
EPOCH_CHECK_INTERVAL = 2.0
#: At most one look at ``INFO memory`` (is Redis at maxmemory?) per this many seconds.
MEMORY_CHECK_INTERVAL = 5.0
#: Used memory at or over this share of maxmemory counts as "at maxmemory" (Redis
#: refuses writes just past the limit; a little slack catches it before the refusal).
_FULL_AT = 0.98
#: ... and below this share as "below maxmemory again" (a margin, so one warning per
#: episode instead of one per pass while memory hovers around the limit).
_BELOW_AT = 0.95
#: Bounds of one pipeline of enqueue_batches: scripts, and bytes of job bodies.
_PIPELINE_SCRIPTS = 32
_PIPELINE_BYTES = 8 * 1024 * 1024

_MICRO = 1_000_000
_MAX_TTL_US = 2**52  # "forever" that still fits a Lua double exactly
_STATES = {letter: JobState(name) for name, letter in STATE_LETTERS.items()}
_encode = msgspec.msgpack.Encoder().encode
_decode_message = msgspec.msgpack.Decoder(JobMessage).decode

#: Every Redis client error a caller can meet, translated in one place (as httpcore's
#: ``map_exceptions``): users catch typedq's errors, never ``redis.exceptions``. The
#: first row whose types match wins, so a subclass comes before its base (redis-py's
#: AuthenticationError is a ConnectionError; OutOfMemoryError and NoPermissionError are
#: ResponseErrors). Each message says what happened and how to fix it; its fields:
#: ``where`` (the server), ``op`` (the operation), ``detail`` (Redis's words, password
#: scrubbed), ``prefix`` (the app's key prefix). Anything else is a plain BrokerError.
_ERRORS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[BrokerError], str], ...
] = (
    (
        (rexc.AuthenticationError, rexc.AuthorizationError),
        BrokerError,
        "{where} refused the credentials ({op}): {detail}; check the user and password "
        "in the broker URL (redis://USER:PASSWORD@HOST:PORT/DB)",
    ),
    (
        (rexc.ConnectionError, rexc.TimeoutError, OSError),
        BrokerUnavailable,
        "{where} is unreachable ({op}): {detail}",
    ),
    (
        rexc.NoPermissionError,
        BrokerError,
        "{where} denied {op} to this ACL user: {detail}. The user needs ~{prefix}* and "
        "&{prefix}*, +@read +@write +@scripting +@pubsub +time +info",
    ),
    (
        rexc.OutOfMemoryError,
        BrokerError,
        "{where} is at maxmemory (out of memory, noeviction): {op} was refused and changed "
        "nothing. Workers keep draining jobs, and memory comes back as retention removes "
        "finished jobs; retry later, or raise maxmemory",
    ),
)


class _Body(msgspec.Struct, frozen=True, array_like=True):
    """What Redis stores of a JobMessage: all but the id (the key says it) and the
    queue (the record says it). Trailing default values are left out when encoding."""

    task: str
    payload: bytes
    fingerprint: str = ""
    priority: int = 0
    max_retries: int = -1
    timeout: float = -1.0
    eta: float = 0.0
    delay: float = 0.0


_decode_body = msgspec.msgpack.Decoder(_Body).decode
_BODY_DEFAULTS = ("", b"", "", 0, -1, -1.0, 0.0, 0.0)


def _encode_body(m: JobMessage) -> bytes:
    fields = [m.task, m.payload, m.fingerprint, m.priority, m.max_retries, m.timeout, m.eta]
    fields.append(m.delay)
    n = len(fields)
    while n > 2 and fields[n - 1] == _BODY_DEFAULTS[n - 1]:
        n -= 1
    return _encode(fields[:n])


def _decode_job(job_id: str, queue: str, raw: bytes) -> JobMessage:
    """The JobMessage of a stored body; raises msgspec errors for bytes that are not one."""
    try:
        b = _decode_body(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        # A record written before bodies: the whole encoded JobMessage.
        try:
            message = _decode_message(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if message.id == job_id:
                return message
        raise
    return JobMessage(
        id=job_id,
        task=b.task,
        queue=queue,
        payload=b.payload,
        fingerprint=b.fingerprint,
        priority=b.priority,
        eta=b.eta,
        delay=b.delay,
        max_retries=b.max_retries,
        timeout=b.timeout,
    )


_FINISH = list(FinishOutcome)
_LEASE = list(LeaseStatus)


def _load_scripts() -> dict[str, tuple[str, str]]:
    """Read ``lua/*.lua``, insert ``common.lua`` after each shebang; name -> (source, sha1)."""
    folder = resources.files(__package__).joinpath("lua")
    common = folder.joinpath("common.lua").read_text("utf-8")
    scripts: dict[str, tuple[str, str]] = {}
    for entry in folder.iterdir():
        name = entry.name
        if not name.endswith(".lua") or name == "common.lua":
            continue
        text = entry.read_text("utf-8")
        shebang, _, body = text.partition("\n")
        if not shebang.startswith("#!lua"):
            raise RuntimeError(f"typedq/broker/lua/{name} must start with a #!lua shebang")
        source = f"{shebang}\n{common}\n{body}"
        sha = hashlib.sha1(source.encode("utf-8"), usedforsecurity=False).hexdigest()
        scripts[name.removesuffix(".lua")] = (source, sha)
    return scripts


_SCRIPTS = _load_scripts()

#: Persistence warnings already given in this process, as (address, kind): producers
#: and inspect runs connect often, and the setting rarely changes; once is enough.
_WARNED: set[tuple[str, str]] = set()


def _warn_once(where: str, kind: str, message: str, *args: Any) -> None:
    if (where, kind) not in _WARNED:
        _WARNED.add((where, kind))
        log.warning(message, *args)


def _us(seconds: float) -> int:
    """Seconds as integer microseconds, total: NaN and negatives are 0, +inf and huge
    values are :data:`_MAX_TTL_US` (never an exception on the settle path)."""
    try:
        us = float(seconds) * _MICRO
    except OverflowError:  # an int too large for a float
        return _MAX_TTL_US if seconds > 0 else 0
    except (TypeError, ValueError):
        return 0
    if not us > 0:  # also NaN
        return 0
    if us >= _MAX_TTL_US:
        return _MAX_TTL_US
    return int(us)


def _request_token() -> str:
    """A random token for one call (claim, enqueue, cancel): the key of its request
    record, which makes a re-sent script return the first copy's answer."""
    return secrets.token_hex(8)


def _mb(n: int) -> str:
    return f"{n / 1_048_576:.1f} MB"


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    try:
        return int(value) / _MICRO
    except (TypeError, ValueError):
        return 0.0


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


class _LostSendIsConnectionError:
    """Mixed into redis-py's connection class: a send on a connection that was just lost fails
    with ConnectionResetError, which redis-py turns into the ConnectionError it retries.

    On Python 3.12 to 3.13.5, ``writelines`` on a selector transport whose connection is lost
    raises AttributeError (``_loop`` is already None; python/cpython#136234), where ``write``
    would drop the data and let ``drain`` report the loss. redis-py sends with ``writelines``,
    so a connection cut by the network escaped its retries and our error handling as a bare
    AttributeError. The method only writes to the socket: an AttributeError there means the
    transport was torn down.
    """

    async def _send_packed_command(self, command: Any) -> None:
        try:
            await super()._send_packed_command(command)  # type: ignore[misc]
        except AttributeError as exc:
            raise ConnectionResetError(f"connection lost while sending ({exc})") from exc


def _with_lost_send_fix(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool``, making its connections with :class:`_LostSendIsConnectionError` mixed in
    (whatever class the URL chose: TCP, TLS or Unix socket)."""
    base = pool.connection_class
    pool.connection_class = type(base.__name__, (_LostSendIsConnectionError, base), {})
    return pool


class _DoneWaiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


class RedisBroker(Broker):
    """The durable broker on Redis 7+ (standalone, or one Redis Cluster slot per app).

    :param url: ``redis://[[user]:password@]host:port/db``, ``rediss://...`` (TLS; CA
        and client certificates as ``?ssl_ca_certs=...`` query options) or
        ``unix:///path?db=0``; redis-py connection options in the query override
        the defaults above
    :param settings: namespace, retention, stall limit and queue bounds
    """

    def __init__(self, url: str, settings: BrokerSettings) -> None:
        self.url = url
        self.settings = settings
        self.keys = Keys(check_name("app", settings.namespace))
        self._redis: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        # Channels asked for but not yet subscribed; the listener task does all I/O
        # on the pub/sub connection (concurrent reads and reconnects would corrupt it).
        self._pending: set[str] = set()
        self._read_scope: anyio.CancelScope | None = None
        self._sub_ready: dict[str, anyio.Event] = {}
        # Wake-ups from pub/sub: per-queue generations (+ one bumped on resubscribe),
        # so a notification that lands between a claim and the wait is not lost.
        self._all_gen = 0
        self._queue_gen: dict[str, int] = {}
        self._claim_gen: dict[tuple[str, ...], int] = {}
        self._next_due: dict[tuple[str, ...], float] = {}
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()
        self._done_waiters: dict[str, set[_DoneWaiter]] = {}
        self._where = "Redis"
        self._password: str | None = None
        # The app's epoch key as last seen, when, and when to look again.
        self._epoch: str | None = None
        self._epoch_seen_at = 0.0
        self._epoch_due = 0.0
        #: The last loss of data noticed (see check_epoch), or None.
        self.data_lost: RedisDataLost | None = None
        # Whether Redis was at maxmemory at the last look, and when to look again.
        self.at_maxmemory = False
        self._memory_due = 0.0

    def __repr__(self) -> str:
        return f"RedisBroker({redact_url(self.url)!r}, namespace={self.settings.namespace!r})"

    # -- connection ----------------------------------------------------------------

    def _client(self, *, max_connections: int, health_check_interval: int) -> aioredis.Redis:
        keepalive: dict[int, int] = {}
        for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
            option = getattr(socket, name, None)
            if option is not None:
                keepalive[option] = value
        tls: dict[str, Any] = {}
        if self.url.startswith("rediss://") and "ssl_check_hostname" not in self.url:
            # Fail closed: verify the server's name, whatever the redis-py version's default.
            tls = {"ssl_check_hostname": True, "ssl_cert_reqs": "required"}
        pool = aioredis.BlockingConnectionPool.from_url(
            self.url,
            **tls,
            max_connections=max_connections,
            timeout=SOCKET_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_keepalive=True,
            socket_keepalive_options=keepalive,
            health_check_interval=health_check_interval,
            retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), RETRIES),
            client_name=f"typedq:{self.settings.namespace}",
        )
        return aioredis.Redis(connection_pool=_with_lost_send_fix(pool))

    async def connect(self) -> None:
        if self._redis is not None:
            return
        try:
            self._redis = self._client(
                max_connections=MAX_CONNECTIONS, health_check_interval=HEALTH_CHECK_INTERVAL
            )
            # The subscriber pings on its own schedule (see _listen); it needs one connection.
            self._sub_client = self._client(max_connections=2, health_check_interval=0)
        except ValueError as exc:
            raise ConfigError(f"bad Redis URL {redact_url(self.url)!r}: {exc}") from None
        kwargs = self._redis.connection_pool.connection_kwargs
        self._password = kwargs.get("password")
        if "path" in kwargs:
            self._where = f"Redis at {kwargs['path']}"
        else:
            self._where = f"Redis at {kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}"
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()
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
            self._check_config(memory, persistence)
        with self._translate("loading scripts"):
            pipe = redis.pipeline(transaction=False)
            for source, _ in _SCRIPTS.values():
                pipe.script_load(source)
            await pipe.execute()
        self._epoch = None
        await self.check_epoch()

    async def _tls_failure(self, exc: BaseException) -> BrokerError:
        """The error for a ``rediss://`` connect that failed: a plain-text Redis on the
        port (the usual mistake) stays silent during the handshake, which redis-py
        reports as a timeout; one plain PING tells the two apart."""
        kwargs = self._conn().connection_pool.connection_kwargs
        host, port = kwargs.get("host", "localhost"), kwargs.get("port", 6379)
        try:
            with anyio.fail_after(CONNECT_TIMEOUT):
                async with await anyio.connect_tcp(host, port) as stream:
                    await stream.send(b"PING\r\n")
                    reply = await stream.receive(64)
        except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
            reply = b""
        if reply[:1] in (b"+", b"-"):
            return BrokerError(
                f"TLS handshake with {self._where} failed: it answers in plain text (a "
                "Redis without TLS on this port); use redis:// for it, or rediss:// with "
                "the port of its TLS listener (tls-port)"
            )
        error = self._error(exc, "connect")
        if isinstance(exc, rexc.TimeoutError) or "SSL" in str(exc) or "ssl" in str(exc):
            detail = self._scrub(str(exc))
            return type(error)(f"TLS handshake with {self._where} failed (connect): {detail}")
        return error

    def _check_config(self, memory: dict[str, Any], persistence: dict[str, Any]) -> None:
        policy = memory.get("maxmemory_policy")
        if policy is not None and _text(policy) != "noeviction":
            log.warning(
                "%s has maxmemory-policy %s: Redis may evict job data and leases under "
                "memory pressure; set `maxmemory-policy noeviction` for a task queue",
                self._where,
                _text(policy),
            )
        if _int(persistence.get("aof_enabled"), 1) != 0:
            return
        # INFO cannot show the `save` setting (and CONFIG GET is often denied): no
        # snapshot since Redis started is the sign that RDB is off too.
        if _int(persistence.get("rdb_saves"), 0) == 0:
            _warn_once(
                self._where,
                "persistence",
                "%s runs without persistence that typedq can see (appendonly no, and no "
                "RDB snapshot since it started): a restart loses every job; typedq will "
                "report it as RedisDataLost. Set `appendonly yes` for a task queue",
                self._where,
            )
        else:
            _warn_once(
                self._where,
                "persistence",
                "%s runs with RDB snapshots only (appendonly no): a crash loses the jobs "
                "enqueued and finished since the last snapshot. Set `appendonly yes` for a "
                "task queue",
                self._where,
            )

    async def check_epoch(self) -> bool:
        """Check the app's epoch key; False when Redis lost its data since the last check.

        A loss (the key vanished or changed: a restart without persistence, FLUSHALL,
        a failover to an empty replica) is logged once as an error and recorded in
        :attr:`data_lost`; the broker then adopts the new epoch and carries on. Called
        at connect, then at most every :data:`EPOCH_CHECK_INTERVAL` seconds by a
        worker's recovery pass (``recover_stalled``) and before an enqueue.
        """
        self._epoch_due = time.monotonic() + EPOCH_CHECK_INTERVAL
        candidate = secrets.token_hex(8)
        epoch = _text(await self._eval("epoch", [self.keys.epoch], [self.keys.prefix, candidate]))
        known, seen_at = self._epoch, self._epoch_seen_at
        self._epoch, self._epoch_seen_at = epoch, time.time()
        if known is None or epoch == known:
            return True
        created = _int(epoch.partition("-")[0])
        how = "vanished" if epoch.endswith("-" + candidate) else f"changed to {epoch!r}"
        self.data_lost = RedisDataLost(
            f"{self._where} lost its data: the epoch key {self.keys.epoch} was {known!r} "
            f"when last seen at {_utc(seen_at)} and has {how} (new epoch written at "
            f"{_utc(created)}). Redis restarted without persistence, was flushed "
            "(FLUSHALL/FLUSHDB) or failed over to an empty replica: the jobs of app "
            f"{self.settings.namespace!r} enqueued before it are gone (waiting, scheduled "
            "and running jobs, results, failure records), and running jobs end as "
            "NOT_FOUND. Continuing with the new epoch; set `appendonly yes` to survive "
            "restarts"
        )
        log.error("%s", self.data_lost)
        return False

    async def check_memory(self) -> bool:
        """Look at ``INFO memory``; True when Redis is at maxmemory.

        Logs one warning when Redis reaches maxmemory and one info line when it is
        below again; kept in :attr:`at_maxmemory`. Run by a worker's recovery pass at
        most every :data:`MEMORY_CHECK_INTERVAL` seconds. Quietly skipped when the ACL
        user may not run INFO, and on errors (the recovery script meets them too).
        """
        self._memory_due = time.monotonic() + MEMORY_CHECK_INTERVAL
        try:
            info = await self._conn().info("memory")
        except rexc.NoPermissionError:
            self._memory_due = math.inf  # denied once, denied always: stop asking
            return self.at_maxmemory
        except (rexc.RedisError, OSError):
            return self.at_maxmemory
        used, limit = _int(info.get("used_memory")), _int(info.get("maxmemory"))
        if limit <= 0:
            full = False
        elif self.at_maxmemory:
            full = used >= limit * _BELOW_AT
        else:
            full = used >= limit * _FULL_AT
        if full and not self.at_maxmemory:
            policy = _text(info.get("maxmemory_policy", b"noeviction"))
            log.warning(
                "%s is at maxmemory (used %s of %s, policy %s): enqueues are refused; "
                "workers keep draining (claim, complete, fail, recover still run) and "
                "memory comes back as retention removes finished jobs. Raise maxmemory or "
                "lower the retention (completed_ttl/completed_max) to recover sooner",
                self._where,
                _mb(used),
                _mb(limit),
                policy,
            )
        elif self.at_maxmemory and not full:
            log.info(
                "%s is below maxmemory again (used %s of %s): enqueues are accepted",
                self._where,
                _mb(used),
                _mb(limit),
            )
        self.at_maxmemory = full
        return full

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        while listener is not None and not listener.done():
            # The listener's read scope swallows this cancel when a new subscription
            # cancelled that scope at the same moment: cancel again until it ends.
            listener.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait({listener}, timeout=0.1)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        for client in (self._sub_client, self._redis):
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.aclose()
                    await client.connection_pool.disconnect()
        self._redis = self._sub_client = None
        self._pending.clear()
        self._sub_ready.clear()
        # Wake everything that waits so no task hangs on a closed broker.
        self._work_event.set()
        self._cancel_event.set()
        for waiters in self._done_waiters.values():
            for waiter in waiters:
                waiter.event.set()

    def _conn(self) -> aioredis.Redis:
        if self._redis is None:
            raise NotConnected(
                f"{self!r} is not connected: use `async with app:` first (or "
                "`await broker.connect()` for a broker used on its own)"
            )
        return self._redis

    # -- errors and scripts ------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        if self._password:
            text = text.replace(self._password, "***")
        return text

    def _raise(self, exc: BaseException, op: str) -> NoReturn:
        raise self._error(exc, op) from None

    def _error(self, exc: BaseException, op: str) -> BrokerError:
        """The typedq error for a Redis client error met by ``op`` (see ``_ERRORS``)."""
        detail = self._scrub(str(exc))
        if isinstance(exc, rexc.ResponseError) and detail.startswith("TYPEDQ_QUEUE_FULL"):
            # Not a Redis error but the enqueue script's own answer.
            _, queue, pending, extra, limit = detail.split()
            return QueueFull(
                f"queue {queue!r} holds {pending} pending jobs; adding {extra} would pass "
                f"max_queue_length={limit}"
            )
        for types, error, message in _ERRORS:
            if isinstance(exc, types):
                return error(
                    message.format(where=self._where, op=op, detail=detail, prefix=self.keys.prefix)
                )
        return BrokerError(f"{self._where}: {op} failed: {detail}")

    @contextlib.contextmanager
    def _translate(self, op: str) -> Iterator[None]:
        try:
            yield
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, op)

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        source, sha = _SCRIPTS[name]
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
            execute("EVALSHA", _SCRIPTS[name][1], len(keys), *keys, *args)
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
            return _us(r.completed_ttl), r.completed_max
        return _us(r.failed_ttl), r.failed_max

    # -- producer side -------------------------------------------------------------

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        if not messages:
            self._conn()
            return []
        keys, args, _ = self._enqueue_call(messages)
        if time.monotonic() >= self._epoch_due:
            await self.check_epoch()
        created = await self._eval("enqueue", keys, args)
        return [EnqueueOutcome(m.id, bool(c)) for m, c in zip(messages, created, strict=True)]

    def _enqueue_call(self, messages: Sequence[JobMessage]) -> tuple[list[str], list[Any], int]:
        """Keys and arguments of one enqueue script, and the bytes of its job bodies."""
        args: list[Any] = [self.keys.prefix, self.settings.max_queue_length, len(messages)]
        size = 0
        for m in messages:
            check_job_id(m.id)
            check_name("queue", m.queue)
            body = _encode_body(m)
            size += len(body)
            args += (m.id, m.queue, str(int(m.priority)), _us(m.eta), _us(m.delay), body)
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
        if time.monotonic() >= self._epoch_due and any(calls):
            await self.check_epoch()
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
                sha = _SCRIPTS["enqueue"][1]
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

    async def get(self, ids: Sequence[str]) -> list[JobRecord | None]:
        if not ids:
            self._conn()
            return []
        rows = await self._eval("get", [], [self.keys.prefix, *ids])
        return [self._record(job_id, row) for job_id, row in zip(ids, rows, strict=True)]

    def _record(self, job_id: str, row: Any) -> JobRecord | None:
        if not isinstance(row, list):
            return None
        s, m, a, e, r, st, fa, res, err, pg, k, cr, w, q = row
        state = _STATES.get(_text(s))
        if state is None:
            return None
        try:
            message = _decode_job(job_id, _text(q or b""), m or b"")
        except (msgspec.DecodeError, msgspec.ValidationError):
            # Undecodable bytes: show the job anyway (its error record says why).
            message = JobMessage(id=job_id, task="", queue=_text(q or b""), payload=b"")
        return JobRecord(
            message=message,
            state=state,
            attempt=_int(a),
            enqueued_at=_seconds(e),
            run_at=_seconds(r),
            started_at=_seconds(st),
            finished_at=_seconds(fa),
            result=res,
            error=err,
            progress=pg,
            stalls=_int(k),
            cancel_requested=bool(cr),
            worker_id=None if w is None else _text(w),
        )

    async def wait_finished(self, job_id: str, timeout: float | None) -> JobRecord | None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        waiter = _DoneWaiter()
        self._done_waiters.setdefault(job_id, set()).add(waiter)
        try:
            await self._subscribe(self.keys.done_channel, wait=deadline)
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
        finally:
            waiters = self._done_waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._done_waiters[job_id]

    async def cancel(self, job_id: str) -> CancelOutcome:
        ttl, cap = self._retention(completed=False)
        outcome = await self._eval(
            "cancel",
            [self.keys.done_cancelled, self.keys.request(_request_token())],
            [self.keys.prefix, ttl, cap, job_id],
        )
        return CancelOutcome(_text(outcome))

    async def counts(self, queue: str) -> dict[JobState, int]:
        with self._translate("counts"):
            raw = await self._conn().hgetall(self.keys.counts(queue))
        counts = dict.fromkeys(JobState, 0)
        for letter, value in raw.items():
            state = _STATES.get(_text(letter))
            if state is not None:
                counts[state] = max(0, _int(value))
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
        self._claim_gen[tuple(queues)] = self._gen(queues)
        token = _request_token() if claim_id is None else check_claim_id(claim_id)
        # The claim record is keyed by this claim's token, not by the worker: a worker
        # has several claims in flight (claim loop, complete_and_claim), and a re-send
        # of one must find its own record, not a sibling's. The worker re-sends a claim
        # whose answer it lost with the same id (and redis-py re-sends the script).
        keys = [self.keys.active, self.keys.seq, self.keys.request(token)]
        args: list[Any] = [
            self.keys.prefix,
            max(0, limit),
            max(1, _us(lease)),
            token,
            worker_id,
            len(queues),
            *queues,
        ]
        return keys, args

    async def _claimed(self, queues: Sequence[str], reply: Any, worker_id: str) -> list[ClaimedJob]:
        """Decode a claim script's reply; fail (for good) jobs whose bytes are garbage."""
        key = tuple(queues)
        next_due = int(reply[0])
        if next_due >= 0:
            self._next_due[key] = time.monotonic() + next_due / _MICRO
        else:
            self._next_due.pop(key, None)
        claimed: list[ClaimedJob] = []
        broken: list[Failure] = []
        for i in range(1, len(reply), 7):
            job_id, raw, tok, attempt, enqueued, stalls, queue = reply[i : i + 7]
            job_id, tok = _text(job_id), _text(tok)
            try:
                message = _decode_job(job_id, _text(queue), raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                broken.append(self._decode_failure(job_id, tok, raw, exc, int(attempt), worker_id))
                continue
            claimed.append(
                ClaimedJob(
                    message=message,
                    token=tok,
                    attempt=int(attempt),
                    enqueued_at=int(enqueued) / _MICRO,
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
            self._claim_gen[key] = -1
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
        return Failure(id=job_id, token=token, error=_encode(record))

    def _gen(self, queues: Sequence[str]) -> int:
        return self._all_gen + sum(self._queue_gen.get(q, 0) for q in queues)

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        key = tuple(queues)
        start = self._claim_gen.get(key)
        if start is None:
            start = self._gen(queues)
        await self._subscribe(self.keys.work_channel)
        wait = timeout
        due = self._next_due.get(key)
        if due is not None:
            # Do not sleep past the next scheduled job: it must be claimed when due.
            wait = min(wait, max(0.0, due - time.monotonic()))
        deadline = time.monotonic() + wait
        while self._gen(queues) == start and self._redis is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            event = self._work_event
            with anyio.move_on_after(remaining):
                await event.wait()

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        if not leases:
            self._conn()
            return []
        args: list[Any] = [self.keys.prefix, max(1, _us(lease)), len(leases)]
        for job_id, token in leases:
            args += (job_id, token)
        reply = await self._eval("renew", [self.keys.active], args)
        return [_LEASE[int(s)] for s in reply]

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        keys, args = self._complete_call(items)
        reply = await self._eval("complete", keys, args)
        return [_FINISH[int(o)] for o in reply]

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
        return [_FINISH[int(o)] for o in done], await self._claimed(queues, reply, worker_id)

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
                mode, delay = "r", _us(item.retry_delay)
            args += (item.id, item.token, item.error, mode, delay, "")
        reply = await self._eval(
            "fail",
            [self.keys.active, self.keys.done_failed, self.keys.done_cancelled, self.keys.seq],
            args,
        )
        return [_FINISH[int(o)] for o in reply]

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        ttl, cap = self._retention(completed=False)
        args: list[Any] = [self.keys.prefix, ttl, cap, len(items)]
        for item in items:
            args += (item.id, item.token)
        reply = await self._eval("release", [self.keys.active, self.keys.done_cancelled], args)
        return [_FINISH[int(o)] for o in reply]

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        ok = await self._eval("progress", [], [self.keys.prefix, job_id, token, progress])
        return bool(ok)

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            self._conn()
            return []
        reply = await self._eval("cancel_requests", [], [self.keys.prefix, *ids])
        return [_text(i) for i in reply]

    async def wait_cancel_requests(self, timeout: float) -> None:
        event = self._cancel_event
        await self._subscribe(self.keys.cancel_channel)
        with anyio.move_on_after(timeout):
            await event.wait()

    async def recover_stalled(self, limit: int = 1000) -> int:
        if time.monotonic() >= self._epoch_due:
            await self.check_epoch()
        if time.monotonic() >= self._memory_due:
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
        return [_text(i) for i in ids]

    async def retry(self, ids: Sequence[str]) -> list[RetryOutcome]:
        if not ids:
            self._conn()
            return []
        k = self.keys
        reply = await self._eval(
            "retry", [k.seq, k.done_failed, k.done_cancelled], [k.prefix, *ids]
        )
        return [RetryOutcome(_text(o)) for o in reply]

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

    # -- pub/sub ---------------------------------------------------------------------

    async def _subscribe(self, channel: str, *, wait: float | None = None) -> None:
        """Subscribe once per channel; with ``wait`` (a monotonic deadline), until confirmed."""
        self._conn()
        ready = self._sub_ready.get(channel)
        if ready is None:
            ready = self._sub_ready[channel] = anyio.Event()
            self._pending.add(channel)
            if self._listener is None:
                self._listener = asyncio.get_running_loop().create_task(
                    self._listen(), name=f"typedq redis listener {self.keys.prefix}"
                )
            elif self._read_scope is not None:
                # Interrupt the listener's read so it subscribes now. Safe: a pub/sub
                # read keeps partial replies in the parser (its own timeouts work so).
                self._read_scope.cancel()
        if wait is not None and not ready.is_set():
            with anyio.move_on_after(min(SOCKET_TIMEOUT, max(0.0, wait - time.monotonic()))):
                await ready.wait()

    def _wake_work(self) -> None:
        self._work_event.set()
        self._work_event = anyio.Event()

    def _wake_cancel(self) -> None:
        self._cancel_event.set()
        self._cancel_event = anyio.Event()

    def _wake_done(self, ids: Sequence[str] | None) -> None:
        if ids is None:
            for waiters in self._done_waiters.values():
                for waiter in waiters:
                    waiter.event.set()
            return
        for job_id in ids:
            for waiter in self._done_waiters.get(job_id, ()):
                waiter.event.set()

    def _wake_all(self) -> None:
        self._all_gen += 1
        self._wake_work()
        self._wake_cancel()
        self._wake_done(None)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel", b""))
        if kind == "subscribe":
            # A (re)subscription: whatever was published while we were not listening
            # is lost, so every waiter of this channel looks at Redis again.
            ready = self._sub_ready.get(channel)
            if ready is not None:
                ready.set()
            if channel == self.keys.work_channel:
                self._all_gen += 1
                self._wake_work()
            elif channel == self.keys.cancel_channel:
                self._wake_cancel()
            elif channel == self.keys.done_channel:
                self._wake_done(None)
        elif kind == "message":
            data = _text(message.get("data", b"")).split()
            if channel == self.keys.work_channel:
                for queue in data:
                    self._queue_gen[queue] = self._queue_gen.get(queue, 0) + 1
                self._wake_work()
            elif channel == self.keys.done_channel:
                self._wake_done(data)
            elif channel == self.keys.cancel_channel:
                self._wake_cancel()

    async def _listen(self) -> None:
        failures = 0
        last_heard = time.monotonic()
        pinged_at: float | None = None
        assert self._sub_client is not None
        pubsub = self._pubsub = self._sub_client.pubsub()
        while True:
            try:
                while self._pending:
                    channels = sorted(self._pending)
                    await pubsub.subscribe(*channels)
                    self._pending.difference_update(channels)
                with anyio.CancelScope() as scope:
                    self._read_scope = scope
                    message = await pubsub.get_message(timeout=1.0)
                self._read_scope = None
                if scope.cancelled_caught:
                    continue
                now = time.monotonic()
                if message is None:
                    if pinged_at is None and now - last_heard > _PUBSUB_PING_AFTER:
                        await pubsub.ping()
                        pinged_at = now
                    elif pinged_at is not None and now - pinged_at > SOCKET_TIMEOUT:
                        # Half-open connection: our PING got no answer. Drop it; the
                        # next read reconnects and resubscribes.
                        log.warning("%s: pub/sub connection silent; reconnecting", self._where)
                        pinged_at = None
                        last_heard = now
                        connection: Any = pubsub.connection  # typed as None in redis-py
                        if connection is not None:
                            await connection.disconnect()
                        self._wake_all()
                    continue
                last_heard, pinged_at = now, None
                failures = 0
                self._dispatch(message)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._read_scope = None
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning(
                        "%s: pub/sub listener error (%s); reconnecting",
                        self._where,
                        self._scrub(str(exc)),
                    )
                # Waiters re-check Redis themselves (and meet the error there).
                self._wake_all()
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
