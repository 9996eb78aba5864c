"""Sharded pub/sub on Redis Cluster: a router placing channels on nodes, one reader per node.

Each queue's channels live in its slot, so a process subscribes (``SSUBSCRIBE``) on one
connection per node owning a slot it listens to, each read by its own task
(:class:`Shard`). The router task places channels on nodes by the cluster client's slot
map, after checking with the node that it is the slot's primary. A connection that fails
(its node died) or a ``sunsubscribe`` pushed by Redis (the slot moved: failover,
resharding) sends its channels back to the router, which re-reads the slot map and
subscribes them at their new owner; the :class:`~.pubsub.Sink` is told their notices
may have been missed. A standalone Redis uses :mod:`.pubsub` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import redis.asyncio as aioredis
from redis.crc import key_slot

from .codec import text
from .errors import scrub
from .pubsub import KeepAlive, Sink, stop_task

__all__ = ["Shard", "ShardedPubSub"]

log = logging.getLogger("typedq.broker.redis")


class _Idle(Exception):
    """A node's pub/sub connection lost its last channel (they moved to other nodes)."""


class Shard:
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
        """Place ``channel`` on this node: its reader subscribes it next."""
        self.channels.add(channel)
        self.pending.add(channel)
        if self.scope is not None:
            # Interrupt the read so the reader subscribes now (as PubSubConnection.want does).
            self.scope.cancel()

    async def aclose(self) -> None:
        """Close the connection and its client (errors ignored: it may be gone)."""
        with contextlib.suppress(Exception):
            await self.pubsub.aclose()
        with contextlib.suppress(Exception):
            await self.client.aclose()


class ShardedPubSub:
    """The sharded pub/sub connections of one broker on Redis Cluster, and their router.

    :param sink: gets the notices read, and is told when some may have been missed
    :param name: the router task's name
    """

    def __init__(self, sink: Sink, *, name: str) -> None:
        self._sink = sink
        self._name = name
        # The cluster client (its slot map), how to connect to one node, the connection
        # per node, channels waiting for a node, the router task.
        self._cluster: Any = None
        self._node_client: Callable[[str, int], aioredis.Redis] | None = None
        self._shards: dict[str, Shard] = {}
        self._unrouted: set[str] = set()
        self._route_wake = anyio.Event()
        self._refresh = False
        self._route_failures = 0
        self._router: asyncio.Task[None] | None = None
        self._where = "Redis"
        self._password: str | None = None

    def open(
        self,
        cluster: Any,
        node_client: Callable[[str, int], aioredis.Redis],
        *,
        where: str,
        password: str | None,
    ) -> None:
        """Place channels by ``cluster``'s slot map, on clients ``node_client(host, port)``
        makes (one connection is enough)."""
        self._cluster, self._node_client = cluster, node_client
        self._where, self._password = where, password
        self._route_wake = anyio.Event()
        self._refresh = False
        self._route_failures = 0

    async def stop(self) -> None:
        """Stop the router, then each node's reader."""
        router, self._router = self._router, None
        await stop_task(router)
        # The router may start shards (a connection each) until it has ended: their tasks
        # are stopped after it, or a shard started meanwhile would outlive the broker.
        for shard in list(self._shards.values()):
            await stop_task(shard.task)

    async def aclose(self) -> None:
        """Close every node's connection and forget the channels (after :meth:`stop`)."""
        shards, self._shards = list(self._shards.values()), {}
        for shard in shards:
            await shard.aclose()
        self._cluster = None
        self._unrouted.clear()

    def reroute(self, channels: Iterable[str]) -> None:
        """Have the router place ``channels`` on the node owning their slot (again)."""
        self._unrouted.update(channels)
        self._route_wake.set()
        if self._router is None:
            self._router = asyncio.get_running_loop().create_task(self._route(), name=self._name)

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

    def _start_shard(self, name: str, host: str, port: int) -> Shard:
        assert self._node_client is not None
        shard = self._shards[name] = Shard(name, self._node_client(host, port))
        shard.task = asyncio.get_running_loop().create_task(
            self._read_shard(shard), name=f"typedq redis shard listener {name}"
        )
        return shard

    async def _read_shard(self, shard: Shard) -> None:
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
                self._sink.lost(channel)
            self.reroute(shard.channels)
            await shard.aclose()

    async def _shard_loop(self, shard: Shard) -> None:
        alive = KeepAlive()
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
                self._sink.message(channel, text(message.get("data", b"")).split())
            elif kind == "ssubscribe":
                self._route_failures = 0
                self._sink.subscribed(channel)
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
                self._sink.lost(channel)
                self.reroute([channel])
                if not shard.channels:
                    raise _Idle
