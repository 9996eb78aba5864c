"""Connecting to PostgreSQL: the URL, the pool, the schema's migrations, the listener of
the broker's notifications, and asyncpg's errors as typedq's.

Driver: asyncpg (asyncio only). A broker holds one pool for its calls and one more
connection that LISTENs on the schema's channel (``typedq_<schema>``): ``w:<ns>:<queue>``
(work may be claimable in that queue), ``f:<ns>:<job id>`` (the job finished), ``c:<ns>`` (a running
job's cancel was requested). Notifications are sent by the schema's functions, so they
are delivered when the transaction that made the change commits. Since migration 17 a
plain enqueue notifies ``w:`` only for a queue a worker waits for (it marked it), and a
finish ``f:`` only for a job a waiter watches: PostgreSQL serializes notifying commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit

from ...errors import BrokerError, BrokerUnavailable, ConfigError, QueueFull
from ..flow import id_taken
from .schema import MIGRATIONS, SCHEMA_NAME, migrate_sql

__all__ = [
    "PgTarget",
    "asyncpg_module",
    "broker_error",
    "channel_of",
    "migrate",
    "parse_url",
    "schema_version",
]

log = logging.getLogger("typedq.broker.postgres")

T = TypeVar("T")


class PgTarget:
    """What a ``postgresql://`` URL names: the DSN asyncpg connects with (the
    ``schema`` parameter taken out), the schema, and the URL safe to print."""

    __slots__ = ("dsn", "safe", "schema")

    def __init__(self, dsn: str, schema: str, safe: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.safe = safe


def parse_url(url: str) -> PgTarget:
    """Split ``postgresql://user@host:port/db?schema=NAME`` (also ``postgres://``)."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {parts.scheme}:// (use postgresql://)")
    params = parse_qsl(parts.query, keep_blank_values=True)
    schema = "typedq"
    rest = []
    for key, value in params:
        if key == "schema":
            schema = value
        else:
            rest.append((key, value))
    if not SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(
            f"invalid schema {schema!r} in the broker URL: use ?schema=NAME with NAME of "
            "lowercase letters, digits and _ (up to 63, not starting with a digit)"
        )
    dsn = parts._replace(query=urlencode(rest)).geturl()
    safe = dsn
    if parts.password is not None:
        safe = parts._replace(
            netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        ).geturl()
    return PgTarget(dsn, schema, safe)


def channel_of(schema: str) -> str:
    """The LISTEN/NOTIFY channel of a schema's brokers."""
    return f"typedq_{schema}"


def asyncpg_module() -> Any:
    """The asyncpg module, imported where it is used (the extra ``typedq[postgres]``).
    Imported by name, so that type checkers do not follow it: asyncpg ships no types, and
    an app's own ``mypy --strict`` must pass with or without it installed."""
    return importlib.import_module("asyncpg")


#: The SQLSTATEs of the schema's refusals: a full queue, a flow's derived job id taken.
REFUSALS = ("TQ001", "TQ002")


def refusal(sqlstate: str, text: str, cap: int) -> QueueFull | ConfigError:
    """A refusal of the schema's functions as typedq's error: TQ001 (``queue|pending|
    adding``) a full queue, TQ002 (``<job id>\x1f<flow id>``, enqueue_flow) a flow's
    derived job id taken by another job."""
    if sqlstate == "TQ001":
        queue, pending, adding = text.split("|")[-3:]
        return QueueFull(
            f"queue {queue!r} holds {pending} pending jobs; adding {adding} would pass "
            f"max_queue_length={cap}"
        )
    taken, _, flow = text.rpartition("\x1f")
    return ConfigError(id_taken(taken, flow))


def broker_error(
    exc: BaseException, op: str, where: str, cap: int = 0
) -> BrokerError | ConfigError:
    """asyncpg's (or the socket's) error as typedq's, naming the operation."""
    asyncpg = asyncpg_module()

    if isinstance(exc, asyncpg.PostgresError) and getattr(exc, "sqlstate", "") in REFUSALS:
        return refusal(exc.sqlstate, str(getattr(exc, "message", exc)), cap)
    if isinstance(
        exc,
        (
            OSError,
            TimeoutError,
            asyncpg.PostgresConnectionError,
            asyncpg.InterfaceError,
            # A connection killed while a call ran can leave asyncpg's protocol mid-call
            # when the pool resets it: the connection is gone, as for the others.
            asyncpg.exceptions.InternalClientError,
            asyncpg.CannotConnectNowError,
            asyncpg.AdminShutdownError,
        ),
    ):
        return BrokerUnavailable(f"PostgreSQL at {where} is unreachable ({op}): {exc}")
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return BrokerError(
            f"PostgreSQL at {where} refused the credentials ({op}): {exc}; check the user "
            "and password in the broker URL (postgresql://USER:PASSWORD@HOST:PORT/DB)"
        )
    return BrokerError(f"PostgreSQL at {where} failed {op}: {type(exc).__name__}: {exc}")


