"""Redis client errors as typedq errors, translated in one place.

Users catch typedq's errors (:class:`~typedq.errors.BrokerError` and its kinds), never
``redis.exceptions``, as httpcore's ``map_exceptions`` does for its transports.
"""

from __future__ import annotations

import redis.exceptions as rexc

from ...errors import BrokerError, BrokerUnavailable, QueueFull
from .connection import SOCKET_TIMEOUT

__all__ = ["ERRORS", "broker_error", "scrub"]

#: Every Redis client error a caller can meet. The first row whose types match wins, so a
#: subclass comes before its base (redis-py's AuthenticationError is a ConnectionError;
#: OutOfMemoryError and NoPermissionError are ResponseErrors). Each message says what
#: happened and how to fix it; its fields: ``where`` (the server), ``op`` (the operation),
#: ``detail`` (Redis's words, password scrubbed), ``prefix`` (the app's key prefix).
#: Anything else is a plain BrokerError.
ERRORS: tuple[
    tuple[type[BaseException] | tuple[type[BaseException], ...], type[BrokerError], str], ...
] = (
    (
        (rexc.AuthenticationError, rexc.AuthorizationError),
        BrokerError,
        "{where} refused the credentials ({op}): {detail}; check the user and password "
        "in the broker URL (redis://USER:PASSWORD@HOST:PORT/DB)",
    ),
    (
        # A pool's bounded wait for a free connection ran out (before ConnectionError:
        # MaxConnectionsError is one); the standalone pool's is matched by its words.
        rexc.MaxConnectionsError,
        BrokerUnavailable,
        "{where} had no free connection for {op} ({detail}): every connection stayed busy "
        "with a call Redis had not answered; Redis is slow or overloaded, or this process "
        "sends more calls at once than Redis answers",
    ),
    (
        # Before OSError: the built-in TimeoutError is one.
        (rexc.TimeoutError, TimeoutError),
        BrokerUnavailable,
        "{where} did not answer in time ({op}): {detail}",
    ),
    (
        (rexc.ConnectionError, OSError),
        BrokerUnavailable,
        "{where} is unreachable ({op}): {detail}",
    ),
    (
        rexc.NoPermissionError,
        BrokerError,
        "{where} denied {op} to this ACL user: {detail}. The user needs ~{prefix}* "
        "~{tags}* and &{prefix}*, +@read +@write +@pubsub +time +info, and +fcall "
        "+function|load (both in +@scripting)",
    ),
    (
        rexc.OutOfMemoryError,
        BrokerError,
        "{where} is at maxmemory (out of memory, noeviction): {op} was refused and changed "
        "nothing. Workers keep draining jobs, and memory comes back as retention removes "
        "finished jobs; retry later, or raise maxmemory",
    ),
)


#: What redis-py's blocking pool (standalone Redis) raises, as a plain ConnectionError,
#: when its bounded wait for a free connection runs out.
_NO_CONNECTION = "No connection available."


def scrub(message: str, password: str | None) -> str:
    """``message`` with the password (if any) replaced by ``***``."""
    return message.replace(password, "***") if password else message


def broker_error(
    exc: BaseException, op: str, *, where: str, prefix: str, password: str | None
) -> BrokerError:
    """The typedq error for a Redis client error that ``op`` met (see :data:`ERRORS`).

    The message always gives a reason: an exception without words (redis-py raises some,
    ``MaxConnectionsError()``; so does ``asyncio.timeout``) is named by its type."""
    detail = scrub(str(exc), password) or type(exc).__name__
    if type(exc) is rexc.ConnectionError and detail == _NO_CONNECTION:
        # The standalone pool's wait (SOCKET_TIMEOUT) ran out.
        detail = f"none came free within {SOCKET_TIMEOUT:g} s"
        exc = rexc.MaxConnectionsError(detail)
    if isinstance(exc, rexc.ResponseError) and detail.startswith("TYPEDQ_QUEUE_FULL"):
        # Not a Redis error but the enqueue script's own answer.
        _, queue, pending, extra, limit = detail.split()
        return QueueFull(
            f"queue {queue!r} holds {pending} pending jobs; adding {extra} would pass "
            f"max_queue_length={limit}"
        )
    for types, error, message in ERRORS:
        if isinstance(exc, types):
            # The app's keys, and its queues' (hash tags '{<namespace>:<queue>}').
            tags = "tq:" + prefix.removeprefix("typedq:")[:-2] + ":"
            return error(
                message.format(where=where, op=op, detail=detail, prefix=prefix, tags=tags)
            )
    return BrokerError(f"{where}: {op} failed: {detail}")
