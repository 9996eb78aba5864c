"""Wake-ups from Redis pub/sub: new work, finished jobs, cancel requests; never polling.

Scripts ``PUBLISH`` when a queue gets work (the work channel, naming the queues), when jobs
reach a final state (the done channel, naming the jobs) and when a running job is asked to
cancel (the cancel channel). One dedicated pub/sub connection per broker carries them; one
listener task does all I/O on it (concurrent reads and reconnects would corrupt it).

Every (re)subscription counts as a notification, so nothing published while the
connection was down is missed: waiters look at Redis again. Work notifications bump
per-queue generations, so one that lands between a claim and the following wait is not
lost: the wait compares against the generation seen when the claim was sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import redis.asyncio as aioredis
from anyio.abc import TaskStatus

from ..keys import Keys
from .codec import MICRO, text
from .connection import SOCKET_TIMEOUT
from .errors import scrub

__all__ = ["Notifications"]

log = logging.getLogger("typedq.broker.redis")

#: Seconds of silence on the pub/sub connection before we PING it ourselves.
_PUBSUB_PING_AFTER = 10.0


class _DoneWaiter:
    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = anyio.Event()


class Notifications:
    """The pub/sub side of one Redis broker: subscriptions, the listener task, waiters."""

    def __init__(self, keys: Keys) -> None:
        self.keys = keys
        self._client: aioredis.Redis | None = None
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
        """True between :meth:`open` and :meth:`close`."""
        return self._client is not None

    def open(self, client: aioredis.Redis, *, where: str, password: str | None) -> None:
        """Use ``client`` (one connection is enough) for the subscriptions to come."""
        self._client, self._where, self._password = client, where, password
        self._work_event = anyio.Event()
        self._cancel_event = anyio.Event()

    async def close(self) -> None:
        """Stop the listener, close the pub/sub connection, wake every waiter."""
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
        self._client = None
        self._pending.clear()
        self._sub_ready.clear()
        # Wake everything that waits so no task hangs on a closed broker.
        self._work_event.set()
        self._cancel_event.set()
        for waiters in self._done_waiters.values():
            for waiter in waiters:
                waiter.event.set()

    async def subscribe(self, channel: str, *, wait: float | None = None) -> None:
        """Subscribe once per channel; with ``wait`` (a monotonic deadline), until confirmed."""
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

    # -- work ----------------------------------------------------------------------

    def _gen(self, queues: Sequence[str]) -> int:
        return self._all_gen + sum(self._queue_gen.get(q, 0) for q in queues)

    def claim_sent(self, queues: Sequence[str]) -> None:
        """A claim of ``queues`` is about to run: work published after now wakes the
        next :meth:`wait_for_work` of these queues."""
        self._claim_gen[tuple(queues)] = self._gen(queues)

    def claim_answered(self, queues: Sequence[str], next_due_us: int) -> None:
        """The claim answered when the next scheduled job of ``queues`` is due, in
        microseconds from now (negative: none is scheduled)."""
        key = tuple(queues)
        if next_due_us >= 0:
            self._next_due[key] = time.monotonic() + next_due_us / MICRO
        else:
            self._next_due.pop(key, None)

    def look_again(self, queues: Sequence[str]) -> None:
        """The next :meth:`wait_for_work` of ``queues`` returns at once (more jobs may be
        claimable that no notification will announce)."""
        self._claim_gen[tuple(queues)] = -1

    async def wait_for_work(self, queues: Sequence[str], timeout: float) -> None:
        """Return when work was published for ``queues`` since their last claim was sent,
        when a scheduled job of theirs is due, or after ``timeout`` seconds."""
        key = tuple(queues)
        start = self._claim_gen.get(key)
        if start is None:
            start = self._gen(queues)
        await self.subscribe(self.keys.work_channel)
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
            await self.subscribe(self.keys.cancel_channel)
        else:
            # Someone waits until this wait is armed: once the subscription is confirmed,
            # only what is published from then on (or a resubscription) wakes it.
            await self.subscribe(self.keys.cancel_channel, wait=time.monotonic() + timeout)
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

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = text(message.get("channel", b""))
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
            data = text(message.get("data", b"")).split()
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
        assert self._client is not None
        pubsub = self._pubsub = self._client.pubsub()
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
                        scrub(str(exc), self._password),
                    )
                # Waiters re-check Redis themselves (and meet the error there).
                self._wake_all()
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
