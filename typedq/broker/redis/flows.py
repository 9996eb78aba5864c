"""Workflows on Redis: the arguments of ``flow_enqueue.lua`` (see typedq/broker/flow.py),
and the hand-offs of flows across slots on Redis Cluster.

A held step's body is stored split around its (empty) payload: the scripts that hand
off a result splice it in as ``head .. bin(result) .. tail`` without decoding anything.

A flow whose jobs are on queues of several cluster slots is stored per slot: first its
members (on every queue) and its steps on every queue but the root's (the queue of the
flow's own job, which holds the flow record), held and pending, a bounded chunk per
script (``flow_part.lua``; chunks as :mod:`.staging` bounds them), then the root's part
with the record (``flow_enqueue.lua``, *across*), which starts the others through its
outbox: one entry per chunk of members, each applied by a script of its own (issue 31:
one script storing or starting 100,000 members ran for seconds). A script that settles
a job of such a flow writes its hand-offs to other slots to its own queue's outbox and
names them in its reply (:func:`unwrap`); the broker applies them on their target's
slot (``flow_apply.lua``) and then deletes them (``flow_ack.lua``). See the outbox in
``lua/common/flows.lua``.

The broker's workflow methods are :class:`FlowOps`, mixed into RedisBroker: storing flows
(one ``flow_enqueue`` per group of flows; on Redis Cluster one script per flow, or per
slot of a flow across slots) and a flow's state. Delivering the hand-offs that scripts'
replies name is part of calling a script, in :mod:`.broker`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from redis.crc import key_slot

from ...errors import BrokerError, ConfigError, QueueFull
from ...names import check_job_id, check_name
from ...options import check_numbers
from ..base import EnqueueOutcome, JobMessage
from ..flow import FlowSpec, FlowState, id_taken, member_id
from . import staging
from .codec import encode, encode_body, text
from .core import RedisCore, _request_token
from .enqueue import _PIPELINE_BYTES
from .staging import STAGE_BYTES, STAGE_MEMBERS, STAGE_TTL, chunks

__all__ = [
    "HANDOFF_MARK",
    "FlowOps",
    "Handoff",
    "PartChunk",
    "flow_args",
    "flow_outcome",
    "part_args",
    "part_chunks",
    "split_body",
    "unwrap",
]

_EMPTY_BIN = b"\xc4\x00"

#: A chunk of a flow across slots spans at most this many times STAGE_MEMBERS member
#: indexes (its members interleaved with other queues' ones: its start reads each index).
_SPAN = 4

#: The first element of a script reply that carries hand-offs (see :func:`unwrap`).
HANDOFF_MARK = b"TYPEDQ_HANDOFF"


class Handoff(NamedTuple):
    """One outbox entry of a flow across slots: written on ``home``'s slot, to apply on
    ``target``'s (``record`` as the script packed it)."""

    home: str
    entry: str
    target: str
    record: bytes


def unwrap(reply: Any, into: list[Handoff]) -> Any:
    """A script's own reply; the hand-offs it names (if any) appended to ``into``.

    A script that wrote outbox entries answers ``[HANDOFF_MARK, reply, (home, entry,
    target, record)...]`` (``flow_reply`` in ``lua/common/flows.lua``); no other reply starts
    with the mark.
    """
    if not (isinstance(reply, list) and len(reply) >= 2 and reply[0] == HANDOFF_MARK):
        return reply
    rest = reply[2:]
    for i in range(0, len(rest) - 3, 4):
        home, entry, target, record = rest[i : i + 4]
        into.append(Handoff(_text(home), _text(entry), _text(target), record))
    return reply[1]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def split_body(message: JobMessage) -> tuple[bytes, bytes, bytes]:
    """(body, head, tail) of a held step: ``body == head + bin(b"") + tail``."""
    body = encode_body(message)
    # The array header (a fixarray of at most 15 fields; a fair job's 16 fields: an
    # array16, 3 bytes), then the task.
    head_len = (3 if body[0] == 0xDC else 1) + len(encode(message.task))
    head, rest = body[:head_len], body[head_len:]
    if not rest.startswith(_EMPTY_BIN):
        raise ValueError(f"step {message.id!r} of a flow must have an empty payload")
    return body, head, rest[len(_EMPTY_BIN) :]


