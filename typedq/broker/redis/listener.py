"""Wake-ups from Redis pub/sub: new work, finished jobs, cancel requests; never polling.

Scripts publish when a queue gets work (the work channel, naming the queues), when jobs
reach a final state (the done channel, naming the jobs) and when a running job is asked to
cancel (the cancel channel).

Standalone Redis: app-wide channels, ``PUBLISH``. One dedicated pub/sub connection per
broker carries them; one listener task does all I/O on it (concurrent reads and reconnects
would corrupt it): :mod:`.pubsub`.

Redis Cluster: each queue has its own channels, tagged like its keys, so they live in the
queue's slot; scripts ``SPUBLISH`` there and a notice travels only within the shard that
holds the queue (a ``PUBLISH`` would be broadcast to every node of the cluster). A
process subscribes (``SSUBSCRIBE``) on one connection per node owning a slot it listens
to, each read by its own task; a router task places channels on nodes by the cluster client's slot map.
A connection that fails (its node died) or a ``sunsubscribe`` pushed by Redis (the slot
moved: failover, resharding) sends its channels back to the router, which re-reads the
slot map and subscribes them at their new owner: :mod:`.shards`.

This module keeps what both share: the channels, the subscriptions asked for, and the
waiters the notices wake.

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

import contextlib
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

import anyio
import redis.asyncio as aioredis
from anyio.abc import TaskStatus

from .codec import MICRO
from .connection import SOCKET_TIMEOUT
from .keys import Keys
from .pubsub import PubSubConnection
from .shards import ShardedPubSub

__all__ = ["Notifications"]


class _DoneWaiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


def _key(queues: Sequence[str]) -> tuple[str, ...]:
    """The set of ``queues`` whatever their order (claims rotate it, see
    typedq.settling.QueueRotation; a wait names the worker's own order)."""
    if len(queues) == 1:
        return (queues[0],)
    return tuple(sorted(set(queues)))


class Notifications:
    """The pub/sub side of one Redis broker: channels, subscriptions, and the waiters'
    registry (generations, events, done waiters) that notices wake.

    The reading is done by a :class:`~.pubsub.PubSubConnection` (standalone Redis) or a
    :class:`~.shards.ShardedPubSub` (Redis Cluster), which hand what they read here.
    """

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        #: True on Redis Cluster: per-queue channels, sharded pub/sub.
        self.sharded = False
        self._open = False
        # The one pub/sub connection (standalone), or one per node (Redis Cluster).
        self._conn = PubSubConnection(self, name=f"typedq redis listener {keys.prefix}")
        self._shards = ShardedPubSub(self, name=f"typedq redis shard router {keys.prefix}")
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
        self._conn.open(client, where=where, password=password)
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
        self._shards.open(cluster, node_client, where=where, password=password)
        self.sharded = True
        self._open = True
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()

    async def close(self) -> None:
        """Stop the listeners, close the pub/sub connections, wake every waiter."""
        await self._conn.stop()
        await self._shards.stop()
        await self._conn.aclose()
        await self._shards.aclose()
        self._open = False
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
            self._shards.reroute([channel])
        else:
            self._conn.want(channel)
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

    def looking_again(self, queues: Sequence[str]) -> bool:
        """Whether :meth:`look_again` was called for ``queues`` since their last claim."""
        return self._claim_gen.get(_key(queues)) == -1

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

    # -- wake-ups (what the readers hand over: this is their Sink) ---------------------

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

    def wake_all(self) -> None:
        """Notices of every channel may have been missed: every waiter looks again."""
        self._all_gen += 1
        self._wake_work()
        self._wake_cancel()
        self._wake_done(None)

    def subscribed(self, channel: str) -> None:
        """``channel`` is (again) subscribed: whatever was published while we were not
        listening is lost, so every waiter of this channel looks at Redis again."""
        ready = self._sub_ready.get(channel)
        if ready is not None:
            ready.set()
        self.confirmed[channel] = self.confirmed.get(channel, 0) + 1
        self.lost(channel)

    def lost(self, channel: str) -> None:
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

    def message(self, channel: str, data: list[str]) -> None:
        """A notice on ``channel``: the queues that got work, or the finished jobs."""
        kind = self._kinds.get(channel, ("", None))[0]
        if kind == "w":
            for queue in data:
                self._queue_gen[queue] = self._queue_gen.get(queue, 0) + 1
            self._wake_work()
        elif kind == "d":
            self._wake_done(data)
        elif kind == "x":
            self._wake_cancel()
