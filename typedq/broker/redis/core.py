"""What the core of :class:`~.broker.RedisBroker` gives the parts the class is made of.

:class:`RedisCore` is the typed base of its mixins (one module per concept, listed in
:mod:`.broker`): the core's attributes and methods that they use are declared here for
the type checker only, and defined in :mod:`.broker` (mypy checks those definitions
against these declarations). At run time the class adds nothing to the broker interface
it derives from, so a mixin's call of a core method is a plain method call on the one
class. The helpers that the core and the mixins share are here too.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import redis.asyncio as aioredis
import redis.exceptions as rexc

from ...errors import BrokerError
from ..base import Broker
from .connection import Lane
from .health import EpochWatch, MemoryWatch
from .keys import Keys
from .listener import Notifications
from .scripts import Library

if TYPE_CHECKING:
    from .flows import Handoff

__all__ = ["RedisCore"]


def _missing(reply: object) -> bool:
    """Whether ``reply`` is Redis's answer for a function it does not have (FCALL
    before the library was loaded, or after FUNCTION FLUSH, a restart or on a new node)."""
    return isinstance(reply, rexc.ResponseError) and str(reply).startswith("Function not found")


def _request_token() -> str:
    """A random token for one call (claim, enqueue, cancel): the key of its request
    record, which makes a re-sent script return the first copy's answer."""
    return secrets.token_hex(8)


class RedisCore(Broker):
    """The core of :class:`~.broker.RedisBroker` as its mixins see it (see the module)."""

    keys: Keys
    #: True on Redis Cluster (``redis+cluster://``): one script call per slot.
    cluster: bool
    handoff_age: float
    _redis: aioredis.Redis | None
    _notes: Notifications
    _epoch: EpochWatch
    _memory: MemoryWatch
    _library: Library
    _held: dict[str, tuple[str, str]]
    _acks: dict[str, list[str]]
    #: Where the broker is, for messages ("Redis at host:port").
    _where: str
    #: The worker's own connection for its per-job scripts (standalone Redis), if any.
    _lane: Lane | None

    if TYPE_CHECKING:

        def _conn(self) -> aioredis.Redis: ...

        def _error(self, exc: BaseException, op: str) -> BrokerError: ...

        def _raise(self, exc: BaseException, op: str) -> NoReturn: ...

        async def _load_library(self) -> None: ...

        def _executor(self, name: str) -> Any: ...

        def _queue_calls(
            self, pipe: Any, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
        ) -> None: ...

        async def _pipelined(
            self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
        ) -> list[Any]: ...

        def _translate(self, op: str) -> contextlib.AbstractContextManager[None]: ...

        async def check_epoch(self) -> bool: ...

        async def check_memory(self) -> bool: ...

        async def _note_queues(self, queues: Sequence[str]) -> None: ...

        async def known_queues(self) -> list[str]: ...

        async def _locate(self, ids: Sequence[str]) -> dict[str, str]: ...

        async def _queues_of(self, ids: Sequence[str], queue: str | None) -> list[str | None]: ...

        async def _held_queues(self, pairs: Sequence[tuple[str, str]]) -> list[str | None]: ...

        async def _redis_time_us(self) -> int: ...

        async def _hgetall(self, key: str) -> dict[Any, Any]: ...

        async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

        async def _eval_one(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any: ...

        async def _deliver(self, handoffs: Sequence[Handoff]) -> int: ...

        async def _eval_many(
            self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
        ) -> list[Any]: ...

        async def _eval_pipelined(
            self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
        ) -> list[Any]: ...

        async def _reload_and_send(
            self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
        ) -> list[Any]: ...

        async def _per_queue(
            self, name: str, queues: Sequence[str | None], call: Any, missing: Any
        ) -> list[Any]: ...

        def _ack_calls(
            self, acks: dict[str, list[str]]
        ) -> list[tuple[str, Sequence[str], Sequence[Any]]]: ...

        def _retention(self, *, completed: bool) -> tuple[int, int]: ...
