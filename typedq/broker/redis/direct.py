"""Direct hand-off on the Redis broker: an idle worker blocks in Redis on an inbox of
its own, and an enqueue hands new jobs straight into it, already claimed for that
worker (one hop from producer to worker, instead of a notice, a wake-up and a claim).

How it holds (see handoff.lua and common/bookkeeping.lua's ``hand_off``):

- A worker whose claim came up short registers (``handoff.lua``) with its free slots,
  lease and worker id, in each of its queues (``Q H``), unless work already waits there
  (then it claims again). An enqueue that finds a registration and nothing else waiting
  claims the new jobs for it, as a claim would (job hash, lease, counts), and pushes
  them to its inbox, never more than the slots it registered.
- Any other way work reaches those queues (a retry, a hand-back, a scheduled job falling
  due in another claim, a workflow step, a fair or keyed enqueue) ends the registrations
  there: the script consumes the queues' waiter marks and pushes '' to each inbox, and
  the worker claims as it does after a pub/sub notice.
- While a registration takes jobs, the worker claims nothing for its slots: it ends the
  registration first (the same script answers the jobs still in the inbox), so it never
  holds more jobs than slots.
- The blocking pop runs on a connection of its own, without redis-py's retry: a pop
  whose answer is lost (connection cut, cancelled) would take jobs from the inbox that
  the worker never sees, so the worker then ends the registration asking for every job
  handed to it that is still active under its hand-off token, and runs those it does
  not hold (nothing waits for a lease to expire; nothing runs twice).
- A registration lasts ``_TTL`` unless renewed; a worker that died leaves jobs claimed
  under it, which come back when their lease expires, like any job of a dead worker.

On Redis Cluster the inbox is in its queue's slot and the pop goes to the node that owns
it, on a connection of that node's (a pop answered MOVED ends the registration: the
worker claims, and registers at the slot's new owner next time).

Not used (the worker waits for a pub/sub notice, :meth:`wait_for_jobs`): on Redis
Cluster by a worker of several queues (they span several slots), and by a worker whose
claims carry task limits (a gated job must never be handed off).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

import anyio

from ..base import ClaimedJob, Completion, FinishOutcome, Release
from .codec import MICRO, text, us
from .connection import SOCKET_TIMEOUT
from .core import _request_token
from .health import log
from .leases import LeaseOps

__all__ = ["DirectHandoff"]

#: How long a registration lasts unless renewed (ms): past the longest blocking pop
#: by a margin, so a live worker's registration never expires under its pop.
_TTL_MS = 10_000
#: The longest blocking pop (s): below the connection's read timeout.
_LONGEST_POP = 3.0


@dataclasses.dataclass
class _Registration:
    """This broker's registration for one worker: where its inbox is, and how many jobs
    it may still be handed."""

    token: str
    home: str
    queues: tuple[str, ...]
    slots: int
    #: When it expires (monotonic seconds, with a margin taken off).
    renew_by: float
    #: When the next scheduled job of its queues is due (monotonic), or None.
    due: float | None


@dataclasses.dataclass
class _Blocking:
    """A worker's connection for blocking pops, and where it is from."""

    conn: Any
    #: The Redis Cluster node it is a connection of (None: the standalone client's pool).
    node: Any = None


