"""What a collecting fan-in's callback receives per member: ``Ok[T]`` or ``Failed``.

``resize.map(images).collect(make_album)`` runs ``make_album`` once every member has
settled, whatever their fate; its input is ``list[Ok[Thumb] | Failed]``, in input order,
so partial failure is handled in code, checked by mypy::

    @app.task
    async def make_album(thumbs: list[Ok[Thumb] | Failed]) -> Album:
        good = [t.value for t in thumbs if isinstance(t, Ok)]
        ...

On the wire an element is a msgpack array ``["ok", <result>]`` or
``["failed", <FailureRecord>]``, built by the broker from the stored bytes (see
:mod:`typedq.broker.flow`) with :func:`collect_element` and :func:`fan_in_payload`,
which live here so that :mod:`typedq.serde` (which encodes the same array from models)
and the brokers share them without serde knowing any broker.
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from .errors import FailureRecord

__all__ = [
    "Failed",
    "Ok",
    "collect_element",
    "fan_in_payload",
    "msgpack_array_header",
    "msgpack_bin",
]

T = TypeVar("T")


class Ok(msgspec.Struct, Generic[T], frozen=True):
    """A member that completed: ``value`` is its result, validated as the task's output."""

    value: T


class Failed(msgspec.Struct, frozen=True):
    """A member that failed or was cancelled: ``error`` is its final FailureRecord."""

    error: FailureRecord


# -- the wire form (msgpack bytes spliced without decoding) ------------------------------


def msgpack_array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` elements."""
    if n < 16:
        return bytes([0x90 | n])
    if n < 0x10000:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def msgpack_bin(data: bytes) -> bytes:
    """``data`` as a msgpack bin value (header and bytes)."""
    n = len(data)
    if n < 0x100:
        return b"\xc4" + bytes([n]) + data
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big") + data
    return b"\xc6" + n.to_bytes(4, "big") + data


_OK = b"\x92\xa2ok"
_FAILED = b"\x92\xa6failed"


def collect_element(result: bytes | None, error: bytes | None) -> bytes:
    """One element of a collecting fan-in: ``["ok", result]`` or ``["failed", record]``."""
    if result is not None:
        return _OK + result
    return _FAILED + (error or b"\xc0")


def fan_in_payload(elements: list[bytes]) -> bytes:
    """The fan-in payload: a msgpack array of already-encoded elements, in order."""
    return msgpack_array_header(len(elements)) + b"".join(elements)
