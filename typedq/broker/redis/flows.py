"""Workflows on Redis: the arguments of ``flow_enqueue.lua`` (see typedq/broker/flow.py).

A held step's body is stored split around its (empty) payload: the scripts that hand
off a result splice it in as ``head .. bin(result) .. tail`` without decoding anything.
"""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError, QueueFull
from ...names import check_job_id, check_name
from ..base import EnqueueOutcome, JobMessage
from ..flow import FlowSpec, id_taken
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
    """The arguments of one flow in ``flow_enqueue.lua``, and the bytes of its bodies."""
    args: list[Any] = [
        check_job_id(spec.id),
        len(spec.steps),
        len(spec.members),
        "1" if spec.fan_out else "0",
        "1" if spec.collector else "0",
        "c" if spec.collect else "a",
    ]
    size = 0
    for m in spec.members:
        body = encode_body(m)
        size += len(body)
        args += (check_job_id(m.id), check_name("queue", m.queue), str(int(m.priority)), body)
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
