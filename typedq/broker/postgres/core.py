"""What the core of :class:`~.broker.PostgresBroker` gives the parts the class is made of.

:class:`PostgresCore` is the base of its mixins (one module per capability, listed in
:mod:`.broker`): the broker's state, made in :mod:`.broker`, is declared here for the
type checker, and the helpers every part uses are defined here: the pool check, one
call of a statement (:func:`.connection.call`: retries, error translation), the
retention bounds, the enqueue function's arguments and the queue registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import anyio

from ...errors import NotConnected
from ...options import check_numbers
from ..base import Broker, BrokerSettings, JobMessage, JobState
from .connection import READ_TRIES, Listener, call
from .rows import encode
from .within import EnqueueArgs

__all__ = ["PostgresCore"]


class PostgresCore(Broker):
    """The core of :class:`~.broker.PostgresBroker` as its mixins see it (see the module)."""

    settings: BrokerSettings
    target: Any
    #: The app's namespace (``BrokerSettings.namespace``): the ``ns`` of every row.
    ns: str
    #: The NOTIFY channel of the broker's schema.
    channel: str
    _sql: dict[str, str]
    _page_sql: dict[JobState, str]
    _list_sql: dict[JobState, str]
    _pool: Any
    _listener: Listener | None
    #: Waiters for work: (queues, event), woken by ``w:`` notifications of a queue.
    _work: set[tuple[frozenset[str], anyio.Event]]
    #: Waiters for a job's end, by job id, woken by its ``f:`` notification.
    _finished: dict[str, set[anyio.Event]]
    _cancels: set[anyio.Event]
    #: Queues this process has put in the queue registry (``list_queues``).
    _registered: set[str]

    def _check(self) -> Any:
        pool = self._pool
        if pool is None:
            raise NotConnected(
                "the PostgreSQL broker is not connected: use `async with app:` before "
                "enqueueing or running workers (or `await broker.connect()`)"
            )
        return pool

    if TYPE_CHECKING:

        async def _forget_idle(self) -> None: ...

        async def _sweep_streams(self) -> None: ...

    # -- calls -------------------------------------------------------------------------

    async def _fetchval(self, op: str, sql: str, *args: Any, cap: int = 0) -> Any:
        pool = self._check()
        return await call(op, self.target.safe, lambda: pool.fetchval(sql, *args), cap)

    async def _fetch(self, op: str, sql: str, *args: Any, read: bool = False) -> list[Any]:
        pool = self._check()
        rows: list[Any] = await call(
            op, self.target.safe, lambda: pool.fetch(sql, *args), tries=READ_TRIES if read else 1
        )
        return rows

    def _final_bounds(self) -> tuple[list[float], list[int]]:
        r = self.settings.retention
        return [r.completed_ttl, r.failed_ttl], [r.completed_max, r.failed_max]

    def _enqueue_args(self, messages: Sequence[JobMessage]) -> EnqueueArgs:
        """The enqueue function's arguments for ``messages`` (checked first)."""
        check_numbers(messages)
        for message in messages:
            if not isinstance(message.payload, bytes):
                raise TypeError(
                    f"job {message.id!r}: the payload must be bytes (an encoded model), "
                    f"not {type(message.payload).__name__}"
                )
        queues = [m.queue for m in messages]
        return (
            self.ns,
            [m.id for m in messages],
            queues,
            [encode(m) for m in messages],
            [m.priority for m in messages],
            [m.eta for m in messages],
            [m.delay for m in messages],
            self.queue_cap(set(queues)),
            self.channel,
            [m.task for m in messages],
            [m.rate_key for m in messages],
            [m.concurrency_key for m in messages],
        )

    async def _finish_flows(self) -> None:
        """End the jobs that ended flows left (held by another transaction when their flow
        ended: ``flow_end_jobs`` in migration 6): tried a few times as their holders
        commit, then left to the reaper's pass."""
        for attempt in range(5):
            left = await self._fetchval("flow_finish", self._sql["flow_finish"], self.ns)
            if not left:
                return
            await anyio.sleep(0.01 * (attempt + 1))

    async def _register_queues(self, queues: Sequence[str]) -> None:
        """Put the queues this process has not registered yet in the queue registry
        (once per queue and process: a round trip at its first enqueue, none after)."""
        new = set(queues) - self._registered
        if new:
            await self._fetch("register_queues", self._sql["register_queues"], self.ns, sorted(new))
            self._registered |= new
