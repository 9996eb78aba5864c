"""Workflows on Redis: the arguments of ``flow_enqueue.lua`` (see typedq/broker/flow.py),
and the hand-offs of flows across slots on Redis Cluster.

A held step's body is stored split around its (empty) payload: the scripts that hand
off a result splice it in as ``head .. bin(result) .. tail`` without decoding anything.

A flow whose jobs are on queues of several cluster slots is stored per slot: first its
jobs on every queue but the root's (the queue of the flow's own job, which holds the
flow record), held and pending (``flow_part.lua``), then the root's part with the
record (``flow_enqueue.lua``, *across*), which starts the others. A script that settles
a job of such a flow writes its hand-offs to other slots to its own queue's outbox and
names them in its reply (:func:`unwrap`); the broker applies them on their target's
slot (``flow_apply.lua``) and then deletes them (``flow_ack.lua``). See the outbox in
``lua/common.lua``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ...errors import ConfigError, QueueFull
from ...names import check_job_id, check_name
from ..base import EnqueueOutcome, JobMessage
from ..flow import FlowSpec, id_taken, member_id
from .codec import encode, encode_body

__all__ = [
    "HANDOFF_MARK",
    "Handoff",
    "flow_args",
    "flow_outcome",
    "part_args",
    "split_body",
    "unwrap",
]

_EMPTY_BIN = b"\xc4\x00"

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
    target, record)...]`` (``flow_reply`` in ``lua/common.lua``); no other reply starts
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
    head_len = 1 + len(encode(message.task))  # fixarray header (at most 15 fields), task
    head, rest = body[:head_len], body[head_len:]
    if not rest.startswith(_EMPTY_BIN):
        raise ValueError(f"step {message.id!r} of a flow must have an empty payload")
    return body, head, rest[len(_EMPTY_BIN) :]


def flow_args(spec: FlowSpec, *, across: bool = False) -> tuple[list[Any], int]:
    """The arguments of one flow in ``flow_enqueue.lua``, and the bytes of its bodies.

    A fan-out's members are one task's jobs: one priority, ids derived from the flow's
    (``F.m<i>``), so each member travels as its body alone; their queues travel as one
    name when they share it (else one per member: a flow across queues).

    :param across: the root's part of a flow across slots: only the jobs on the queue
        of the flow's own job are stored by this call, the others travel without bodies
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
        "1" if across else "0",
    ]
    size = 0
    for i, m in enumerate(members):
        if m.priority != members[0].priority:
            raise ValueError(f"the members of flow {spec.id!r} must share one priority")
        if m.id != member_id(spec.id, i):
            raise ValueError(
                f"member {i} of flow {spec.id!r} must have id {member_id(spec.id, i)!r}"
            )
        body = encode_body(m) if not across or m.queue == root else b""
        size += len(body)
        args.append(body)
    for k, m in enumerate(spec.steps):
        if across and m.queue != root:
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


def part_args(spec: FlowSpec, queue: str) -> list[Any]:
    """The arguments of ``flow_part.lua`` after its first two (prefix, max_queue_length):
    the jobs of a flow across slots on ``queue``, which is not its root's."""
    steps = spec.steps
    members = [(i, m) for i, m in enumerate(spec.members) if m.queue == queue]
    args: list[Any] = [
        check_name("queue", queue),
        check_job_id(spec.id),
        steps[-1].queue,
        len(steps),
        queue_list([check_name("queue", m.queue) for m in steps]),
        len(members),
        str(int(members[0][1].priority)) if members else "0",
    ]
    for i, m in members:
        if m.id != member_id(spec.id, i):
            raise ValueError(
                f"member {i} of flow {spec.id!r} must have id {member_id(spec.id, i)!r}"
            )
        args += (i, encode_body(m))
    here = [(k, m) for k, m in enumerate(steps) if m.queue == queue]
    args.append(len(here))
    for k, m in here:
        if k == 0 and not spec.fan_out:
            body, head, tail = encode_body(m), b"", b""
        else:
            body, head, tail = split_body(m)
        args += (k, str(int(m.priority)), body, head, tail)
    return args


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
