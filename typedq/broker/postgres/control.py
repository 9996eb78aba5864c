"""The PostgreSQL broker's capability FlowControl, mixed into PostgresBroker: unique
windows and debounce, each keyed enqueue one call of ``enqueue_controlled``
(:mod:`.migration_8`), atomic with its key's marker. The rules are the embedded broker's
(:mod:`typedq.broker.memory.control`).

A debounce that replaces its key's scheduled job stores the new payload in that job,
whose stored message carries the job's own id: the call carries the message encoded
for the job this process last saw holding the key (a small cache), and when that guess
is wrong (another producer, or a first enqueue here) the call changes nothing and
answers the holder's id (code 2): the next call carries the message encoded for it
(bounded). A burst from one process thus costs one round trip per enqueue. Plain
enqueues never come here: they pay nothing for this capability.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ...errors import BrokerError
from ...options import check_controls
from ..base import EnqueueControl, EnqueueOutcome, JobMessage
from .connection import call
from .core import PostgresCore
from .rows import encode

__all__ = ["ControlOps"]

#: Calls one keyed enqueue makes at most while producers race for its key.
_TRIES = 10
#: Debounce keys whose last holder a broker remembers (the cache is emptied when full).
_HOLDERS = 4096


class ControlOps(PostgresCore):
    """Unique windows and debounce on PostgreSQL (see the module)."""

    #: Debounce marker (queue, marker) -> the job this process last saw collecting it.
    _holders: dict[tuple[str, str], str]

    async def enqueue_controlled(
        self, items: Sequence[tuple[JobMessage, EnqueueControl]]
    ) -> list[EnqueueOutcome]:
        """One call per keyed job, in order (each atomic with its marker)."""
        self._check()
        check_controls(items)
        if not items:
            return []
        # Every envelope is checked before any is stored (as on the other brokers).
        for message, _ in items:
            self._enqueue_args([message])
        await self._register_queues([m.queue for m, _ in items])
        return [await self._enqueue_one(message, control) for message, control in items]

    async def _fetchrow(self, op: str, sql: str, *args: object, cap: int) -> Any:
        pool = self._check()
        return await call(op, self.target.safe, lambda: pool.fetchrow(sql, *args), cap)

    async def _enqueue_one(self, message: JobMessage, control: EnqueueControl) -> EnqueueOutcome:
        debounce = control.wait > 0
        if debounce:
            # A debounced job runs `wait` after its last enqueue: its envelope says so.
            message = msgspec.structs.replace(message, eta=0.0, delay=control.wait)
        args = self._enqueue_args([message])
        cap = args[7]
        marker = f"{message.task}|{control.key}"
        place = (message.queue, marker)
        held = self._holders.get(place) if debounce else None
        held_message = None if held is None else encode(msgspec.structs.replace(message, id=held))
        for _ in range(_TRIES):
            row = await self._fetchrow(
                "enqueue_controlled",
                self._sql["enqueue_controlled"],
                self.ns,
                message.id,
                message.queue,
                args[3][0],
                message.priority,
                message.eta,
                message.delay,
                cap,
                self.channel,
                message.task,
                message.rate_key,
                message.concurrency_key,
                marker,
                1 if debounce else 0,
                control.unique_for,
                control.wait,
                control.max_wait,
                held,
                held_message,
                cap=cap,
            )
            code, job_id = int(row["code"]), str(row["job_id"])
            if code != 2:
                if debounce:
                    if len(self._holders) >= _HOLDERS:
                        self._holders.clear()
                    self._holders[place] = job_id
                return EnqueueOutcome(job_id, code == 1)
            held = job_id
            held_message = encode(msgspec.structs.replace(message, id=job_id))
        raise BrokerError(
            f"PostgreSQL {self.target.safe}: enqueue_controlled: the debounce key "
            f"{control.key!r} of task {message.task!r} kept moving under other producers; "
            "nothing was stored, try again"
        )