def flow_args(
    spec: FlowSpec,
    *,
    across: Sequence[tuple[str, int, int]] | None = None,
    staged: bool = False,
) -> tuple[list[Any], int]:
    """The arguments of one flow in ``flow_enqueue.lua``, and the bytes of its bodies.

    A fan-out's members are one task's jobs: one priority, ids derived from the flow's
    (``F.m<i>``), so each member travels as its body alone; their queues travel as one
    name when they share it (else one per member: a flow across queues).

    :param across: the root's part of a flow across slots: the chunks its parts stored
        its members in (queue, first index, index after the last; see
        :func:`part_chunks`): the members travel as these ranges, which the root's part
        starts, and only its steps on the queue of the flow's own job travel with bodies
    :param staged: a large fan-out whose members ``flow_stage`` staged (see
        :mod:`.staging`): they travel as their count alone
    """
    root = spec.steps[-1].queue
    members = spec.members
    queue, priority = "", "0"
    if members:
        queue = queue_list([check_name("queue", m.queue) for m in members])
        priority = str(int(members[0].priority))
    args: list[Any] = [
        check_job_id(spec.id),
        len(spec.steps),
        len(members),
        "1" if spec.fan_out else "0",
        "1" if spec.collector else "0",
        "c" if spec.collect else "a",
        queue,
        priority,
        "s" if staged else "1" if across is not None else "0",
    ]
    if across is not None:
        args.append(len(across))
        for q, start, stop in across:
            args += (q, start, stop)
    size = 0
    for i, m in enumerate(members):
        if m.priority != members[0].priority:
            raise ValueError(f"the members of flow {spec.id!r} must share one priority")
        if m.id != member_id(spec.id, i):
            raise ValueError(
                f"member {i} of flow {spec.id!r} must have id {member_id(spec.id, i)!r}"
            )
        if staged or across is not None:
            continue
        body = encode_body(m)
        size += len(body)
        args.append(body)
    for k, m in enumerate(spec.steps):
        if across is not None and m.queue != root:
            body, head, tail = b"", b"", b""
        elif k == 0 and not spec.fan_out:
            body, head, tail = encode_body(m), b"", b""
        else:
            body, head, tail = split_body(m)
        size += len(body)
        args += (check_job_id(m.id), check_name("queue", m.queue), str(int(m.priority)))
        args += (body, head, tail)
    return args, size


def queue_list(queues: list[str]) -> str:
    """Queues as flow records store them: one name when all share it, else space-separated."""
    return queues[0] if len(set(queues)) == 1 else " ".join(queues)


class PartChunk(NamedTuple):
    """One ``flow_part`` call of a flow across slots: members ``indexes`` (their bodies
    ``bodies``) on ``queue``, and its steps there when ``steps`` (the first call of a
    queue that is not the root's)."""

    queue: str
    indexes: list[int]
    bodies: list[bytes]
    steps: bool

    @property
    def range(self) -> tuple[str, int, int]:
        """(queue, first index, index after the last): what the root's entry that starts
        these members ('A') names."""
        return self.queue, self.indexes[0], self.indexes[-1] + 1


def part_chunks(spec: FlowSpec) -> list[PartChunk]:
    """The ``flow_part`` calls of a flow across slots, each bounded as a staging call is
    (:func:`.staging.chunks`: at most STAGE_MEMBERS members, STAGE_BYTES of bodies; and
    member indexes spanning less than ``_SPAN * STAGE_MEMBERS``): its members on every
    queue (the root's too) in input order, a chunk per call, and its steps on each queue
    but the root's (with that queue's first chunk)."""
    root = spec.steps[-1].queue
    by_queue: dict[str, list[int]] = {}
    for i, m in enumerate(spec.members):
        by_queue.setdefault(m.queue, []).append(i)
    for m in spec.steps:
        if m.queue != root:
            by_queue.setdefault(m.queue, [])
    out: list[PartChunk] = []
    for q, indexes in by_queue.items():
        bodies = [encode_body(spec.members[i]) for i in indexes]
        ranges = chunks([len(b) for b in bodies]) or [(0, 0)]
        for a, b in ranges:
            # The start of a chunk (flow_ops.start_range) passes over every index of its
            # range: members of other queues among them count too (a few reads each).
            while a < b and indexes[b - 1] - indexes[a] >= _SPAN * staging.STAGE_MEMBERS:
                cut = bisect_left(indexes, indexes[a] + _SPAN * staging.STAGE_MEMBERS, a, b)
                out.append(PartChunk(q, indexes[a:cut], bodies[a:cut], False))
                a = cut
            out.append(PartChunk(q, indexes[a:b], bodies[a:b], False))
    # (A queue's steps go with its first call.)
    firsts = {p.queue: i for i, p in reversed(list(enumerate(out)))}
    for q, i in firsts.items():
        if q != root:
            out[i] = out[i]._replace(steps=True)
    return out


