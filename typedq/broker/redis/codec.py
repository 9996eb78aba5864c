"""What the Redis broker stores and reads back: job bodies, times, reply values.

A job that no worker has claimed yet is one Redis string holding a short text header and
the compact job body (:class:`Body`): the envelope without its id (the key says it) and
its queue (the record says it), trailing default fields left out. Times travel to and
from the scripts as integer microseconds (:func:`us`), which Lua's doubles hold exactly.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from ...names import check_name
from ..base import FinishOutcome, JobMessage, JobState, LeaseStatus
from .keys import STATE_LETTERS

__all__ = [
    "FINISH",
    "LEASE",
    "MAX_TTL_US",
    "MICRO",
    "STATES",
    "Body",
    "as_int",
    "decode_job",
    "encode",
    "encode_body",
    "from_us",
    "mb",
    "text",
    "us",
    "utc",
]

MICRO = 1_000_000
#: "Forever" that still fits a Lua double exactly.
MAX_TTL_US = 2**52
#: A state letter as the scripts store it -> the state.
STATES = {letter: JobState(name) for name, letter in STATE_LETTERS.items()}
#: A script's numeric answer -> the outcome.
FINISH = list(FinishOutcome)
LEASE = list(LeaseStatus)

encode = msgspec.msgpack.Encoder().encode
_decode_message = msgspec.msgpack.Decoder(JobMessage).decode


class Body(msgspec.Struct, frozen=True, array_like=True):
    """What Redis stores of a JobMessage: all but the id (the key says it) and the
    queue (the record says it). Trailing default values are left out when encoding."""

    task: str
    payload: bytes
    fingerprint: str = ""
    priority: int = 0
    max_retries: int = -1
    timeout: float = -1.0
    eta: float = 0.0
    delay: float = 0.0
    #: Limit buckets (typedq.limits); the claim script reads them at indexes 9 and 10.
    rate_key: str = ""
    concurrency_key: str = ""
    #: The schedule tick (typedq.schedule); after the limit keys, which Lua reads by index.
    scheduled_for: float = 0.0
    #: The producer's trace context (typedq.tracing); read by no script.
    trace_context: str = ""
    #: A fan-in callback's links to its members' spans, appended by the fan-in script
    #: (common/flow_settle.lua flow_release) to a body that has all the fields above.
    trace_links: str = ""
    #: A durable run's step: the run's queue (common/runs.lua reads it at index 14 when
    #: the job reaches a final state).
    run_queue: str = ""
    #: Fair shares (typedq.fair): the key and its weight, fields 15 and 16 (the claim
    #: script reads them from a body of 16 fields: lanes.lua fair_of).
    fair_key: str = ""
    fair_weight: int = 0


_decode_body = msgspec.msgpack.Decoder(Body).decode
_BODY_DEFAULTS = ("", b"", "", 0, -1, -1.0, 0.0, 0.0, "", "", 0.0, "", "", "", "", 0)


#: The defaults of the body's fields after the fingerprint (see :func:`encode_body`).
_TAIL_DEFAULTS = _BODY_DEFAULTS[3:]


def encode_body(m: JobMessage) -> bytes:
    """The stored body of ``m``: its fields but id and queue, trailing defaults left out."""
    if (
        m.priority,
        m.max_retries,
        m.timeout,
        m.eta,
        m.delay,
        m.rate_key,
        m.concurrency_key,
        m.scheduled_for,
        m.trace_context,
        m.trace_links,
        m.run_queue,
        m.fair_key,
        m.fair_weight,
    ) == _TAIL_DEFAULTS:
        # The usual job (the task's defaults, no limit keys, not traced): one tuple
        # encoded, without building and trimming the whole field list.
        return encode((m.task, m.payload, m.fingerprint) if m.fingerprint else (m.task, m.payload))
    if m.run_queue:
        # A durable run's queue: it names keys the finishing script touches (runs.lua).
        check_name("queue", m.run_queue)
    fields = [m.task, m.payload, m.fingerprint, m.priority, m.max_retries, m.timeout, m.eta]
    fields += (m.delay, m.rate_key, m.concurrency_key, m.scheduled_for, m.trace_context)
    fields += (m.trace_links, m.run_queue)
    if m.fair_weight:
        # A fair job's body has all 16 fields (the claim script finds them by count).
        # Its whole-number times go as ints (msgpack: 1 byte for -1 or 0, not a 9-byte
        # float; Body reads them back as floats), so the job's hash stays under Redis's
        # 64-byte value of the compact (listpack) encoding more often.
        for i in (5, 6, 7, 10):
            v = fields[i]
            if type(v) is float and v.is_integer() and -(2**53) < v < 2**53:
                fields[i] = int(v)
        fields += (m.fair_key, m.fair_weight)
        return encode(fields)
    n = len(fields)
    while n > 2 and fields[n - 1] == _BODY_DEFAULTS[n - 1]:
        n -= 1
    return encode(fields[:n])


def decode_job(job_id: str, queue: str, raw: bytes) -> JobMessage:
    """The JobMessage of a stored body; raises msgspec errors for bytes that are not one."""
    try:
        b = _decode_body(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        # A record written before bodies: the whole encoded JobMessage.
        try:
            message = _decode_message(raw)
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
        else:
            if message.id == job_id:
                return message
        raise
    return JobMessage(
        id=job_id,
        task=b.task,
        queue=queue,
        payload=b.payload,
        fingerprint=b.fingerprint,
        priority=b.priority,
        eta=b.eta,
        delay=b.delay,
        max_retries=b.max_retries,
        timeout=b.timeout,
        rate_key=b.rate_key,
        concurrency_key=b.concurrency_key,
        scheduled_for=b.scheduled_for,
        trace_context=b.trace_context,
        trace_links=b.trace_links,
        run_queue=b.run_queue,
        fair_key=b.fair_key,
        fair_weight=b.fair_weight,
    )


def us(seconds: float) -> int:
    """Seconds as integer microseconds, total: NaN and negatives are 0, +inf and huge
    values are :data:`MAX_TTL_US` (never an exception on the settle path)."""
    try:
        micro = float(seconds) * MICRO
    except OverflowError:  # an int too large for a float
        return MAX_TTL_US if seconds > 0 else 0
    except (TypeError, ValueError):
        return 0
    if not micro > 0:  # also NaN
        return 0
    if micro >= MAX_TTL_US:
        return MAX_TTL_US
    return int(micro)


def from_us(value: Any) -> float:
    """Integer microseconds from a script reply as seconds; 0.0 for nil or garbage."""
    if value is None:
        return 0.0
    try:
        return int(value) / MICRO
    except (TypeError, ValueError):
        return 0.0


def as_int(value: Any, default: int = 0) -> int:
    """A reply value as an int, ``default`` when it is not one."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def text(value: Any) -> str:
    """A reply value as text (bytes decoded as UTF-8, bad bytes replaced)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def utc(seconds: float) -> str:
    """Epoch seconds as a UTC time for messages."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def mb(n: int) -> str:
    """Bytes as megabytes for messages."""
    return f"{n / 1_048_576:.1f} MB"
