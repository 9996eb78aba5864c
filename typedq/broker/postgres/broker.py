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
database's clock), Limits (rate and concurrency limits checked inside the claim),
TransactionalEnqueue, EventStreams and JobStreams (:mod:`.streams`), Flows (workflows,
handed off by the schema's triggers: :mod:`.flows`), SchemaRegistry and FingerprintCounts
(:mod:`.schemas`, what ``typedq verify`` reads), FlowControl (unique windows and
debounce: :mod:`.control`; fair shares are enforced by the claim, migration 10), Runs
(durable runs, woken by the schema's triggers: :mod:`.runs`) and FlowViews (pages of a
queue's fair keys, debounce and unique keys and job streams: :mod:`.views`).

The class is made of mixins, one module per capability, on the core they share
(:mod:`.core`: the pool, one call of a statement, the enqueue arguments): the producer
side and the reads in :mod:`.store`, the worker's claim, leases and settles in
:mod:`.leases`, Limits in :mod:`.limits`, Observability in :mod:`.observe`, Schedules in
:mod:`.schedules`, OperatorActions in :mod:`.actions`, EventStreams and JobStreams in
:mod:`.streams`, Flows in :mod:`.flows`, the schema registry and fingerprint counts in
:mod:`.schemas`, FlowControl in :mod:`.control`, Runs in :mod:`.runs`, FlowViews in
:mod:`.views`; rows become the
seam's values in :mod:`.rows`. Here: connect (pool, migrations, listener), close, and
the notifications that wake waiters.
"""

from __future__ import annotations

import asyncio
from typing import Any

import anyio

from ...errors import ConfigError
from ..base import BrokerSettings
from .actions import OperatorOps
from .connection import (
    Listener,
    asyncpg_module,
    call,
    channel_of,
    migrate,
    parse_url,
    schema_version,
)
from .control import ControlOps
from .flows import FlowOps
from .leases import LeaseOps
from .limits import LimitOps
from .observe import ObserveOps
from .runs import RunOps
from .schedules import ScheduleOps
from .schema import MIGRATIONS
from .schemas import SchemaOps
from .statements import count_statements, statements
from .store import JobStore
from .streams import StreamOps
from .views import ViewOps, view_statements

__all__ = ["PostgresBroker"]

#: Seconds ``close`` waits for the pool's connections to come back before dropping them.
_CLOSE_TIMEOUT = 5.0


class PostgresBroker(
    JobStore,
    LeaseOps,
    LimitOps,
    ObserveOps,
    ScheduleOps,
    OperatorOps,
    StreamOps,
    FlowOps,
    SchemaOps,
    ControlOps,
    RunOps,
    ViewOps,
):
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
        self._count_sql = count_statements(self.target.schema)
        self._view_sql = view_statements(self.target.schema)
        self._pool: Any = None
        self._listener: Listener | None = None
        self._users = 0
        #: Waiters for work: (queues, event), woken by ``w:`` notifications of a queue.
        self._work: set[tuple[frozenset[str], anyio.Event]] = set()
        #: Waiters for a job's end, by job id, woken by its ``f:`` notification.
        self._finished: dict[str, set[anyio.Event]] = {}
        self._cancels: set[anyio.Event] = set()
        #: Readers of event streams (by queue) and job streams (by job id) waiting for
        #: their next entry, woken by ``e:`` and ``s:`` notifications.
        self._event_waiters: dict[str, set[anyio.Event]] = {}
        self._stream_waiters: dict[str, set[anyio.Event]] = {}
        self._reader_until: dict[tuple[str, str], float] = {}
        #: Waiters of ``wait_run`` by run id, woken by its ``r:`` notification.
        self._run_waiters: dict[str, set[anyio.Event]] = {}
        #: Queues this process has put in the queue registry (``list_queues``).
        self._registered: set[str] = set()
        #: Debounce keys' last collecting jobs seen here (:mod:`.control`).
        self._holders: dict[tuple[str, str], str] = {}

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
        elif kind == "s":  # key: a job id
            for event in self._stream_waiters.get(key, ()):
                event.set()
        elif kind == "e":  # key: a queue
            for event in self._event_waiters.get(key, ()):
                event.set()
        elif kind == "r":  # key: a run id (its log grew or it ended)
            for event in self._run_waiters.get(key, ()):
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
        for waiters in (self._event_waiters, self._stream_waiters, self._run_waiters):
            for events in waiters.values():
                for event in events:
                    event.set()


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