def part_args(spec: FlowSpec, part: PartChunk) -> list[Any]:
    """The arguments of ``flow_part.lua`` after its first two (prefix, max_queue_length):
    one chunk of the jobs of a flow across slots on one queue."""
    steps, queue = spec.steps, part.queue
    members = spec.members
    args: list[Any] = [
        check_name("queue", queue),
        check_job_id(spec.id),
        steps[-1].queue,
        len(steps),
        queue_list([check_name("queue", m.queue) for m in steps]),
        len(part.indexes),
        str(int(members[part.indexes[0]].priority)) if part.indexes else "0",
    ]
    for i, body in zip(part.indexes, part.bodies, strict=True):
        if members[i].id != member_id(spec.id, i):
            raise ValueError(
                f"member {i} of flow {spec.id!r} must have id {member_id(spec.id, i)!r}"
            )
        args += (i, body)
    here = [(k, m) for k, m in enumerate(steps) if m.queue == queue and part.steps]
    args.append(len(here))
    for k, m in here:
        if k == 0 and not spec.fan_out:
            body, head, tail = encode_body(m), b"", b""
        else:
            body, head, tail = split_body(m)
        args += (k, str(int(m.priority)), body, head, tail)
    return args


def _jobs(spec: FlowSpec) -> tuple[JobMessage, ...]:
    return (*spec.members, *spec.steps)


def _drop_records(spec: FlowSpec, parts: Sequence[PartChunk], queue: str) -> list[bytes]:
    """The ``flow_apply`` records that drop the pending jobs of ``spec`` on ``queue``
    (each in a call of its own: a chunk of members per record)."""
    f, root = spec.id, spec.steps[-1].queue
    out = [
        msgspec.msgpack.encode(["A", f, root, *p.range[1:], "d"])
        for p in parts
        if p.queue == queue and p.indexes
    ]
    steps = [m.id for m in spec.steps if m.queue == queue and queue != root]
    if steps:
        out.append(msgspec.msgpack.encode(["D", f, root, *steps]))
    return out


def flow_outcome(spec: FlowSpec, reply: Any) -> EnqueueOutcome | Exception:
    """One flow's answer: created, existed, or refused (QueueFull)."""
    if isinstance(reply, bytes | str):
        detail = reply.decode() if isinstance(reply, bytes) else reply
        if detail.startswith("TYPEDQ_FLOW_ID_TAKEN"):
            return ConfigError(id_taken(detail.split()[1], spec.id))
        _, queue, pending, extra, limit = detail.split()
        return QueueFull(
            f"queue {queue!r} holds {pending} pending jobs; this flow's {extra} jobs would "
            f"pass max_queue_length={limit}"
        )
    return EnqueueOutcome(spec.id, bool(int(reply)))


