"""The Redis broker's lease side, mixed into RedisBroker: claim, waiting for work, lease
renewal, the settles (complete, fail, release), progress, cancel requests and the reaper
pass.

Claim is one script (on Redis Cluster one per queue's slot, all sent at once:
:meth:`LeaseOps._claim_per_slot`); :meth:`LeaseOps.complete_and_claim` completes and
claims in one script, a worker's one call per job in its steady state. A claimed job is
remembered by its lease token until it is settled, so the settles find its queue
without a search.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from ...errors import ConfigError, FailureReason, FailureRecord
from ...limits import LimitSpec
from ..base import (
    ClaimedJob,
    Completion,
    Failure,
    FinishOutcome,
    LeaseStatus,
    Release,
    check_claim_id,
)
from .codec import FINISH, LEASE, MICRO, decode_job, encode, text, us
from .core import RedisCore, _request_token
from .health import log

__all__ = ["LeaseOps"]

#: Fields per job in a claim script's answer (after its first item, the next due time):
#: id, body, token, attempt, enqueued_at, stalls, queue, due time (claim.lua; the times an
#: integer or its decimal text, which int() reads alike).
_CLAIMED_FIELDS = 8


class LeaseOps(RedisCore):
    """Worker methods of the Redis broker."""

    def set_limits(self, limits: Mapping[str, LimitSpec]) -> None:
        """Declare tasks' limits; every later claim enforces them (common/gates.lua)."""
        self._merge_limits(limits)

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        await self._note_queues(queues)
        if self.cluster and len(queues) > 1:
            jobs, _ = await self._claim_per_slot(
                queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
            return jobs
        keys, args = self._claim_call(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )
        reply = await self._eval("claim", keys, args)
        return await self._claimed(queues, reply, worker_id)

    async def _claim_per_slot(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None,
        settles: Sequence[tuple[str, Sequence[Completion]]] = (),
    ) -> tuple[list[ClaimedJob], dict[str, list[Any]]]:
        """A claim over several queues on Redis Cluster: one script per queue (each its
        own slot), all sent at once (redis-py sends each node its calls concurrently).
        ``limit`` is split over the queues in the order given (the first ones get the
        remainder), so the calls together never take more jobs than asked for; when some
        queue had fewer jobs than its share, the rest of ``limit`` is asked again of the
        queues that filled theirs (another round, still concurrent). ``settles`` (queue,
        completions) go with that queue's first call (completed before it claims), or
        alone as a complete script for a queue not claimed from. A re-sent claim (same
        id) derives the same id per queue and round, which answers the same jobs.

        The claimed jobs, and per settled queue the completions' outcomes in order."""
        self._notes.claim_sent(queues, refill=bool(settles))
        pending = {q: list(group) for q, group in settles}
        outcomes: dict[str, list[Any]] = {}
        merged: list[Any] = [-1]  # one claim answer for all the calls
        dues: list[int] = []
        # Queues still worth asking, and how many jobs are still wanted of them.
        asking, wanted, rnd = list(dict.fromkeys(queues)), max(0, limit), 0
        while asking and (wanted > 0 or pending):
            base, extra = divmod(wanted, len(asking))
            shares = {q: base + (1 if i < extra else 0) for i, q in enumerate(asking)}
            calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
            what: list[tuple[str, str, int]] = []  # (kind, queue, share) per call
            for q in [*asking, *(q for q in pending if q not in shares)]:
                share = shares.get(q, 0)
                group = pending.pop(q, [])
                if q not in shares:
                    keys, args = self._complete_call(q, group)
                    calls.append(("complete", keys, args))
                    what.append(("complete", q, 0))
                    continue
                if share == 0 and not group:
                    continue
                sub_id = None
                if claim_id is not None:
                    sub_id = hashlib.blake2b(
                        f"{check_claim_id(claim_id)}|{q}|{rnd}".encode(), digest_size=16
                    ).hexdigest()
                keys, args = self._claim_call(
                    [q],
                    share,
                    worker_id=worker_id,
                    lease=lease,
                    claim_id=sub_id,
                    settles=[(q, group)] if group else (),
                )
                calls.append(("claim", keys, args))
                what.append(("settle" if group else "claim", q, share))
            if not calls:
                break
            replies = await self._eval_many(calls)
            short: set[str] = set()
            for (kind, q, share), reply in zip(what, replies, strict=True):
                if kind == "complete":
                    outcomes[q] = list(reply)
                    continue
                if kind == "settle":
                    reply, outcomes[q] = reply[0], list(reply[1])
                dues.append(int(reply[0]))
                merged.extend(reply[1:])
                got = (len(reply) - 1) // _CLAIMED_FIELDS
                wanted -= got
                if got < share:
                    short.add(q)  # it has no more for now
            # Next round: the queues that gave all they were asked and those not asked
            # yet (a share of 0: fewer jobs wanted than queues), in the order given.
            asking, rnd = [q for q in asking if q not in short], rnd + 1
        if 0 in dues:
            merged[0] = 0
        elif any(d > 0 for d in dues):
            merged[0] = min(d for d in dues if d > 0)
        return await self._claimed(queues, merged, worker_id, refill=True), outcomes

    def _claim_call(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None,
        settles: Sequence[tuple[str, Sequence[Completion]]] = (),
    ) -> tuple[list[str], list[Any]]:
        """Keys and arguments of one claim script; ``settles`` (queue, completions) are
        completed by the same script before it claims (its answer is then the pair)."""
        if not queues:
            raise ConfigError("claim needs at least one queue")
        self._notes.claim_sent(queues, refill=bool(settles))
        token = _request_token() if claim_id is None else check_claim_id(claim_id)
        # The claim record is keyed by this claim's token, not by the worker: a worker
        # has several claims in flight (claim loop, complete_and_claim), and a re-send
        # of one must find its own record, not a sibling's. The worker re-sends a claim
        # whose answer it lost with the same id (and redis-py re-sends the script).
        first = queues[0]
        keys = [self.keys.active(first), self.keys.seq(first), self.keys.request(first, token)]
        args: list[Any] = [
            self.keys.prefix,
            max(0, limit),
            max(1, us(lease)),
            token,
            worker_id,
            len(queues),
            *queues,
        ]
        if self.limits or settles:
            # The limits of this process's tasks travel with every claim (a few numbers
            # per limited task); without any, the script skips all limit work.
            args.append(len(self.limits))
            for task, spec in self.limits.items():
                args += (task, spec.rate, spec.per_us, spec.concurrency, spec.spacing_us)
                args.append(spec.early_us)
        if settles:
            ttl, cap = self._retention(completed=True)
            args.append(len(settles))
            for queue, group in settles:
                args += (queue, ttl, cap, len(group))
                for item in group:
                    args += (item.id, item.token, item.result)
        return keys, args

    async def _claimed(
        self, queues: Sequence[str], reply: Any, worker_id: str, *, refill: bool = False
    ) -> list[ClaimedJob]:
        """Decode a claim script's reply; fail (for good) jobs whose bytes are garbage.

        :param refill: the claim refilled the slots of completions sent with it: its
            answer's next due time is not the worker's (see below)
        """
        if not refill:
            # The next due time bounds the worker's wait after its own claim, which set
            # the waiter marks: a job scheduled after that claim ran is published (the
            # mark), one scheduled before is in its answer. A refill's answer, read on
            # another connection in any order, says nothing the worker's wait needs, and
            # once dropped the due time of a job the worker's own claim had seen (the
            # worker then slept past it, to its 5 s bound).
            self._notes.claim_answered(queues, int(reply[0]))
        claimed: list[ClaimedJob] = []
        broken: list[Failure] = []
        held = self._held
        for i in range(1, len(reply), _CLAIMED_FIELDS):
            job_id, raw, tok, attempt, enqueued, stalls, queue, due = reply[i : i + _CLAIMED_FIELDS]
            job_id, tok, queue = text(job_id), text(tok), text(queue)
            held[tok] = (job_id, queue)
            try:
                message = decode_job(job_id, queue, raw)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                broken.append(self._decode_failure(job_id, tok, raw, exc, int(attempt), worker_id))
                continue
            claimed.append(
                ClaimedJob(
                    message=message,
                    token=tok,
                    attempt=int(attempt),
                    enqueued_at=int(enqueued) / MICRO,
                    stalls=int(stalls),
                    run_at=int(due) / MICRO,
                )
            )
        if broken:
            # Bytes that are not a job envelope: fail those jobs for good, here, so
            # the worker never sees them and the other jobs keep flowing.
            log.error(
                "%d claimed jobs hold bytes that are not a typedq envelope; failed with "
                "reason decode_error: %s",
                len(broken),
                ", ".join(f.id for f in broken),
            )
            await self.fail(broken)
            # More jobs may wait behind these: the caller's next wait_for_jobs returns
            # at once instead of waiting for a notification (none comes for them).
            self._notes.look_again(queues)
        return claimed

    def _decode_failure(
        self, job_id: str, token: str, raw: bytes, exc: Exception, attempt: int, worker_id: str
    ) -> Failure:
        record = FailureRecord(
            reason=FailureReason.DECODE_ERROR,
            error_type="DecodeError",
            message=(
                f"job {job_id}: the stored envelope is not a typedq job ({exc}); "
                f"{len(raw)} bytes, starting {raw[:48]!r}"
            ),
            attempt=attempt,
            retryable=False,
            worker_id=worker_id,
            failed_at=time.time(),
        )
        return Failure(id=job_id, token=token, error=encode(record))

    async def wait_for_jobs(self, queues: Sequence[str], timeout: float) -> None:
        self._conn()
        await self._notes.wait_for_work(
            queues, timeout, unclaimed=lambda: self._mark_waiting(queues)
        )

    async def _mark_waiting(self, queues: Sequence[str]) -> bool:
        """A wait with no claim before it (a worker's wait always follows a claim that
        came up short, which set the marks): set the queues' waiter marks so the next
        work on them is published, then whether jobs already wait in one of them (work
        given before the mark was set published nothing; a stale level only costs the
        caller an empty claim)."""
        client = self._conn()
        found = False
        for queue in dict.fromkeys(queues):
            # One queue per pipeline: its keys share its slot (Redis Cluster).
            pipe = client.pipeline(transaction=False)
            pipe.set(self.keys.waiter(queue), "1")
            pipe.exists(self.keys.levels(queue))
            with self._translate("wait_for_jobs"):
                _, waiting = await pipe.execute()
            found = found or int(waiting) > 0
        return found

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        if not leases:
            self._conn()
            return []
        queues = await self._held_queues(leases)

        def call(queue: str, idx: list[int]) -> tuple[list[str], list[Any]]:
            args: list[Any] = [self.keys.prefix, queue, max(1, us(lease)), len(idx)]
            for i in idx:
                args += leases[i]
            return [self.keys.active(queue)], args

        reply = await self._per_queue("renew", queues, call, 1)
        return [LEASE[int(s)] for s in reply]

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        queues = await self._held_queues([(c.id, c.token) for c in items])
        reply = await self._per_queue(
            "complete", queues, lambda q, idx: self._complete_call(q, [items[i] for i in idx]), 3
        )
        return self._settled(items, reply)

    def _settled(
        self, items: Sequence[Completion | Failure | Release], reply: Sequence[Any]
    ) -> list[FinishOutcome]:
        """Finish outcomes; the settled jobs are no longer held by this broker."""
        for item in items:
            self._held.pop(item.token, None)
        return [FINISH[int(o)] for o in reply]

    def _complete_call(
        self, queue: str, items: Sequence[Completion]
    ) -> tuple[list[str], list[Any]]:
        ttl, cap = self._retention(completed=True)
        args: list[Any] = [self.keys.prefix, queue, ttl, cap, len(items)]
        for item in items:
            args += (item.id, item.token, item.result)
        _span_section(args, items)
        return [self.keys.active(queue)], args

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
        """The completions and the claim in one script call, which completes first: one
        call per job in a worker's steady state. On standalone Redis one call whatever
        queues the completions and the claim are on; on Redis Cluster one call per queue
        (its slot), all sent at once (see :meth:`_claim_per_slot`)."""
        # A traced fan-out member's span goes with its completion (complete.lua), not
        # in the claim's settle section: rare, so one more round trip then.
        # (A list, not a generator: no generator step per completion.)
        if not items or limit <= 0 or not queues or any([c.span for c in items]):
            return await super().complete_and_claim(
                items, queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
        held = await self._held_queues([(c.id, c.token) for c in items])
        await self._note_queues(queues)
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(held):
            if q is not None:
                groups.setdefault(q, []).append(i)
        settles = [(q, [items[i] for i in idx]) for q, idx in groups.items()]
        done: list[Any] = [3] * len(items)  # NOT_FOUND: no queue holds the job
        if self.cluster and (len(queues) > 1 or set(groups) - {queues[0]}):
            jobs, by_queue = await self._claim_per_slot(
                queues,
                limit,
                worker_id=worker_id,
                lease=lease,
                claim_id=claim_id,
                settles=settles,
            )
            for q, idx in groups.items():
                for i, outcome in zip(idx, by_queue[q], strict=True):
                    done[i] = outcome
            return self._settled(items, done), jobs
        if not settles:
            outcomes = self._settled(items, done)
            jobs = await self.claim(
                queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
            )
            return outcomes, jobs
        keys, args = self._claim_call(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id, settles=settles
        )
        reply, settled = await self._eval("claim", keys, args)
        at = 0
        for idx in groups.values():
            for i in idx:
                done[i] = settled[at]
                at += 1
        return self._settled(items, done), await self._claimed(
            queues, reply, worker_id, refill=True
        )

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        ttl, cap = self._retention(completed=False)
        queues = await self._held_queues([(f.id, f.token) for f in items])

        def call(queue: str, idx: list[int]) -> tuple[list[str], list[Any]]:
            args: list[Any] = [self.keys.prefix, queue, ttl, cap, len(idx)]
            for i in idx:
                item = items[i]
                if item.cancelled:
                    mode, delay = "x", 0
                elif item.retry_delay is None:
                    mode, delay = "p" if item.park else "f", 0
                else:
                    mode, delay = "l" if item.refund else "r", us(item.retry_delay)
                args += (item.id, item.token, item.error, mode, delay, "")
            _span_section(args, [items[i] for i in idx])
            return [self.keys.active(queue)], args

        reply = await self._per_queue("fail", queues, call, 3)
        return self._settled(items, reply)

    async def release(self, items: Sequence[Release]) -> list[FinishOutcome]:
        if not items:
            self._conn()
            return []
        ttl, cap = self._retention(completed=False)
        queues = await self._held_queues([(r.id, r.token) for r in items])

        def call(queue: str, idx: list[int]) -> tuple[list[str], list[Any]]:
            args: list[Any] = [self.keys.prefix, queue, ttl, cap, len(idx)]
            for i in idx:
                args += (items[i].id, items[i].token)
            return [self.keys.active(queue)], args

        reply = await self._per_queue("release", queues, call, 3)
        return self._settled(items, reply)

    async def set_progress(self, job_id: str, token: str, progress: bytes) -> bool:
        (queue,) = await self._held_queues([(job_id, token)])
        if queue is None:
            self._conn()
            return False
        ok = await self._eval(
            "progress",
            [self.keys.job(queue, job_id)],
            [self.keys.prefix, queue, job_id, token, progress],
        )
        return bool(ok)

    async def cancel_requests(self, ids: Sequence[str]) -> list[str]:
        if not ids:
            self._conn()
            return []
        mine = {job_id: queue for job_id, queue in self._held.values()}
        queues: list[str | None] = [mine.get(i) for i in ids]
        if None in queues:
            where = await self._locate([i for i, q in zip(ids, queues, strict=True) if q is None])
            queues = [
                q if q is not None else where.get(i) for i, q in zip(ids, queues, strict=True)
            ]
        groups: dict[str, list[str]] = {}
        for job_id, queue in zip(ids, queues, strict=True):
            if queue is not None:
                groups.setdefault(queue, []).append(job_id)
        if not groups:
            return []
        replies = await self._eval_many(
            [
                ("cancel_requests", [self.keys.active(q)], [self.keys.prefix, q, *group])
                for q, group in groups.items()
            ]
        )
        return [text(i) for reply in replies for i in reply]

    async def wait_cancel_requests(
        self, timeout: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        self._conn()
        await self._notes.wait_cancel(timeout, task_status=task_status)

    async def recover_stalled(self, limit: int = 1000, *, holding: Collection[str] = ()) -> int:
        if self._epoch.is_due():
            await self.check_epoch()
        if self._memory.is_due():
            await self.check_memory()
        cttl, ccap = self._retention(completed=True)
        fttl, fcap = self._retention(completed=False)
        k = self.keys
        # Every queue's leases (any worker recovers any queue's stalled jobs).
        queues = await self.known_queues()
        mine = sorted(set(holding))  # read now, after the await (see the base class)
        if not queues:
            return 0
        # Applied hand-offs are deleted first (same pipeline, in order on each node), so
        # this pass does not hand them back again.
        acks, self._acks = self._acks, {}
        deletes = self._ack_calls(acks)
        replies = await self._eval_many(
            deletes
            + [
                (
                    "recover",
                    [k.active(q)],
                    [
                        *(k.prefix, q, max(0, limit), self.settings.max_stalls),
                        *(cttl, ccap, fttl, fcap, us(self.handoff_age), *mine),
                    ],
                )
                for q in queues
            ]
        )
        return sum(int(r) for r in replies[len(deletes) :])


def _span_section(args: list[Any], items: Sequence[Completion | Failure]) -> None:
    """Append the traced fan-out members' spans to a complete or fail script's arguments
    (their optional last section, see read_span_links in common/flows.lua); nothing when none."""
    spans = [(item.id, item.span) for item in items if item.span]
    if spans:
        args.append(len(spans))
        for pair in spans:
            args += pair
