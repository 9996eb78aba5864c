"""Wake-ups from Redis pub/sub: new work, finished jobs, cancel requests; never polling.

Scripts publish when a queue gets work (the work channel, naming the queues), when jobs
reach a final state (the done channel, naming the jobs) and when a running job is asked to
cancel (the cancel channel).

Standalone Redis: app-wide channels, ``PUBLISH``. One dedicated pub/sub connection per
broker carries them; one listener task does all I/O on it (concurrent reads and reconnects
would corrupt it).

Redis Cluster: each queue has its own channels, tagged like its keys, so they live in the
queue's slot; scripts ``SPUBLISH`` there and a notice travels only within the shard that
holds the queue (a ``PUBLISH`` would be broadcast to every node of the cluster). A
process subscribes (``SSUBSCRIBE``) on one connection per node owning a slot it listens
to, each read by its own task; a router task places channels on nodes by the cluster client's slot map.
A connection that fails (its node died) or a ``sunsubscribe`` pushed by Redis (the slot
moved: failover, resharding) sends its channels back to the router, which re-reads the
slot map and subscribes them at their new owner.

Every (re)subscription counts as a notification, so nothing published while the
connection was down is missed: waiters look at Redis again. Work notifications bump
per-queue generations, so one that lands between a claim and the following wait is not
lost: the wait compares against the generation seen when the claim was sent.

Work is announced only to waiters: a claim that comes up short sets its queues' waiter
marks (keys.py ``Q W``) in the same script, and the next script giving such a queue work
consumes the mark and publishes (one notice wakes every waiter). While workers are busy
(their claims fill up), enqueues publish nothing and listeners read nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import anyio
import redis.asyncio as aioredis
from anyio.abc import TaskStatus
from redis.crc import key_slot

from .codec import MICRO, text
from .connection import SOCKET_TIMEOUT
from .errors import scrub
from .keys import Keys

__all__ = ["Notifications"]

log = logging.getLogger("typedq.broker.redis")

#: Seconds of silence on the pub/sub connection before we PING it ourselves.
_PUBSUB_PING_AFTER = 10.0


class _KeepAlive:
    """Liveness of one pub/sub connection: a PING after a quiet spell, and a PING left
    unanswered for SOCKET_TIMEOUT means the connection is half open (silent)."""

    __slots__ = ("last_heard", "pinged_at")

    def __init__(self) -> None:
        self.last_heard = time.monotonic()
        self.pinged_at: float | None = None

    def heard(self) -> None:
        """Something arrived (or the connection was replaced): the clock starts again."""
        self.last_heard, self.pinged_at = time.monotonic(), None

    async def silent(self, pubsub: Any) -> bool:
        """After a read that brought nothing: PING when due; True once a PING went
        unanswered for SOCKET_TIMEOUT."""
        now = time.monotonic()
        if self.pinged_at is None:
            if now - self.last_heard > _PUBSUB_PING_AFTER:
                await pubsub.ping()
                self.pinged_at = now
            return False
        return now - self.pinged_at > SOCKET_TIMEOUT


class _DoneWaiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


class _Idle(Exception):
    """A node's pub/sub connection lost its last channel (they moved to other nodes)."""


class _Shard:
    """The sharded pub/sub connection to one cluster node and the channels placed on it."""

    __slots__ = ("channels", "client", "name", "pending", "pubsub", "scope", "task")

    def __init__(self, name: str, client: aioredis.Redis) -> None:
        self.name = name
        self.client = client
        self.pubsub: Any = client.pubsub()
        #: Channels placed on this node, and those of them not SSUBSCRIBEd yet.
        self.channels: set[str] = set()
        self.pending: set[str] = set()
        self.scope: anyio.CancelScope | None = None
        self.task: asyncio.Task[None] | None = None

    def add(self, channel: str) -> None:
        self.channels.add(channel)
        self.pending.add(channel)
        if self.scope is not None:
            # Interrupt the read so the reader subscribes now (see Notifications.subscribe).
            self.scope.cancel()

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self.pubsub.aclose()
        with contextlib.suppress(Exception):
            await self.client.aclose()