class DirectHandoff(LeaseOps):
    """The Redis broker's ``wait_for_handoff`` and ``end_handoff``."""

    #: The registration of each worker using this broker (by worker id).
    _registrations: dict[str, _Registration]
    #: Each worker's connection for its blocking pops (taken at first use, given back by
    #: end_handoff): workers sharing this broker each block on their own.
    _blocking: dict[str, _Blocking]
    #: Claim ids of ``complete_and_claim`` calls that raised (their answer may be lost:
    #: the caller re-sends them with the same id); an answered re-send removes its id.
    _unanswered_claims: set[str]

    def _handoff_possible(self, queues: Sequence[str]) -> bool:
        # A worker with limits claims gated jobs only through its claims' gates. Redis
        # Cluster: an inbox is in one slot, and one queue's keys are (a worker of
        # several queues, partitions say, spans several slots).
        return not self.limits and not (self.cluster and len(set(queues)) > 1)

    async def wait_for_handoff(
        self,
        queues: Sequence[str],
        free: int,
        timeout: float,
        *,
        worker_id: str,
        lease: float,
    ) -> list[ClaimedJob]:
        if free <= 0 or not queues or not self._handoff_possible(queues):
            await self.wait_for_jobs(queues, timeout)
            return []
        if self._notes.looking_again(queues):
            return []  # the last claim met jobs it failed: more may wait unannounced
        regs = self._registrations
        key = tuple(sorted(set(queues)))
        reg = regs.get(worker_id)
        now = time.monotonic()
        if (
            reg is None
            or reg.queues != key
            or reg.slots <= 0
            or free < reg.slots
            or now >= reg.renew_by
        ):
            regs.pop(worker_id, None)
            jobs, reg = await self._register(reg, key, free, worker_id=worker_id, lease=lease)
            if reg is None:
                return jobs
            regs[worker_id] = reg
        wait = min(timeout, _LONGEST_POP, max(0.0, reg.renew_by - time.monotonic()))
        if reg.due is not None:
            wait = min(wait, max(0.0, reg.due - time.monotonic()))
        try:
            popped = await self._pop(
                worker_id, self.keys.inbox(reg.home, reg.token), reg.slots + 1, wait
            )
        except BaseException as exc:
            # The pop's answer may be lost with jobs in it: end the registration asking
            # for every job still handed to it, and run (or, cancelled, hand back) those
            # this worker does not hold.
            regs.pop(worker_id, None)
            with anyio.CancelScope(shield=True), anyio.move_on_after(SOCKET_TIMEOUT):
                jobs = await self._end(reg, worker_id=worker_id, lease=lease, recover=True)
                if not isinstance(exc, Exception):
                    await self._hand_back(jobs, worker_id)
                    raise
                log.debug("worker %s: blocking pop failed (%s)", worker_id, exc)
                return jobs
            raise
        if popped is None:
            # Timed out: end it, so the claim the caller makes next is the only taker.
            regs.pop(worker_id, None)
            return await self._end(reg, worker_id=worker_id, lease=lease, recover=False)
        jobs, woke = await self._handed(popped, queues, worker_id)
        reg.slots -= len(jobs)
        if woke:
            regs.pop(worker_id, None)  # ended by the script that stored work
        return jobs

    async def complete_and_claim(
        self,
        items: Sequence[Completion],
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> tuple[list[FinishOutcome], list[ClaimedJob]]:
        """While the worker is registered for a hand-off, its completions refill nothing:
        nothing waits in its queues (work stored there ends the registration, and the
        worker then claims for every free slot), so a refill claim would come back empty.
        The completions go alone (a cheaper script)."""
        reg = self._registrations.get(worker_id)
        if reg is not None and reg.slots > 0 and claim_id not in self._unanswered_claims:
            return await self.complete(items), []
        # A re-send of a call whose answer was lost goes whole, registered or not: its
        # first copy may have claimed jobs (before the worker registered), and only the
        # claim, re-sent with the same id, answers them (they would wait for their lease
        # to expire: a stall with no dead worker). The completions' slots are still
        # counted as taken, so the registration's slots never included them.
        try:
            answer = await super().complete_and_claim(
                items, queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
        except BaseException:
            if claim_id is not None:
                self._unanswered_claims.add(claim_id)
            raise
        if claim_id is not None:
            self._unanswered_claims.discard(claim_id)
        return answer

    async def end_handoff(self, worker_id: str) -> None:
        reg = self._registrations.pop(worker_id, None)
        blocking = self._blocking.pop(worker_id, None)
        with anyio.CancelScope(shield=True), anyio.move_on_after(SOCKET_TIMEOUT):
            if blocking is not None:
                await self._give_back(blocking)
            if reg is not None:
                jobs = await self._end(reg, worker_id=worker_id, lease=1.0, recover=False)
                await self._hand_back(jobs, worker_id)

    async def _register(
        self,
        old: _Registration | None,
        queues: tuple[str, ...],
        free: int,
        *,
        worker_id: str,
        lease: float,
    ) -> tuple[list[ClaimedJob], _Registration | None]:
        """End ``old`` (if any) and register anew in one call: the jobs left to ``old``,
        and the new registration (None: work waits, or ``old`` left jobs: claim)."""
        await self._note_queues(queues)
        home = old.home if old is not None else queues[0]
        token = _request_token()
        try:
            reply = await self._eval(
                "handoff",
                [self.keys.active(home)],
                [
                    self.keys.prefix,
                    home,
                    old.token if old is not None else "",
                    token,
                    free,
                    max(1, us(lease)),
                    _TTL_MS,
                    worker_id,
                    "0",
                    len(queues),
                    *queues,
                ],
            )
            jobs = await self._claimed(queues, [-1, *reply[2:]], worker_id, refill=True)
        except BaseException:
            # The script may have run with its answer lost or unread (the worker's
            # shutdown cancelled the call, a connection cut): a registration this worker
            # does not know of would take the next enqueue's jobs, and nobody would pop
            # them until their lease ran out. End it (and the old one, which the same
            # call ended or not; ending an unknown token changes nothing), asking for
            # every job still handed to either, and hand those back.
            made = _Registration(token, home, queues, free, renew_by=0.0, due=None)
            with anyio.CancelScope(shield=True), anyio.move_on_after(SOCKET_TIMEOUT):
                handed: list[ClaimedJob] = []
                for reg in (made,) if old is None else (old, made):
                    handed += await self._end(reg, worker_id=worker_id, lease=lease, recover=True)
                await self._hand_back(handed, worker_id)  # one release for both
            raise
        if int(reply[0]) != 0:
            return jobs, None
        now = time.monotonic()
        due = int(reply[1])
        return jobs, _Registration(
            token=token,
            home=home,
            queues=queues,
            slots=free,
            renew_by=now + _TTL_MS / 1000 - SOCKET_TIMEOUT,
            due=now + due / MICRO if due >= 0 else None,
        )

    async def _end(
        self, reg: _Registration, *, worker_id: str, lease: float, recover: bool
    ) -> list[ClaimedJob]:
        """End ``reg``: the jobs handed to it and not taken yet (``recover``: every one
        still handed to it that this worker does not hold)."""
        reply = await self._eval(
            "handoff",
            [self.keys.active(reg.home)],
            [
                self.keys.prefix,
                reg.home,
                reg.token,
                "",
                0,
                max(1, us(lease)),
                _TTL_MS,
                worker_id,
                "1" if recover else "0",
                len(reg.queues),
                *reg.queues,
            ],
        )
        # The jobs this worker holds already are left out: an answer of every job still
        # handed (recover, or a re-send of an end whose answer was lost) names them too.
        fields = list(reply[2:])
        held = self._held
        kept: list[Any] = []
        for i in range(0, len(fields), 8):
            if text(fields[i + 2]) not in held:
                kept.extend(fields[i : i + 8])
        fields = kept
        return await self._claimed(reg.queues, [-1, *fields], worker_id, refill=True)

    async def _handed(
        self, popped: list[bytes], queues: Sequence[str], worker_id: str
    ) -> tuple[list[ClaimedJob], bool]:
        """The jobs of a pop's items ('<id>|<token>|<enqueued_at>|<queue>|<body>'), and
        whether '' (the registration ended: work was stored) was among them."""
        fields: list[Any] = [-1]
        woke = False
        for item in popped:
            if not item:
                woke = True
                continue
            job_id, token, enqueued, queue, body = item.split(b"|", 4)
            fields += (job_id, body, token, 1, int(enqueued), 0, queue, 0)
        return await self._claimed(queues, fields, worker_id, refill=True), woke

    async def _hand_back(self, jobs: Sequence[ClaimedJob], worker_id: str) -> None:
        if jobs:
            await self.release([Release(j.message.id, j.token) for j in jobs])
            log.info(
                "worker %s: handed back %d jobs handed to it at shutdown", worker_id, len(jobs)
            )

    async def _pop(self, worker_id: str, inbox: str, count: int, wait: float) -> list[bytes] | None:
        """``BLMPOP`` of up to ``count`` items of ``inbox``, blocking up to ``wait``
        seconds, on the worker's blocking connection, never re-sent (see the module)."""
        conn = await self._blocking_connection(worker_id, inbox)
        try:
            await conn.send_command(
                "BLMPOP", f"{max(0.001, wait):.3f}", 1, inbox, "RIGHT", "COUNT", count
            )
            reply = await conn.read_response(timeout=wait + SOCKET_TIMEOUT)
        except BaseException:
            # Nothing of this pop's answer may be read by the next one.
            with anyio.CancelScope(shield=True):
                await conn.disconnect()
            raise
        if reply is None:
            return None
        if isinstance(reply, Exception):
            raise reply
        items: list[bytes] = list(reply[1])
        return items

    async def _blocking_connection(self, worker_id: str, inbox: str) -> Any:
        """The worker's connection for blocking pops of ``inbox``: from the standalone
        client's pool, or (Redis Cluster) of the node owning the inbox's slot now."""
        held = self._blocking.get(worker_id)
        if self.cluster:
            client: Any = self._conn()
            node = client.get_node_from_key(inbox)
            if held is not None and held.node is not node:
                del self._blocking[worker_id]
                await self._give_back(held)
                held = None
            if held is None:
                held = self._blocking[worker_id] = _Blocking(node.acquire_connection(), node)
        elif held is None:
            pool: Any = self._conn().connection_pool  # get_connection is untyped in redis-py
            held = self._blocking[worker_id] = _Blocking(await pool.get_connection())
        return held.conn

    async def _give_back(self, held: _Blocking) -> None:
        """Close a blocking connection and give it back where it is from."""
        try:
            await held.conn.disconnect()
        finally:
            if held.node is not None:
                held.node.release(held.conn)
            elif self._redis is not None:
                await self._redis.connection_pool.release(held.conn)
