"""The pub/sub connection of a standalone Redis: one connection, one task reading it.

All I/O on the connection happens in that task (concurrent reads and reconnects would
corrupt it): it subscribes the channels asked for, reads what arrives and hands it to a
:class:`Sink` (the broker's :class:`~typedq.broker.redis.listener.Notifications`), and
reconnects after an error or a silence (:class:`KeepAlive`), resubscribing everything.
Redis Cluster uses :mod:`.shards` instead; both share :class:`KeepAlive` and
:func:`stop_task`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

import anyio
import redis.asyncio as aioredis

from .codec import text
from .connection import SOCKET_TIMEOUT
from .errors import scrub

__all__ = ["PUBSUB_PING_AFTER", "KeepAlive", "PubSubConnection", "Sink", "stop_task"]

log = logging.getLogger("typedq.broker.redis")

#: Seconds of silence on the pub/sub connection before we PING it ourselves.
PUBSUB_PING_AFTER = 10.0


class KeepAlive:
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
            if now - self.last_heard > PUBSUB_PING_AFTER:
                await pubsub.ping()
                self.pinged_at = now
            return False
        return now - self.pinged_at > SOCKET_TIMEOUT


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` and wait until it has ended."""
    while task is not None and not task.done():
        # The listener's read scope swallows this cancel when a new subscription
        # cancelled that scope at the same moment: cancel again until it ends.
        task.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.wait({task}, timeout=0.1)


class Sink(Protocol):
    """Where a pub/sub reader hands what it reads (and what it may have missed)."""

    def subscribed(self, channel: str) -> None:
        """Redis confirmed a subscription to ``channel`` (again)."""

    def message(self, channel: str, data: list[str]) -> None:
        """A notice on ``channel``: its words."""

    def lost(self, channel: str) -> None:
        """Notices of ``channel`` may have been missed."""

    def wake_all(self) -> None:
        """Notices of every channel may have been missed."""


class PubSubConnection:
    """The pub/sub connection of a standalone Redis and the task doing all I/O on it.

    :param sink: gets the notices read, and is told when some may have been missed
    :param name: the reading task's name
    """

    def __init__(self, sink: Sink, *, name: str) -> None:
        self._sink = sink
        self._name = name
        self._client: aioredis.Redis | None = None
        self._where = "Redis"
        self._password: str | None = None
        self._pubsub: Any = None
        self._task: asyncio.Task[None] | None = None
        # Channels asked for but not yet subscribed.
        self._pending: set[str] = set()
        self._read_scope: anyio.CancelScope | None = None

    def open(self, client: aioredis.Redis, *, where: str, password: str | None) -> None:
        """Use ``client`` (one connection is enough) for the subscriptions to come."""
        self._client, self._where, self._password = client, where, password

    def want(self, channel: str) -> None:
        """Subscribe ``channel`` soon (the reading task starts on the first one)."""
        self._pending.add(channel)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._listen(), name=self._name)
        elif self._read_scope is not None:
            # Interrupt the listener's read so it subscribes now. Safe: a pub/sub read
            # keeps partial replies in the parser (its own timeouts work so).
            self._read_scope.cancel()

    async def stop(self) -> None:
        """Stop the reading task."""
        task, self._task = self._task, None
        await stop_task(task)

    async def aclose(self) -> None:
        """Close the connection and forget the channels asked for (after :meth:`stop`)."""
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
        self._client = None
        self._pending.clear()

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = text(message.get("channel", b""))
        if kind == "subscribe":
            self._sink.subscribed(channel)
        elif kind == "message":
            self._sink.message(channel, text(message.get("data", b"")).split())

    async def _listen(self) -> None:
        failures = 0
        alive = KeepAlive()
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
                        self._sink.wake_all()
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
                self._sink.wake_all()
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