async def migrate(conn: Any, schema: str) -> int:
    """Bring ``schema`` to the newest version; return the version it had.

    Idempotent, and safe when several processes connect at once: the check and the
    migrations run under a transaction-level advisory lock keyed by the schema.
    """
    latest = len(MIGRATIONS)
    version = await _version(conn, schema)
    if version > latest:
        log.info(
            "typedq: PostgreSQL schema %s is at version %d, newer than this release knows "
            "(%d): a newer typedq migrated it",
            schema,
            version,
            latest,
        )
    if version >= latest:
        return version
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext($1))", f"typedq-migrate:{schema}")
        await conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        await conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{schema}".migrations ('
            "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        version = await _version(conn, schema)
        for step in range(version + 1, latest + 1):
            await conn.execute(migrate_sql(step, schema))
            await conn.execute(f'INSERT INTO "{schema}".migrations (version) VALUES ($1)', step)
            log.info("typedq: PostgreSQL schema %s migrated to version %d", schema, step)
    return version


async def schema_version(conn: Any, schema: str) -> int:
    """The version ``schema`` is at (0: not created yet)."""
    return await _version(conn, schema)


async def _version(conn: Any, schema: str) -> int:
    exists = await conn.fetchval("SELECT to_regclass($1)", f'"{schema}".migrations')
    if exists is None:
        return 0
    found = await conn.fetchval(f'SELECT max(version) FROM "{schema}".migrations')
    return int(found or 0)


class Listener:
    """The connection that LISTENs on the schema's channel, kept open: remade after it
    is lost, and every waiter woken then (notifications may have been missed)."""

    def __init__(
        self,
        dsn: str,
        channel: str,
        on_message: Callable[[str], None],
        on_reset: Callable[[], None],
    ) -> None:
        self.dsn = dsn
        self.channel = channel
        self.on_message = on_message
        self.on_reset = on_reset
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._conn: Any = None

    async def start(self) -> None:
        """Listen, and keep listening in the background; returns once listening."""
        await self._listen()
        self._task = asyncio.get_running_loop().create_task(self._keep())

    async def _listen(self) -> None:
        asyncpg = asyncpg_module()

        conn = await asyncpg.connect(self.dsn)
        try:
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c: lost.set())
            await conn.add_listener(self.channel, self._notified)
        except BaseException:
            # LISTEN failed or was cancelled (a connect timeout, close() during a
            # reconnect): the connection is nobody's, so it goes now, not when the
            # collector finds it (an idle backend on the server until then).
            conn.terminate()
            raise
        self._conn = conn
        self._lost = lost

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self.on_message(payload)

    async def _keep(self) -> None:
        pause = 0.05
        while True:
            await self._lost.wait()
            self.on_reset()
            while True:
                try:
                    await self._listen()
                except Exception as exc:  # any failure: try again later
                    log.warning("typedq: PostgreSQL listener lost (%s); reconnecting", exc)
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 2.0)
                    continue
                pause = 0.05
                self.on_reset()
                break

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)


#: How often a read is sent again when its connection was lost (killed by the server,
#: a restart): the pool opens a new one. Writes are not: their callers re-send them
#: (they are fenced or keyed by id).
READ_TRIES = 3
#: How often a call its transaction's deadlock rolled back is sent in all.
_DEADLOCK_TRIES = 3


async def call(
    op: str, where: str, make: Callable[[], Awaitable[T]], cap: int = 0, *, tries: int = 1
) -> T:
    """``await make()`` with asyncpg's errors translated (:func:`broker_error`); a read
    (``tries`` > 1) is sent again after a lost connection."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await make()
        except BrokerError:
            raise
        except (OSError, TimeoutError) as exc:
            error: BrokerError | ConfigError = broker_error(exc, op, where, cap)
            cause: BaseException = exc
        except Exception as exc:
            asyncpg = asyncpg_module()

            if not isinstance(
                exc,
                asyncpg.PostgresError
                | asyncpg.InterfaceError
                | asyncpg.exceptions.InternalClientError,
            ):
                raise
            error, cause = broker_error(exc, op, where, cap), exc
            if getattr(exc, "sqlstate", "") == "40P01" and attempt < _DEADLOCK_TRIES:
                # A deadlock (a flow's end and the settle of one of its jobs, each holding
                # a row the other waits for): the victim's transaction was rolled back
                # whole, so the call is sent again, a write too.
                await asyncio.sleep(0.01 * attempt)
                continue
        if attempt >= tries or not isinstance(error, BrokerUnavailable):
            raise error from cause
        await asyncio.sleep(0.02 * attempt)