def _key(queues: Sequence[str]) -> tuple[str, ...]:
    """The set of ``queues`` whatever their order (claims rotate it, see
    typedq.settling.QueueRotation; a wait names the worker's own order)."""
    if len(queues) == 1:
        return (queues[0],)
    return tuple(sorted(set(queues)))


async def _stop(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended."""
    while task is not None and not task.done():
        # The listener's read scope swallows this cancel when a new subscription
        # cancelled that scope at the same moment: cancel again until it ends.
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({task}, timeout=0.1)


class Notifications:
    """The pub/sub side of one Redis broker: subscriptions, the listener task, waiters."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        #: True on Redis Cluster: per-queue channels, sharded pub/sub.
        self.sharded = False
        self._open = False
        self._client: aioredis.Redis | None = None
        # Redis Cluster: the cluster client (its slot map), how to connect to one node,
        # the connection per node, channels waiting for a node, the router task.
        self._cluster: Any = None
        self._node_client: Callable[[str, int], aioredis.Redis] | None = None
        self._shards: dict[str, _Shard] = {}
        self._unrouted: set[str] = set()
        self._route_wake = anyio.Event()
        self._refresh = False
        self._route_failures = 0
        self._router: asyncio.Task[None] | None = None
        # Channel -> (kind 'w' 'd' 'x', its queue or None for an app-wide channel).
        self._kinds: dict[str, tuple[str, str | None]] = {
            keys.work_channel: ("w", None),
            keys.done_channel: ("d", None),
            keys.cancel_channel: ("x", None),
        }
        # Queues claimed from (sharded: whose cancel channels a worker listens to).
        self._claimed: set[str] = set()
        #: Channel -> how many times Redis confirmed its subscription (re-subscriptions
        #: after a lost connection or a moved slot included): for diagnostics and tests.
        self.confirmed: dict[str, int] = {}
        self._where = "Redis"
        self._password: str | None = None
        self._pubsub: Any = None
        self._listener: asyncio.Task[None] | None = None
        # Channels asked for but not yet subscribed.
        self._pending: set[str] = set()
        self._read_scope: anyio.CancelScope | None = None
        self._sub_ready: dict[str, anyio.Event] = {}
        # Per-queue generations (+ one bumped on every resubscribe), the generation seen
        # when each set of queues was last claimed from, and when a scheduled job of
        # those queues is due (monotonic).
        self._all_gen = 0
        self._queue_gen: dict[str, int] = {}
        self._claim_gen: dict[tuple[str, ...], int] = {}
        self._next_due: dict[tuple[str, ...], float] = {}
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()
        self._done_waiters: dict[str, set[_DoneWaiter]] = {}

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` (or :meth:`open_sharded`) and :meth:`close`."""
        return self._open

    def open(self, client: aioredis.Redis, *, where: str, password: str | None) -> None:
        """Use ``client`` (one connection is enough) for the subscriptions to come."""
        self._client, self._where, self._password = client, where, password
        self.sharded = False
        self._open = True
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()

    def open_sharded(
        self,
        cluster: Any,
        node_client: Callable[[str, int], aioredis.Redis],
        *,
        where: str,
        password: str | None,
    ) -> None:
        """Redis Cluster: per-queue channels, subscribed with ``SSUBSCRIBE`` on the node
        that owns each one's slot (by ``cluster``'s slot map) over a client that
        ``node_client(host, port)`` makes (one connection is enough)."""
        self._cluster, self._node_client = cluster, node_client
        self._where, self._password = where, password
        self.sharded = True
        self._open = True
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()
        self._route_wake = anyio.Event()
        self._refresh = False
        self._route_failures = 0

    async def close(self) -> None:
        """Stop the listeners, close the pub/sub connections, wake every waiter."""
        tasks = [self._listener, self._router]
        self._listener = self._router = None
        for task in tasks:
            await _stop(task)
        # The router may start shards (a connection each) until it has ended: their tasks
        # are stopped after it, or a shard started meanwhile would outlive the broker.
        for shard in list(self._shards.values()):
            await _stop(shard.task)
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        shards, self._shards = list(self._shards.values()), {}
        for shard in shards:
            await shard.aclose()
        self._open = False
        self._client = self._cluster = None
        self._pending.clear()
        self._unrouted.clear()
        self._claimed.clear()
        self._sub_ready.clear()
        # Wake everything that waits so no task hangs on a closed broker.
        self._work_event.set()
        self._cancel_event.set()
        for waiters in self._done_waiters.values():
            for waiter in waiters:
                waiter.event.set()

    # -- channel names ---------------------------------------------------------------

    def work_channels(self, queues: Iterable[str]) -> list[str]:
        """The channels announcing work for ``queues``."""
        if not self.sharded:
            return [self.keys.work_channel]
        return [self._queue_channel(q, "w") for q in queues]

    def done_channel(self, queue: str) -> str:
        """The channel announcing finished jobs of ``queue``."""
        if not self.sharded:
            return self.keys.done_channel
        return self._queue_channel(queue, "d")

    def cancel_channels(self) -> list[str]:
        """The channels announcing cancel requests for jobs this broker may be running
        (sharded: those of every queue it claimed from)."""
        if not self.sharded:
            return [self.keys.cancel_channel]
        return [self._queue_channel(q, "x") for q in sorted(self._claimed)]

    def _queue_channel(self, queue: str, kind: str) -> str:
        channel = self.keys.queue_channel(queue, kind)
        if channel not in self._kinds:
            self._kinds[channel] = (kind, queue)
        return channel

    # -- subscribing -----------------------------------------------------------------

    async def subscribe(self, channel: str, *, wait: float | None = None) -> None:
        """Subscribe once per channel; with ``wait`` (a monotonic deadline), until confirmed."""
        ready = self._want(channel)
        if wait is not None and not ready.is_set():
            with anyio.move_on_after(min(SOCKET_TIMEOUT, max(0.0, wait - time.monotonic()))):
                await ready.wait()

    def _want(self, channel: str) -> anyio.Event:
        """Ask for ``channel`` once; the event is set when its subscription is confirmed."""
        ready = self._sub_ready.get(channel)
        if ready is not None:
            return ready
        ready = self._sub_ready[channel] = anyio.Event()
        if self.sharded:
            self._reroute([channel])
            return ready
        self._pending.add(channel)
        if self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(), name=f"typedq redis listener {self.keys.prefix}"
            )
        elif self._read_scope is not None:
            # Interrupt the listener's read so it subscribes now. Safe: a pub/sub read
            # keeps partial replies in the parser (its own timeouts work so).
            self._read_scope.cancel()
        return ready

    async def subscribe_all(self, channels: Iterable[str], *, wait: float | None = None) -> None:
        """:meth:`subscribe` each of ``channels``; all are asked for before any wait."""
        channels = list(channels)
        for channel in channels:
            await self.subscribe(channel)
        if wait is not None:
            for channel in channels:
                await self.subscribe(channel, wait=wait)

    # -- work ----------------------------------------------------------------------

    def _gen(self, queues: Sequence[str]) -> int:
        return self._all_gen + sum(self._queue_gen.get(q, 0) for q in queues)

    def claim_sent(self, queues: Sequence[str], *, refill: bool = False) -> None:
        """A claim of ``queues`` is about to run: work published after now wakes the
        next :meth:`wait_for_work` of these queues.

        :param refill: the claim refills the slots of completions sent with it (a
            worker's settle): it leaves the mark of the worker's own claim alone. A
            refill takes at most as many jobs as it completes, so work published after
            the worker's claim and before a refill may still wait; the worker's next
            wait must return for it (else jobs wait while slots are free).
        """
        if not refill:
            self._claim_gen[_key(queues)] = self._gen(queues)
        if self.sharded and not self._claimed.issuperset(queues):
            # The cancel requests of jobs claimed from these queues come on their own
            # channels: subscribe now (a confirmation wakes the cancel waiters).
            self._claimed.update(queues)
            for channel in self.cancel_channels():
                self._want(channel)

    def claim_answered(self, queues: Sequence[str], next_due_us: int) -> None:
        """The claim answered when the next scheduled job of ``queues`` is due, in
        microseconds from now (negative: none is scheduled)."""
        key = _key(queues)
        if next_due_us >= 0:
            self._next_due[key] = time.monotonic() + next_due_us / MICRO
        else:
            self._next_due.pop(key, None)

    def look_again(self, queues: Sequence[str]) -> None:
        """The next :meth:`wait_for_work` of ``queues`` returns at once (more jobs may be
        claimable that no notification will announce)."""
        self._claim_gen[_key(queues)] = -1

    async def wait_for_work(
        self,
        queues: Sequence[str],
        timeout: float,
        *,
        unclaimed: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        """Return when work was published for ``queues`` since their last claim was sent,
        when a scheduled job of theirs is due, or after ``timeout`` seconds.

        Work is published only for queues whose waiter mark is set (keys.py ``Q W``),
        which a claim that comes up short sets: a wait after such a claim is covered.

        :param unclaimed: for a wait with no claim of ``queues`` sent before it (no
            mark of its own): sets the queues' marks, then returns whether jobs wait
            already (this wait then returns at once). Called after the wait's starting
            generation is taken, so a notice published after the marks is not missed.
        """
        key = _key(queues)
        start = self._claim_gen.get(key)
        if start is None:
            start = self._gen(queues)
            if unclaimed is not None and await unclaimed():
                return
        await self.subscribe_all(self.work_channels(queues))
        wait = timeout
        due = self._next_due.get(key)
        if due is not None:
            # Do not sleep past the next scheduled job: it must be claimed when due.
            wait = min(wait, max(0.0, due - time.monotonic()))
        deadline = time.monotonic() + wait
        while self._gen(queues) == start and self.is_open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            event = self._work_event
            with anyio.move_on_after(remaining):
                await event.wait()

    # -- cancel requests and finished jobs -------------------------------------------

    async def wait_cancel(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Return soon after a cancel request is published, or after ``timeout``.

        :param task_status: ``started()`` once subscribed to the cancel channel (or, if the
            subscription is not confirmed in time, when giving up on it)
        """
        if task_status is anyio.TASK_STATUS_IGNORED:
            # Taken before subscribing: the first subscription's confirmation wakes this
            # wait too (the caller looks again), so a request made meanwhile is not missed.
            event = self._cancel_event
            await self.subscribe_all(self.cancel_channels())
        else:
            # Someone waits until this wait is armed: once the subscription is confirmed,
            # only what is published from then on (or a resubscription) wakes it.
            await self.subscribe_all(self.cancel_channels(), wait=time.monotonic() + timeout)
            event = self._cancel_event
            task_status.started()
        with anyio.move_on_after(timeout):
            await event.wait()

    @contextlib.contextmanager
    def done_waiter(self, job_id: str) -> Iterator[_DoneWaiter]:
        """A waiter woken when ``job_id`` is announced finished (or on any resubscribe).

        Give it a fresh ``event`` before each look at Redis, so a notice that lands between
        the look and the wait still wakes it.
        """
        waiter = _DoneWaiter()
        self._done_waiters.setdefault(job_id, set()).add(waiter)
        try:
            yield waiter
        finally:
            waiters = self._done_waiters.get(job_id)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._done_waiters[job_id]

    # -- the listener ----------------------------------------------------------------

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

    def _subscribed(self, channel: str) -> None:
        """``channel`` is (again) subscribed: whatever was published while we were not
        listening is lost, so every waiter of this channel looks at Redis again."""
        ready = self._sub_ready.get(channel)
        if ready is not None:
            ready.set()
        self.confirmed[channel] = self.confirmed.get(channel, 0) + 1
        self._lost(channel)

    def _lost(self, channel: str) -> None:
        """Notices of ``channel`` may have been missed: its waiters look at Redis again."""
        kind, queue = self._kinds.get(channel, ("", None))
        if kind == "w":
            if queue is None:
                self._all_gen += 1
            else:
                self._queue_gen[queue] = self._queue_gen.get(queue, 0) + 1
            self._wake_work()
        elif kind == "x":
            self._wake_cancel()
        elif kind == "d":
            self._wake_done(None)

    def _message(self, channel: str, data: list[str]) -> None:
        kind = self._kinds.get(channel, ("", None))[0]
        if kind == "w":
            for queue in data:
                self._queue_gen[queue] = self._queue_gen.get(queue, 0) + 1
            self._wake_work()
        elif kind == "d":
            self._wake_done(data)
        elif kind == "x":
            self._wake_cancel()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = text(message.get("channel", b""))
        if kind == "subscribe":
            self._subscribed(channel)
        elif kind == "message":
            self._message(channel, text(message.get("data", b"")).split())

    async def _listen(self) -> None:
        failures = 0
        alive = _KeepAlive()
        # The event loop's own scope class: one scope per message read, and
        # anyio.CancelScope() finds the backend anew on every call.
        scope_class = type(anyio.CancelScope())
        assert self._client is not None
        pubsub = self._pubsub = self._client.pubsub()
        while True:
            try:
                while self._pending:
                    channels = sorted(self._pending)
                    await pubsub.subscribe(*channels)
                    self._pending.difference_update(channels)
                with scope_class() as scope:
                    self._read_scope = scope
                    message = await pubsub.get_message(timeout=1.0)
                self._read_scope = None
                if scope.cancelled_caught:
                    continue
                if message is None:
                    if await alive.silent(pubsub):
                        # Half-open connection: our PING got no answer. Drop it; the
                        # next read reconnects and resubscribes.
                        log.warning("%s: pub/sub connection silent; reconnecting", self._where)
                        alive.heard()
                        connection: Any = pubsub.connection  # typed as None in redis-py
                        if connection is not None:
                            await connection.disconnect()
                        self._wake_all()
                    continue
                alive.heard()
                failures = 0
                self._dispatch(message)
                # Let whoever this woke (a worker's claim loop) run before this task
                # re-arms its read (tens of microseconds in redis-py): the claim goes out
                # that much sooner.
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._read_scope = None
                failures += 1
                if failures == 1 or failures % 30 == 0:
                    log.warning(
                        "%s: pub/sub listener error (%s); reconnecting",
                        self._where,
                        scrub(str(exc), self._password),
                    )
                # Waiters re-check Redis themselves (and meet the error there).
                self._wake_all()
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))

    # -- sharded pub/sub (Redis Cluster) ---------------------------------------------

    def _reroute(self, channels: Iterable[str]) -> None:
        """Have the router place ``channels`` on the node owning their slot (again)."""
        self._unrouted.update(channels)
        self._route_wake.set()
        if self._router is None:
            self._router = asyncio.get_running_loop().create_task(
                self._route(), name=f"typedq redis shard router {self.keys.prefix}"
            )

    async def _route(self) -> None:
        while True:
            if not self._unrouted:
                self._route_wake = anyio.Event()
                await self._route_wake.wait()
                continue
            if self._route_failures:
                # Back off while the cluster settles (a failover takes a node timeout).
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(self._route_failures, 6)))
            channels = set(self._unrouted)
            try:
                manager = self._cluster.nodes_manager
                refreshed = self._refresh
                if refreshed:
                    # The slot map may be stale (a node failed, a slot moved): re-read it.
                    await manager.initialize()
                    self._refresh = False
                by_node: dict[str, tuple[Any, list[str]]] = {}
                for channel in channels:
                    node = manager.get_node_from_slot(key_slot(channel.encode()))
                    by_node.setdefault(node.name, (node, []))[1].append(channel)
                for name, (node, placed) in by_node.items():
                    if name not in self._shards or refreshed:
                        await self._check_owner(node, {key_slot(c.encode()) for c in placed})
                    # Looked up after the await: the connection may have ended meanwhile.
                    shard = self._shards.get(name)
                    if shard is None:
                        shard = self._start_shard(name, node.host, node.port)
                    for channel in placed:
                        shard.add(channel)
                        self._unrouted.discard(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._route_failures += 1
                self._refresh = True
                if self._route_failures == 1 or self._route_failures % 30 == 0:
                    log.warning(
                        "%s: cannot place pub/sub channels on the cluster's nodes (%s); retrying",
                        self._where,
                        scrub(str(exc), self._password),
                    )

    async def _check_owner(self, node: Any, slots: set[int]) -> None:
        """Raise unless ``node`` itself says it is the primary of each of ``slots``. The
        slot map just read may come from a node that has not heard of a failover yet; the
        old primary, now a replica, accepts ``SSUBSCRIBE`` too, but its subscribers were
        seen to miss the new primary's notices: channels go to their primary only."""
        owners = await self._cluster.execute_command("CLUSTER SLOTS", target_nodes=node)
        for slot in slots:
            primary = next(
                (v["primary"] for (lo, hi), v in owners.items() if lo <= slot <= hi), None
            )
            if primary is None or (str(primary[0]), int(primary[1])) != (node.host, node.port):
                raise RuntimeError(f"{node.name} does not serve slot {slot} (stale slot map)")

    def _start_shard(self, name: str, host: str, port: int) -> _Shard:
        assert self._node_client is not None
        shard = self._shards[name] = _Shard(name, self._node_client(host, port))
        shard.task = asyncio.get_running_loop().create_task(
            self._read_shard(shard), name=f"typedq redis shard listener {name}"
        )
        return shard

    async def _read_shard(self, shard: _Shard) -> None:
        """All I/O on one node's sharded pub/sub connection; when it fails, its channels
        go back to the router."""
        try:
            await self._shard_loop(shard)
        except asyncio.CancelledError:
            raise
        except _Idle:
            # Every channel moved to other nodes: this connection has nothing left to do.
            if self._shards.get(shard.name) is shard:
                del self._shards[shard.name]
            await shard.aclose()
        except Exception as exc:
            shard.scope = None
            self._route_failures += 1
            log.warning(
                "%s: sharded pub/sub connection to %s lost (%s); subscribing again",
                self._where,
                shard.name,
                scrub(str(exc), self._password),
            )
            if self._shards.get(shard.name) is shard:
                del self._shards[shard.name]
            self._refresh = True
            for channel in shard.channels:
                self._lost(channel)
            self._reroute(shard.channels)
            await shard.aclose()

    async def _shard_loop(self, shard: _Shard) -> None:
        alive = _KeepAlive()
        pubsub = shard.pubsub
        while True:
            while shard.pending:
                # One SSUBSCRIBE per slot: Redis refuses channels of several slots at once.
                slot = key_slot(min(shard.pending).encode())
                channels = sorted(c for c in shard.pending if key_slot(c.encode()) == slot)
                await pubsub.ssubscribe(*channels)
                shard.pending.difference_update(channels)
            with anyio.CancelScope() as scope:
                shard.scope = scope
                message = await pubsub.get_message(timeout=1.0)
            shard.scope = None
            if scope.cancelled_caught:
                continue
            if message is None:
                if await alive.silent(pubsub):
                    raise ConnectionError("sharded pub/sub connection silent")
                continue
            alive.heard()
            kind = message.get("type")
            channel = text(message.get("channel") or b"")
            if kind == "smessage":
                self._message(channel, text(message.get("data", b"")).split())
            elif kind == "ssubscribe":
                self._route_failures = 0
                self._subscribed(channel)
            elif kind == "sunsubscribe" and channel in shard.channels:
                # We did not ask for it: Redis dropped the subscription because the
                # slot left this node (failover, resharding). Subscribe at the new owner.
                log.info(
                    "%s: %s left %s (failover or resharding); subscribing at its new owner",
                    self._where,
                    channel,
                    shard.name,
                )
                shard.channels.discard(channel)
                shard.pending.discard(channel)
                self._refresh = True
                self._lost(channel)
                self._reroute([channel])
                if not shard.channels:
                    raise _Idle