class FlowOps(RedisCore):
    """Workflow methods of the Redis broker."""

    async def enqueue_flows(self, flows: Sequence[FlowSpec]) -> list[EnqueueOutcome | Exception]:
        """Store workflows: one ``flow_enqueue`` script per group of flows (up to
        :data:`.staging.STAGE_MEMBERS` jobs or ~1 MB of bodies: each script stays short),
        pipelined in one round trip; each flow is stored atomically, whole. A large
        fan-out is stored in bounded steps instead (:mod:`.staging`)."""
        for spec in flows:
            check_numbers((*spec.members, *spec.steps))
        if not flows:
            self._conn()
            return []
        await self._note_queues([m.queue for spec in flows for m in (*spec.members, *spec.steps)])
        if self._epoch.is_due():
            await self.check_epoch()
        out: list[EnqueueOutcome | Exception | None] = [None] * len(flows)
        rest: list[int] = []
        for i, spec in enumerate(flows):
            if self._stages(spec):
                out[i] = await self._enqueue_staged(spec)
            else:
                rest.append(i)
        if rest:
            others = [flows[i] for i in rest]
            if self.cluster:
                done = await self._enqueue_flows_per_slot(others)
            else:
                done = await self._enqueue_flows_grouped(others)
            for i, outcome in zip(rest, done, strict=True):
                out[i] = outcome
        return [o for o in out if o is not None]

    async def _enqueue_flows_grouped(
        self, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome | Exception]:
        """Workflows on one Redis: one ``flow_enqueue`` per group of flows, pipelined."""
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        groups: list[list[FlowSpec]] = []
        args: list[Any] = []
        group: list[FlowSpec] = []
        size = jobs = 0
        for spec in flows:
            more, extra = flow_args(spec)
            count = len(spec.members) + len(spec.steps)
            if group and (size + extra > STAGE_BYTES or jobs + count > STAGE_MEMBERS):
                groups.append(group)
                calls.append(self._flow_call(group, args))
                group, args, size, jobs = [], [], 0, 0
            group.append(spec)
            args += more
            size += extra
            jobs += count
        groups.append(group)
        calls.append(self._flow_call(group, args))
        replies = await self._eval_pipelined(calls)
        return [
            flow_outcome(spec, answer)
            for group, reply in zip(groups, replies, strict=True)
            for spec, answer in zip(group, reply, strict=True)
        ]

    def _stages(self, spec: FlowSpec) -> bool:
        """Is ``spec`` a large fan-out, stored in bounded steps (:mod:`.staging`)? One
        with more than STAGE_MEMBERS members or STAGE_BYTES of payloads, all on one
        queue, and every job of it on one slot."""
        members = spec.members
        if len(members) < 2:
            return False
        # (the payload is most of a body: the bodies are encoded only when staged)
        if len(members) <= STAGE_MEMBERS and sum(len(m.payload) for m in members) <= STAGE_BYTES:
            return False
        queue = members[0].queue
        if any(m.queue != queue for m in members):
            return False
        # (a flow across slots is stored per slot instead: _enqueue_flows_per_slot)
        return (
            not self.cluster or len({self._slot(m.queue) for m in (members[0], *spec.steps)}) == 1
        )

    async def _enqueue_staged(self, spec: FlowSpec) -> EnqueueOutcome | Exception:
        """Store a large fan-out in bounded steps (:mod:`.staging`): stage its members a
        chunk per script, store the flow, release the members a chunk per script; in
        order, pipelined (a round trip per ~8 MB of bodies)."""
        queue, root, prefix = spec.members[0].queue, spec.steps[-1].queue, self.keys.prefix
        args, _ = flow_args(spec, staged=True)  # (checks the members' ids and priority)
        bodies = [encode_body(m) for m in spec.members]
        ranges = chunks([len(b) for b in bodies])
        seq = [self.keys.seq(queue)]
        ttl = round(STAGE_TTL * 1000)
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = [
            ("flow_stage", seq, [prefix, queue, spec.id, root, ttl, a, *bodies[a:b]])
            for a, b in ranges
        ]
        calls.append(self._flow_call([spec], args))
        calls += [("flow_open", seq, [prefix, queue, root, spec.id, b - a]) for a, b in ranges]
        replies: list[Any] = []
        start = size = 0
        for i, (_, _, call_args) in enumerate(calls):
            size += sum(len(a) for a in call_args if isinstance(a, bytes))
            if size > _PIPELINE_BYTES or i == len(calls) - 1:
                replies += await self._eval_pipelined(calls[start : i + 1])
                start, size = i + 1, 0
        staged, stored = replies[: len(ranges)], replies[len(ranges)][0]
        for reply in staged:
            if isinstance(reply, bytes | str) and text(reply).startswith("TYPEDQ_FLOW_ID_TAKEN"):
                return ConfigError(id_taken(text(reply).split()[1], spec.id))
        if stored in (b"TYPEDQ_FLOW_UNSTAGED", "TYPEDQ_FLOW_UNSTAGED"):
            return BrokerError(
                f"enqueue of flow {spec.id!r}: its staged members vanished before it was "
                "stored (deleted, or expired): nothing was stored, enqueue it again"
            )
        return flow_outcome(spec, stored)

    async def _enqueue_flows_per_slot(
        self, flows: Sequence[FlowSpec]
    ) -> list[EnqueueOutcome | Exception]:
        """Workflows on Redis Cluster: one script per flow on its own slot, pipelined.

        A flow whose jobs are on queues of several slots (*across*) takes two rounds:
        first its members (on every queue, the root's too) and its steps on every queue
        but its root's, held and pending, in bounded chunks (``flow_part``, one call per
        chunk: :func:`part_chunks`), then its root's part (its own queue's steps and the
        flow record), which starts the others through its outbox, an entry per chunk
        (delivered on the way, a script per chunk, see :meth:`_deliver`). A part
        refused (``QueueFull``, an id taken) refuses the flow: the root's part is not
        sent and the pending jobs stored are dropped, a chunk per script; so they are
        when the root's part is refused.
        """
        out: list[EnqueueOutcome | Exception | None] = [None] * len(flows)
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        at: list[tuple[int, str]] = []  # (flow, queue of its part: '' for a whole flow)
        across: list[int] = []
        parts: dict[int, list[PartChunk]] = {}
        exists = await self._flows_stored(
            [spec for spec in flows if len({self._slot(m.queue) for m in _jobs(spec)}) > 1]
        )
        for i, spec in enumerate(flows):
            queues = dict.fromkeys(m.queue for m in (*spec.members, *spec.steps))
            slots = {self._slot(q) for q in queues}
            if len(slots) == 1:
                args, _ = flow_args(spec)
                at.append((i, ""))
                calls.append(self._flow_call([spec], args))
                continue
            if spec.id in exists:
                # Stored before (its own job exists): its parts must not re-create the
                # jobs it has lost since (removed, purged, dropped by retention).
                out[i] = EnqueueOutcome(spec.id, False)
                continue
            across.append(i)
            parts[i] = part_chunks(spec)
            for part in parts[i]:
                q = part.queue
                head = [self.keys.prefix, self.queue_cap([q])]
                at.append((i, q))
                calls.append(("flow_part", [self.keys.seq(q)], head + part_args(spec, part)))
        stored: dict[int, set[str]] = {}  # flow -> queues where its parts stored jobs
        if calls:
            replies = await self._eval_in_pipelines(calls)
            for (i, q), reply in zip(at, replies, strict=True):
                if not q:
                    out[i] = flow_outcome(flows[i], reply[0])
                elif isinstance(reply, bytes | str):
                    # (An id taken comes first, as on one Redis, which checks ids, then room.)
                    refusal = flow_outcome(flows[i], reply)
                    if out[i] is None or (
                        isinstance(out[i], QueueFull) and not isinstance(refusal, QueueFull)
                    ):
                        out[i] = refusal
                elif int(reply) == 1:
                    stored.setdefault(i, set()).add(q)
        # A part found its queue full, but an id of the flow's steps may be taken on the
        # root's queue: that refusal comes first, as on one Redis.
        for i in across:
            if isinstance(out[i], QueueFull):
                taken = await self._first_taken(flows[i])
                if taken is not None:
                    out[i] = ConfigError(id_taken(taken, flows[i].id))
        roots = [i for i in across if out[i] is None]
        if roots:
            replies = await self._eval_many(
                [
                    self._flow_call(
                        [flows[i]],
                        flow_args(flows[i], across=[p.range for p in parts[i] if p.indexes])[0],
                    )
                    for i in roots
                ]
            )
            for i, reply in zip(roots, replies, strict=True):
                out[i] = flow_outcome(flows[i], reply[0])
        # Refused: drop what its parts stored (held and pending: nothing of it ran). So
        # too for a flow that was there already and has ended (failed, cancelled, a job
        # of it removed): its parts re-created the jobs it had lost, which no root will
        # start. A running one keeps them: they are the pending jobs of a concurrent
        # first enqueue of it, which its root starts.
        ended = [
            i
            for i in across
            if stored.get(i) and isinstance(o := out[i], EnqueueOutcome) and not o.created
        ]
        for i in ended:
            state = await self.flow_state(flows[i].id, queue=flows[i].steps[-1].queue)
            if state is not None and state.pending >= 0:
                stored.pop(i)
        drops = [
            ("flow_apply", [self.keys.seq(q)], [self.keys.prefix, q, record])
            for i in across
            if isinstance(out[i], Exception) or i in ended
            for q in stored.get(i, ())
            for record in _drop_records(flows[i], parts[i], q)
        ]
        if drops:
            await self._eval_many(drops)
        return [o for o in out if o is not None]

    async def _eval_in_pipelines(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Scripts in order, pipelined, a round trip per ~8 MB of arguments."""
        replies: list[Any] = []
        start = size = 0
        for i, (_, _, args) in enumerate(calls):
            size += sum(len(a) for a in args if isinstance(a, bytes))
            if size > _PIPELINE_BYTES or i == len(calls) - 1:
                replies += await self._eval_many(calls[start : i + 1])
                start, size = i + 1, 0
        return replies

    async def _first_taken(self, spec: FlowSpec) -> str | None:
        """The first id of ``spec``'s steps on its root's queue that another job has. The
        parts checked the members' and the other queues' ids before their room
        (flow_part.lua); the root's part, which would check these, was not sent."""
        root = spec.steps[-1].queue
        ids = [m.id for m in spec.steps if m.queue == root]
        records = await self.get(ids, queue=root)
        return next((i for i, r in zip(ids, records, strict=True) if r is not None), None)

    async def _flows_stored(self, specs: Sequence[FlowSpec]) -> set[str]:
        """The ids of ``specs`` (flows across slots) whose own job exists: one ``get``
        per root queue."""
        by_root: dict[str, list[str]] = {}
        for spec in specs:
            by_root.setdefault(spec.steps[-1].queue, []).append(spec.id)
        found: set[str] = set()
        for root, ids in by_root.items():
            records = await self.get(ids, queue=root)
            found.update(i for i, r in zip(ids, records, strict=True) if r is not None)
        return found

    def _slot(self, queue: str) -> int:
        """The cluster slot of ``queue``'s keys."""
        return int(key_slot(self.keys.seq(queue).encode()))

    async def flow_state(self, flow_id: str, *, queue: str | None = None) -> FlowState | None:
        (where,) = await self._queues_of([flow_id], queue)
        if where is None:
            return None
        reply = await self._eval(
            "flow_info", [self.keys.job(where, flow_id)], [self.keys.prefix, where, flow_id]
        )
        if isinstance(reply, list) and reply and reply[0] == b"at":
            # A job of a flow across slots: its record is on its root's slot.
            root, flow_id = text(reply[1]), text(reply[2])
            reply = await self._eval(
                "flow_info", [self.keys.job(root, flow_id)], [self.keys.prefix, root, flow_id]
            )
        if not isinstance(reply, list):
            return None
        steps, members, pending = (int(v) for v in reply[:3])
        completed, failed, cancelled = (int(v) for v in reply[4:7])
        return FlowState(
            id=text(reply[3]),
            steps=steps,
            members=members,
            pending=pending,
            completed=completed,
            failed=failed,
            cancelled=cancelled,
        )

    def _flow_call(
        self, group: Sequence[FlowSpec], args: list[Any]
    ) -> tuple[str, Sequence[str], Sequence[Any]]:
        cap = self.queue_cap(m.queue for s in group for m in (*s.members, *s.steps))
        head = [self.keys.prefix, cap, len(group)]
        first = group[0].steps[-1].queue
        keys = [self.keys.seq(first), self.keys.request(first, _request_token())]
        return "flow_enqueue", keys, head + args
