"""Workflows on Redis: the arguments of ``flow_enqueue.lua`` (see typedq/broker/flow.py).

A held step's body is stored split around its (empty) payload: the scripts that hand
off a result splice it in as ``head .. bin(result) .. tail`` without decoding anything.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, QueueFull
from ...names import check_job_id, check_name
from ..base import EnqueueOutcome, JobMessage
from ..flow import FlowSpec, id_taken, member_id
from .codec import encode, encode_body

__all__ = ["flow_args", "flow_outcome", "split_body"]

_EMPTY_BIN = b"\xc4\x00"


def split_body(message: JobMessage) -> tuple[bytes, bytes, bytes]:
    """(body, head, tail) of a held step: ``body == head + bin(b"") + tail``."""
    body = encode_body(message)
    head_len = 1 + len(encode(message.task))  # fixarray header (at most 15 fields), task
    head, rest = body[:head_len], body[head_len:]
    if not rest.startswith(_EMPTY_BIN):
        raise ValueError(f"step {message.id!r} of a flow must have an empty payload")
    return body, head, rest[len(_EMPTY_BIN) :]


def flow_args(spec: FlowSpec) -> tuple[list[Any], int]:
    """The arguments of one flow in ``flow_enqueue.lua``, and the bytes of its bodies.

    A fan-out's members are one task's jobs: one queue, one priority, ids derived from
    the flow's (``F.m<i>``), so each member travels as its body alone.
    """
    members = spec.members
    queue, priority = "", "0"
    if members:
        queue, priority = check_name("queue", members[0].queue), str(int(members[0].priority))
    args: list[Any] = [
        check_job_id(spec.id),
        len(spec.steps),
        len(members),
        "1" if spec.fan_out else "0",
        "1" if spec.collector else "0",
        "c" if spec.collect else "a",
        queue,
        priority,
    ]
    size = 0
    for i, m in enumerate(members):
        if m.queue != members[0].queue or m.priority != members[0].priority:
            raise ValueError(f"the members of flow {spec.id!r} must share one queue and priority")
        if m.id != member_id(spec.id, i):
            raise ValueError(
                f"member {i} of flow {spec.id!r} must have id {member_id(spec.id, i)!r}"
            )
        body = encode_body(m)
        size += len(body)
        args.append(body)
    for k, m in enumerate(spec.steps):
        if k == 0 and not spec.fan_out:
            body, head, tail = encode_body(m), b"", b""
        else:
            body, head, tail = split_body(m)
        size += len(body)
        args += (check_job_id(m.id), check_name("queue", m.queue), str(int(m.priority)))
        args += (body, head, tail)
    return args, size


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
