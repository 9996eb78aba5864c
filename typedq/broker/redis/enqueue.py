"""The Redis broker's enqueue side, mixed into RedisBroker: enqueue, ordered batches,
waiting for a job to finish, cancel.

An enqueue is one script (one per queue on Redis Cluster, each queue's jobs stored
atomically); jobs of one queue, priority, eta and delay travel in ``enqueue.lua``'s
shared form (:meth:`EnqueueOps._enqueue_call`). :meth:`EnqueueOps.enqueue_batches`
pipelines one script per batch, in order. Workflows are in :mod:`.flows`.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import redis.exceptions as rexc
from anyio.abc import TaskStatus

from ...errors import BrokerError, QueueFull
from ...names import check_job_id, check_job_ids, check_name
from ...options import check_controls, check_numbers
from ..base import (
    CancelOutcome,
    EnqueueControl,
    EnqueueOutcome,
    JobMessage,
    JobRecord,
    JobState,
)
from .codec import as_int, encode_body, text, us
from .core import RedisCore, _missing, _request_token
from .keys import index_bucket

__all__ = ["EnqueueOps"]

#: Bounds of one pipeline of enqueue_batches: scripts, and bytes of job bodies.
_PIPELINE_SCRIPTS = 32
_PIPELINE_BYTES = 8 * 1024 * 1024


def _alike(
    messages: Sequence[JobMessage], queue: str, priority: int, eta: float, delay: float
) -> bool:
    """Every one of ``messages`` has this queue, priority, eta and delay."""
    for m in messages:
        if m.queue != queue or m.priority != priority or m.eta != eta or m.delay != delay:
            return False
    return True


def _script(messages: Sequence[JobMessage]) -> str:
    """The enqueue script of ``messages``: ``enqueue_fair`` when one is a fair job
    (typedq.fair), else ``enqueue`` (whose path fair shares leave as it was)."""
    for m in messages:
        if m.fair_weight:
            return "enqueue_fair"
    return "enqueue"


class EnqueueOps(RedisCore):
    """Producer methods of the Redis broker."""

    async def enqueue(self, messages: Sequence[JobMessage]) -> list[EnqueueOutcome]:
        check_numbers(messages)  # the encoder cannot store every int (msgpack: 64 bits)
        if not messages:
            self._conn()
            return []
        queues = [m.queue for m in messages]
        if self.cluster and len(set(queues)) > 1:
            # One script per queue (one slot each), in one round trip: each queue's jobs
            # are stored atomically, the batch as a whole is not.
            for m in messages:
                check_job_id(m.id)
                check_name("queue", m.queue)
            await self._note_queues(queues)
            if self._epoch.is_due():
                await self.check_epoch()
            cap = self.queue_cap(queues)  # the whole call's, as on one Redis (queue_cap)
            if cap > 0:
                await self._check_caps(messages, cap)
            groups: dict[str, list[JobMessage]] = {}
            for m in messages:
                groups.setdefault(m.queue, []).append(m)
            # Each queue's script by its own jobs: a queue with a fair job takes
            # enqueue_fair, the others enqueue (their arguments differ).
            replies = await self._eval_many(
                [
                    (_script(group), *self._enqueue_call(group, cap=cap)[:2])
                    for group in groups.values()
                ]
            )
            created = dict(zip(groups, map(iter, replies), strict=True))  # by queue, in order
            return [EnqueueOutcome(m.id, bool(next(created[m.queue]))) for m in messages]
        keys, args, _ = self._enqueue_call(messages)
        await self._note_queues(queues)
        if self._epoch.is_due():
            await self.check_epoch()
        created = await self._eval(_script(messages), keys, args)
        return [EnqueueOutcome(m.id, bool(c)) for m, c in zip(messages, created, strict=True)]

    async def _check_caps(self, messages: Sequence[JobMessage], cap: int) -> None:
        """Refuse a Cluster call spanning several queues (slots) with :class:`QueueFull`
        before anything is stored when one of its queues would pass ``cap``: the jobs of
        each queue are then stored atomically per queue, so a call refused for one queue
        stores nothing (as on one Redis) unless a concurrent producer fills the queue
        between this check and the store (docs/brokers.md, issue 24)."""
        first: dict[str, str] = {}
        for m in messages:
            first.setdefault(m.id, m.queue)  # a repeated id is stored once (its first)
        groups: dict[str, list[str]] = {}
        for job_id, queue in first.items():
            groups.setdefault(queue, []).append(job_id)
        for queue, ids in groups.items():
            more = sum(r is None for r in await self.get(ids, queue=queue))
            if not more:
                continue
            counts = await self.counts(queue)
            pending = counts[JobState.WAITING] + counts[JobState.SCHEDULED]
            if pending + more > cap:
                raise QueueFull(
                    f"queue {queue!r} holds {pending} pending jobs; adding {more} would pass "
                    f"max_queue_length={cap}"
                )

    def _enqueue_call(
        self, messages: Sequence[JobMessage], *, cap: int | None = None
    ) -> tuple[list[str], list[Any], int]:
        """Keys and arguments of one enqueue script, and the bytes of its job bodies.

        When every job has the same queue, priority, eta and delay (a bulk enqueue, as a
        rule), they are sent once, and each job as its id and body (enqueue.lua's shared
        form): two arguments per job instead of six, for Redis to read and Lua to hold.
        For enqueue.lua, the jobs' waiting index buckets follow (one each): hashing an id
        costs Redis more than it costs this process."""
        args: list[Any] = [self.keys.prefix, self.settings.max_queue_length, len(messages)]
        size = 0
        head = messages[0]
        queue, priority, eta, delay = head.queue, head.priority, head.eta, head.delay
        shared = len(messages) > 1 and _alike(messages, queue, priority, eta, delay)
        if shared:
            check_name("queue", queue)
            ids = [m.id for m in messages]
            check_job_ids(ids)  # (one regex scan)
            bodies = [encode_body(m) for m in messages]
            size = sum(map(len, bodies))
            args += (
                "",
                queue,
                "0" if priority == 0 else str(int(priority)),
                us(eta) if eta else 0,
                us(delay) if delay else 0,
            )
            args += itertools.chain.from_iterable(zip(ids, bodies, strict=True))
        else:
            named: set[str] = set()  # the queue names checked (a batch has one or a few)
            for m in messages:
                check_job_id(m.id)
                queue = m.queue
                if queue not in named:
                    named.add(check_name("queue", queue))
                body = encode_body(m)
                size += len(body)
                # The common values (priority 0, no eta, no delay) without a conversion each.
                priority, eta, delay = m.priority, m.eta, m.delay
                args += (
                    m.id,
                    queue,
                    "0" if priority == 0 else str(int(priority)),
                    us(eta) if eta else 0,
                    us(delay) if delay else 0,
                    body,
                )
        if _script(messages) == "enqueue":
            args += [index_bucket(m.id) for m in messages]
        if cap is not None:
            args[1] = cap
        elif self.partitions and self.settings.max_queue_length:
            # (a partition's share of the cap: Broker.queue_cap)
            args[1] = self.queue_cap(m.queue for m in messages)
        first = head.queue
        return [self.keys.seq(first), self.keys.request(first, _request_token())], args, size

    async def enqueue_batches(
        self, batches: Sequence[Sequence[JobMessage]]
    ) -> list[list[EnqueueOutcome] | Exception]:
        """Store ``batches`` in order, each atomically: one enqueue script per batch,
        pipelined in order on one connection (at most 32 scripts or ~8 MB of bodies per
        round trip), so Redis runs them in input order (FIFO across the batches) and each
        checks ``max_queue_length`` itself.

        Per batch: its outcomes, or the error that refused it (:class:`QueueFull`, a
        :class:`BrokerError` such as maxmemory), which stored nothing of it. When the
        connection fails (after redis-py's retries, whose re-sent scripts answer what
        their first copies answered) during the first round trip, it raises
        :class:`BrokerUnavailable`; during a later one, the batches of that round trip
        and after it get a :class:`BrokerUnavailable` each: those may or may not be
        stored, and sending them again with the same ids is safe (ids deduplicate).
        """
        for batch in batches:
            check_numbers(batch)  # before any batch is stored
        if self.cluster or any(m.fair_weight for batch in batches for m in batch):
            # A batch may span slots: each is stored by enqueue (one script per queue).
            # Fair jobs (enqueue_fair.lua) likewise: one enqueue per batch, in order.
            return await super().enqueue_batches(batches)
        calls = [self._enqueue_call(batch) if batch else None for batch in batches]
        await self._note_queues([m.queue for batch in batches for m in batch])
        if self._epoch.is_due() and any(calls):
            await self.check_epoch()
        results: list[list[EnqueueOutcome] | Exception] = []
        i = 0
        while i < len(batches):
            # One pipeline: consecutive batches up to the bounds (at least one).
            j, size = i, 0
            while j < len(batches) and j - i < _PIPELINE_SCRIPTS:
                call = calls[j]
                extra = call[2] if call is not None else 0
                if j > i and size + extra > _PIPELINE_BYTES:
                    break
                size += extra
                j += 1
            sent = [(n, c) for n in range(i, j) if (c := calls[n]) is not None]
            replies: list[Any] = []
            if sent:
                try:
                    replies = await self._send_enqueues([c for _, c in sent])
                except (rexc.RedisError, OSError) as exc:
                    error = self._error(exc, "enqueue")
                    if not results:
                        raise error from None
                    results.extend(error for _ in range(i, len(batches)))
                    return results
            by_batch = dict(zip((n for n, _ in sent), replies, strict=True))
            lost = [n for n, _ in sent if _missing(by_batch[n])]
            if lost:
                # The library is gone: none of those batches ran. Load it and send them
                # again, in order, in one round trip.
                lost_calls = dict(sent)
                try:
                    again = await self._reload_and_send(
                        [("enqueue", lost_calls[n][0], lost_calls[n][1]) for n in lost]
                    )
                except BrokerError as exc:
                    again = [exc] * len(lost)
                by_batch.update(zip(lost, again, strict=True))
            for n in range(i, j):
                call, batch = calls[n], batches[n]
                if call is None:
                    results.append([])
                    continue
                reply = by_batch[n]
                if isinstance(reply, Exception) and not isinstance(reply, BrokerError):
                    reply = self._error(reply, "enqueue")
                if isinstance(reply, Exception):
                    results.append(reply)
                else:
                    results.append(
                        [EnqueueOutcome(m.id, bool(c)) for m, c in zip(batch, reply, strict=True)]
                    )
            i = j
        return results

    async def _send_enqueues(self, calls: list[tuple[list[str], list[Any], int]]) -> list[Any]:
        """The replies of enqueue scripts ``calls`` (keys, args, size), sent in order in one
        round trip; a script's error is its reply (as in a pipeline with
        ``raise_on_error=False``), a connection's raises. One call (a bulk enqueue of one
        chunk, as a rule) goes as a plain command: a pipeline's bookkeeping costs more
        than the call's own packing."""
        function = self._library.functions["enqueue"]
        if len(calls) == 1:
            keys, args, _ = calls[0]
            execute: Any = self._conn().execute_command  # untyped in redis-py
            try:
                return [await execute("FCALL", function, len(keys), *keys, *args)]
            except rexc.ResponseError as exc:
                return [exc]
        pipe = self._conn().pipeline(transaction=False)
        execute = pipe.execute_command
        for keys, args, _ in calls:
            execute("FCALL", function, len(keys), *keys, *args)
        replies: list[Any] = await pipe.execute(raise_on_error=False)
        return replies

    async def enqueue_controlled(
        self, items: Sequence[tuple[JobMessage, EnqueueControl]]
    ) -> list[EnqueueOutcome]:
        """One ``enqueue_controlled.lua`` call per job, in order (each atomic with its
        key's marker, in its queue's slot; the rules: memory/control.py). Keyed enqueues
        go one at a time: each answers which job holds its key."""
        check_numbers(m for m, _ in items)
        check_controls(items)
        for m, _ in items:
            check_job_id(m.id)
            check_name("queue", m.queue)
        if not items:
            self._conn()
            return []
        await self._note_queues([m.queue for m, _ in items])
        if self._epoch.is_due():
            await self.check_epoch()
        outcomes: list[EnqueueOutcome] = []
        for message, control in items:
            if control.wait > 0:
                # A debounced job runs `wait` after its last enqueue: its envelope says so.
                message = msgspec.structs.replace(message, eta=0.0, delay=control.wait)
            queue = message.queue
            args: list[Any] = [
                self.keys.prefix,
                self.queue_cap([queue]),
                message.id,
                queue,
                str(int(message.priority)),
                us(message.eta) if message.eta else 0,
                us(message.delay) if message.delay else 0,
                encode_body(message),
                f"{message.task}|{control.key}",
            ]
            if control.wait > 0:
                # The marker outlives the job's latest run time (max_wait after its first
                # enqueue), by a second: after that it names a job that is due anyway.
                ttl_ms = math.ceil(control.max_wait * 1000) + 1000
                args += ["d", us(control.wait), us(control.max_wait), ttl_ms]
            else:
                args += ["u", max(1, math.ceil(control.unique_for * 1000))]
            reply = await self._eval(
                "enqueue_controlled", [self.keys.request(queue, _request_token())], args
            )
            outcomes.append(EnqueueOutcome(text(reply[1]), as_int(reply[0]) == 1))
        return outcomes

    async def wait_finished(
        self,
        job_id: str,
        timeout: float | None,
        *,
        queue: str | None = None,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> JobRecord | None:
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        self._conn()
        if queue is None:
            (queue,) = await self._queues_of([job_id], None)
            if queue is None:
                return None
        with self._notes.done_waiter(job_id) as waiter:
            await self._notes.subscribe(self._notes.done_channel(queue), wait=deadline)
            # Subscribed and registered: a finish announced from now on wakes the waiter,
            # and one announced before is seen by the first look below.
            task_status.started()
            while True:
                # A fresh event before each look, so a notice that lands between the
                # read and the wait still wakes us.
                waiter.event = anyio.Event()
                (record,) = await self.get([job_id], queue=queue)
                if record is None or record.state.is_final:
                    return record
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._redis is None:
                    return None
                with anyio.move_on_after(remaining):
                    await waiter.event.wait()

    async def cancel(self, job_id: str, *, queue: str | None = None) -> CancelOutcome:
        ttl, cap = self._retention(completed=False)
        (where,) = await self._queues_of([job_id], queue)
        if where is None:
            return CancelOutcome.NOT_FOUND
        outcome = await self._eval(
            "cancel",
            [self.keys.request(where, _request_token())],
            [self.keys.prefix, where, ttl, cap, job_id],
        )
        return CancelOutcome(text(outcome))
