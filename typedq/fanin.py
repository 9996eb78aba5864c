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
:mod:`typedq.broker.flow`).
"""

from __future__ import annotations

from typing import Generic, TypeVar

import msgspec

from .errors import FailureRecord

__all__ = ["Failed", "Ok"]

T = TypeVar("T")


class Ok(msgspec.Struct, Generic[T], frozen=True):
    """A member that completed: ``value`` is its result, validated as the task's output."""

    value: T


class Failed(msgspec.Struct, frozen=True):
    """A member that failed or was cancelled: ``error`` is its final FailureRecord."""

    error: FailureRecord
