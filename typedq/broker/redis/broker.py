"""The Redis broker class, and its core: connection, checks, where a job is.

:class:`RedisBroker` is one class made of mixins, one module per concept: calling the
library's scripts in :mod:`.calls`, enqueue and waiting for results in :mod:`.enqueue`,
workflows in :mod:`.flows`, the worker's claim, lease and settle path in :mod:`.leases`,
reads and operator actions in :mod:`.inspection`, schedules in :mod:`.schedules`, durable
runs in :mod:`.runs`; they
see this core through :class:`~.core.RedisCore`. The core is here: connect (standalone
Redis and Cluster) and its startup checks, the epoch and memory checks, the queue
registry and where a job is, close, error translation, and delivering the hand-offs of
flows across slots.

See :mod:`typedq.broker.redis` for the guarantees; the pieces live beside this module:
stored bytes in :mod:`.codec`, scripts in :mod:`.scripts`, client settings in
:mod:`.connection`, error translation in :mod:`.errors`, server checks in :mod:`.health`
and pub/sub wake-ups in :mod:`.listener`.
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ...errors import BrokerError, ConfigError, NotConnected, RedisDataLost
from ...names import check_name
from .. import redact_url
from ..base import BrokerSettings
from .calls import ScriptCalls
from .codec import MICRO, as_int, text, us
from .connection import (
    CLUSTER_SCHEMES,
    HEALTH_CHECK_INTERVAL,
    MAX_CONNECTIONS,
    Lane,
    answers_plain_text,
    cluster_node_url,
    cluster_nodes,
    make_client,
    make_cluster_client,
)
from .direct import DirectHandoff
from .enqueue import EnqueueOps
from .errors import broker_error, scrub
from .flows import FlowOps, Handoff
from .health import EpochWatch, MemoryWatch, check_config, check_slots, log
from .inspection import InspectOps
from .keys import Keys
from .listener import Notifications
from .migrate import migrate_layout
from .runs import RunOps
from .schedules import ScheduleOps
from .schemaops import SchemaOps
from .scripts import library
from .streams import StreamOps
from .views import ViewOps

__all__ = ["RedisBroker"]

#: The hand-offs still to apply of the :meth:`RedisBroker._deliver` under way in this
#: task (None: none is): an apply's own hand-offs join its loop.
_delivering: contextvars.ContextVar[list[Handoff] | None] = contextvars.ContextVar(
    "typedq_redis_delivering", default=None
)

#: Seconds an outbox entry (a hand-off of a flow across slots) is left to the call that
#: wrote it before the reaper pass applies it (see :attr:`RedisBroker.handoff_age`).
HANDOFF_AGE = 5.0


def _chunk_entry(entry: str) -> bool:
    """Is outbox entry ``entry`` one that starts (or drops) a chunk of a fan-out's
    members (``'<F>|A|<queue>|<from>'``, ``'<F>|Ad|...'``: flow_enqueue.lua)? Job ids
    hold no '|'."""
    kind = entry.split("|", 2)[1:2]
    return kind == ["A"] or kind == ["Ad"]


class RedisBroker(
    ScriptCalls,
    EnqueueOps,
    FlowOps,
    DirectHandoff,
    InspectOps,
    ScheduleOps,
    RunOps,
    SchemaOps,
    StreamOps,
    ViewOps,
):
    """The durable broker on Redis 7+: standalone, or Redis Cluster (one slot per queue).

    :param url: ``redis://[[user]:password@]host:port/db``, ``rediss://...`` (TLS; CA
        and client certificates as ``?ssl_ca_certs=...`` query options) or
        ``unix:///path?db=0``; redis-py connection options in the query override
        the defaults of :mod:`typedq.broker.redis.connection`. Redis Cluster:
        ``redis+cluster://[[user]:password@]host:port[,host:port...]`` (``rediss+cluster``
        for TLS)
    :param settings: namespace, retention, stall limit and queue bounds
    """

    def __init__(self, url: str, settings: BrokerSettings) -> None:
        self.url = url
        self.settings = settings
        self.keys = Keys(check_name("app", settings.namespace))
        self._redis: aioredis.Redis | None = None
        self._sub_client: aioredis.Redis | None = None
        # A connection kept for the worker's calls of every job (standalone Redis only).
        self._lane: Lane | None = None
        self._notes = Notifications(self.keys)
        self._where = "Redis"
        self._password: str | None = None
        self._epoch = EpochWatch(settings.namespace, self.keys.epoch)
        self._memory = MemoryWatch()
        # Queues this broker has used (registered in the queue registry, epoch watched).
        self._queues_seen: set[str] = set()
        #: True on Redis Cluster (``redis+cluster://``): one script call per slot.
        self.cluster = False
        # The library's variant: Redis Cluster's wakes up by sharded pub/sub (scripts.py).
        self._library = library()
        # Jobs this broker claimed and has not settled: lease token -> (id, queue), so
        # the worker's settles find each job's queue without a search.
        self._held: dict[str, tuple[str, str]] = {}
        #: Seconds after which the reaper pass (:meth:`recover_stalled`) applies an
        #: outbox entry of a flow across slots that its writer did not apply (died, or
        #: its apply failed). Applying one twice changes nothing, so this only spares
        #: the writer a race with the reaper.
        self.handoff_age = HANDOFF_AGE
        # Outbox entries applied and not deleted yet, per queue (see _deliver).
        self._acks: dict[str, list[str]] = {}
        # Durable run id -> its queue, as the app's run index said (see .runs).
        self._run_locations: dict[str, str] = {}
        # Direct hand-off (see .direct): each worker's registration, the blocking pops'
        # connection.
        self._registrations = {}
        self._blocking = {}
        self._unanswered_claims = set()
        # Job stream readers' registrations this process holds (see .streams).
        self._reader_until = {}

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
        if self.url.partition("://")[0] in CLUSTER_SCHEMES:
            await self._connect_cluster(name)
            return
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
        self._lane = Lane(self._redis.connection_pool)
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

    async def _connect_cluster(self, name: str) -> None:
        """Connect to Redis Cluster (``redis+cluster://``): a cluster client for commands
        and scripts (each script call names keys of one slot: one queue), and sharded
        pub/sub: one plain connection per node owning a slot listened to (listener.py)."""
        self.cluster = True
        self.fences_other_queues = False  # a run's script reads a fence on its slot only
        self._library = library(sharded=True)
        url = self.url
        try:
            nodes, _, self._password, _ = cluster_nodes(url)
            self._redis = make_cluster_client(
                url, client_name=name, max_connections=MAX_CONNECTIONS
            )
        except ValueError as exc:
            raise ConfigError(f"bad Redis Cluster URL {redact_url(url)!r}: {exc}") from None
        self._where = "Redis Cluster at " + ",".join(f"{h}:{p}" for h, p in nodes)

        def node_client(host: str, port: int) -> aioredis.Redis:
            # No automatic reconnect: redis-py would re-subscribe every channel in one
            # SSUBSCRIBE (refused across slots) on the same node (the slot may have moved).
            return make_client(
                cluster_node_url(url, host, port),
                client_name=name,
                max_connections=2,
                health_check_interval=0,
                retries=0,
            )

        self._notes.open_sharded(
            self._redis, node_client, where=self._where, password=self._password
        )
        try:
            await self._startup_checks()
        except BaseException:
            await self.close()
            raise

    async def _startup_checks(self) -> None:
        redis = self._conn()
        if self.cluster:
            await self._cluster_checks()
            return
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
        await self._load_library()
        self._epoch.reset()
        self._queues_seen.clear()
        await migrate_layout(self)
        await self.check_epoch()

    async def _cluster_checks(self) -> None:
        """Connect-time checks on Redis Cluster: every primary answers and is configured
        for a task queue, the known queues' keys each map to one slot, no data of the
        previous layout, the epochs. The function library is loaded on every primary (its
        replicas get it by replication: a replica that takes over has it); a node that
        lacks it anyway (flushed, restarted without persistence, added later) answers
        "Function not found", and the library is loaded again and the call re-sent."""
        redis: Any = self._conn()
        try:
            await redis.initialize()
            memory = await redis.info("memory", target_nodes=redis.PRIMARIES)
            persistence = await redis.info("persistence", target_nodes=redis.PRIMARIES)
        except rexc.NoPermissionError:
            log.warning(
                "%s: INFO is not allowed for this user; skipped the config checks", self._where
            )
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, "connect")
        else:
            for node, info in memory.items():
                check_config(self._where, info, persistence.get(node, {}))
        await self._load_library()
        queues = await self.known_queues()
        problems = check_slots(self.keys, queues)
        if problems:
            raise ConfigError(problems)
        self._epoch.reset()
        self._queues_seen.clear()
        await migrate_layout(self)
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
        keys = [self.keys.epoch, *(self.keys.queue_epoch(q) for q in sorted(self._queues_seen))]
        return await self._check_epochs(keys)

    async def _check_epochs(self, keys: Sequence[str]) -> bool:
        candidates = [secrets.token_hex(8) for _ in keys]
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = [
            ("epoch", [key], [self.keys.prefix, candidate])
            for key, candidate in zip(keys, candidates, strict=True)
        ]
        replies = await self._eval_many(calls)
        seen = [
            (key, text(epoch), candidate)
            for key, epoch, candidate in zip(keys, replies, candidates, strict=True)
        ]
        return self._epoch.saw(seen, self._where)

    async def _note_queues(self, queues: Sequence[str]) -> None:
        """First use of a queue by this broker: add it to the queue registry (so an id
        given without its queue is looked for there) and start watching its epoch."""
        if self._queues_seen.issuperset(queues):
            return  # the usual case: a claim or enqueue of known queues costs a set lookup
        new = sorted(q for q in dict.fromkeys(queues) if q not in self._queues_seen)
        if self.cluster:
            problems = check_slots(self.keys, new)
            if problems:
                raise ConfigError(problems)
        with self._translate("queue registry"):
            await self._conn().sadd(self.keys.queues, *new)
        self._queues_seen.update(new)
        await self._check_epochs([self.keys.queue_epoch(q) for q in new])

    async def known_queues(self) -> list[str]:
        """Every queue of the queue registry and every queue this broker used, sorted."""
        with self._translate("queue registry"):
            members = await self._conn().smembers(self.keys.queues)
        return sorted({text(q) for q in members} | self._queues_seen)

    async def _locate(self, ids: Sequence[str]) -> dict[str, str]:
        """Job id -> its queue, for ids given without one: looked for in every known
        queue at once (per queue and id: EXISTS of its key, HEXISTS in the waiting index;
        one round trip). A job id is unique per queue; an id found in several queues maps
        to the first by name."""
        unique = list(dict.fromkeys(ids))
        queues = await self.known_queues()
        if not unique or not queues:
            return {}
        pipe = self._conn().pipeline(transaction=False)
        pairs = [(q, i) for q in queues for i in unique]
        for q, i in pairs:
            pipe.exists(self.keys.job(q, i))
            pipe.hexists(self.keys.index(q, i), i)
        with self._translate("locate"):
            found = await pipe.execute()
        where: dict[str, str] = {}
        for n, (q, i) in enumerate(pairs):
            if (found[2 * n] or found[2 * n + 1]) and i not in where:
                where[i] = q
        return where

    async def _queues_of(self, ids: Sequence[str], queue: str | None) -> list[str | None]:
        """The queue of each id: ``queue`` when given, else looked up (None: no such job)."""
        if queue is not None:
            check_name("queue", queue)
            return [queue] * len(ids)
        where = await self._locate(ids)
        return [where.get(i) for i in ids]

    async def _held_queues(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]:
        """The queue of each (id, token) this broker claimed; others looked up."""
        out: list[str | None] = []
        missing: list[str] = []
        for job_id, token in pairs:
            held = self._held.get(token)
            if held is not None and held[0] == job_id:
                out.append(held[1])
            else:
                out.append(None)
                missing.append(job_id)
        if missing:
            where = await self._locate(missing)
            out = [
                q if q is not None else where.get(job_id)
                for q, (job_id, _) in zip(out, pairs, strict=True)
            ]
        return out

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
            if self.cluster:
                redis: Any = self._conn()
                per_node = await redis.info("memory", target_nodes=redis.PRIMARIES)
                # The fullest primary decides (a queue on it is refused first).
                info = max(
                    per_node.values(),
                    key=lambda i: as_int(i.get("used_memory")) / max(1, as_int(i.get("maxmemory"))),
                )
                return self._memory.saw(info, self._where)
            info = await self._conn().info("memory")
        except rexc.NoPermissionError:
            self._memory.denied()
            return self.at_maxmemory
        except (rexc.RedisError, OSError):
            return self.at_maxmemory
        return self._memory.saw(info, self._where)

    async def close(self) -> None:
        if self._acks and self._redis is not None:
            acks, self._acks = self._acks, {}
            with contextlib.suppress(BrokerError):
                await self._eval_many(self._ack_calls(acks))
        await self._notes.close()
        self._registrations.clear()
        blocking, self._blocking = list(self._blocking.values()), {}
        for held in blocking:
            with contextlib.suppress(Exception):
                await self._give_back(held)
        lane, self._lane = self._lane, None
        if lane is not None:
            with contextlib.suppress(Exception):
                await lane.close()
        await self._close_readers()
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
        if isinstance(exc, rexc.ResponseError) and "user_function:" in str(exc):
            # An error raised in the library: say which file and line it is from.
            exc = type(exc)(self._library.locate(str(exc)))
        return broker_error(
            exc, op, where=self._where, prefix=self.keys.prefix, password=self._password
        )

    @contextlib.contextmanager
    def _translate(self, op: str) -> Iterator[None]:
        try:
            yield
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, op)

    async def _deliver(self, handoffs: Sequence[Handoff]) -> int:
        """Apply the outbox entries of flows across slots (and the next steps of a flow's
        end: ``flow_end`` in ``lua/common/flow_settle.lua``) on their targets' slots: one
        ``flow_apply`` per target queue, all in one round trip; the applies' own
        hand-offs next, round trip after round trip, until none is left (a flow's end in
        bounded steps is hundreds of them: a loop here, not a recursion per step). A
        failure is logged and leaves the entries to the reaper pass: the settle that
        wrote them has happened.

        Applied entries are deleted from their outboxes (``flow_ack``) with the next
        round trip that carries applies, or before the next reaper pass, or at close:
        deleting is only clean-up (an entry applied again changes nothing), so it adds
        no round trip of its own to a hand-off.

        Answers how many jobs the steps of a flow's end that a purge began deleted for
        that purge (``purge``: it counts them; 0 in every other delivery)."""
        pending = _delivering.get()
        if pending is not None:
            # An apply's own hand-offs (this task is in the loop below): the loop's.
            pending.extend(handoffs)
            return 0
        todo: list[Handoff] = list(handoffs)
        token = _delivering.set(todo)
        purged = 0
        try:
            while todo:
                batch = todo[:]
                del todo[:]
                purged += await self._deliver_once(batch)
        finally:
            _delivering.reset(token)
        return purged

    async def _deliver_once(self, handoffs: Sequence[Handoff]) -> int:
        """One round trip of :meth:`_deliver` (the applies' hand-offs join its list);
        the jobs its applies deleted for a purge."""
        acks, self._acks = self._acks, {}
        by_target: dict[str, list[bytes]] = {}
        k = self.keys
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        for h in handoffs:
            if _chunk_entry(h.entry):
                # A chunk of a fan-out's members to start (or drop): a script of its own.
                calls.append(("flow_apply", [k.seq(h.target)], [k.prefix, h.target, h.record]))
            else:
                by_target.setdefault(h.target, []).append(h.record)
        calls += [
            ("flow_apply", [k.seq(q)], [k.prefix, q, *records]) for q, records in by_target.items()
        ]
        applies = len(calls)
        calls += self._ack_calls(acks)
        try:
            replies = await self._eval_many(calls)
        except BrokerError as exc:
            for home, entries in acks.items():
                self._acks.setdefault(home, []).extend(entries)
            log.warning(
                "%d hand-offs of flows across slots were not applied now (%s); the reaper "
                "pass applies them",
                len(handoffs),
                exc,
            )
            return 0
        # (A purge's flow-end step answers [1, jobs deleted]; every other record 1 or 0.)
        purged = sum(int(r[1]) for reply in replies[:applies] for r in reply if isinstance(r, list))
        for h in handoffs:
            # (A flow's end's step, '<F>|z|<n>', deletes its own entry: no ack. Job ids
            # hold no '|'.)
            if "|z|" not in h.entry:
                self._acks.setdefault(h.home, []).append(h.entry)
        return purged

    def _ack_calls(
        self, acks: dict[str, list[str]]
    ) -> list[tuple[str, Sequence[str], Sequence[Any]]]:
        """The ``flow_ack`` calls that delete applied outbox entries, one per queue."""
        k = self.keys
        return [("flow_ack", [k.outbox(q)], [k.prefix, q, *entries]) for q, entries in acks.items()]

    def _retention(self, *, completed: bool) -> tuple[int, int]:
        r = self.settings.retention
        if completed:
            return us(r.completed_ttl), r.completed_max
        return us(r.failed_ttl), r.failed_max
