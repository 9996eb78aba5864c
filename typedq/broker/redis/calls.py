"""How the Redis broker calls its scripts, mixed into RedisBroker: one call, several
pipelined in one round trip, one per queue; the hand-offs of flows across slots that
their replies name are delivered on the way; a "Function not found" (FUNCTION FLUSH, a
restart without persistence, a node added later) is answered by loading the library
again and re-sending what did not run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import redis.exceptions as rexc

from ...errors import ConfigError
from .core import RedisCore, _missing
from .flows import Handoff, unwrap

__all__ = ["ScriptCalls"]

#: Loads of the library (each followed by a re-send) at most for a call that meets
#: "Function not found", where they are not one transaction (Redis Cluster, an ACL user
#: without MULTI): another flush may come between a load and the re-send.
_LOADS = 5
#: Scripts sent on the broker's :class:`~typedq.broker.redis.connection.Lane` when it is
#: free (standalone Redis): the worker's calls of every job (claim, settle and claim) and
#: of every durable run's turn (read, compare-and-append).
_LANE_SCRIPTS = frozenset({"claim", "complete", "run_get", "run_schedule", "run_append"})


def _already_loaded(exc: BaseException) -> bool:
    """Whether ``exc`` is FUNCTION LOAD's answer for a library of that name (the same
    source: the name carries its hash) that Redis has already."""
    return isinstance(exc, rexc.ResponseError) and "already exists" in str(exc)


class ScriptCalls(RedisCore):
    """The script calls of :class:`~.broker.RedisBroker` (see the module)."""

    async def _eval_many(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Several scripts, each on its own slot: one round trip (pipelined, in order)."""
        if len(calls) == 1:
            name, keys, args = calls[0]
            return [await self._eval(name, keys, args)]
        return await self._eval_pipelined(calls)

    async def _per_queue(
        self,
        name: str,
        queues: Sequence[str | None],
        call: Any,
        missing: Any,
    ) -> list[Any]:
        """Run script ``name`` once per queue over the items of that queue, in one round
        trip; per item its answer in input order. ``call(queue, indexes)`` builds (keys,
        args) and the script answers a list with one entry per item; items with no
        queue (no such job) answer ``missing``."""
        groups: dict[str, list[int]] = {}
        for i, q in enumerate(queues):
            if q is not None:
                groups.setdefault(q, []).append(i)
        out: list[Any] = [missing] * len(queues)
        if not groups:
            self._conn()
            return out
        calls = [(name, *call(q, idx)) for q, idx in groups.items()]
        replies = await self._eval_many(calls)
        for idx, reply in zip(groups.values(), replies, strict=True):
            for i, answer in zip(idx, reply, strict=True):
                out[i] = answer
        return out

    async def _load_library(self) -> None:
        """``FUNCTION LOAD`` the library: on the server, or on every primary of Redis
        Cluster. Its name carries the hash of its source, so a library of that name
        already there is this one ("already exists" is success)."""
        redis: Any = self._conn()
        load = ("FUNCTION", "LOAD", self._library.source)
        if self.cluster:
            # One node at a time: a node that has it must not fail the others.
            calls = [redis.execute_command(*load, target_nodes=n) for n in redis.get_primaries()]
        else:
            calls = [redis.execute_command(*load)]
        replies = await asyncio.gather(*calls, return_exceptions=True)
        for reply in replies:
            if isinstance(reply, BaseException) and not _already_loaded(reply):
                if isinstance(reply, rexc.ResponseError) and "unknown command" in str(reply):
                    raise ConfigError(
                        f"{self._where} has no FUNCTION command: typedq needs Redis 7.0 or "
                        "later (its scripts are one Redis Functions library); upgrade Redis"
                    )
                if isinstance(reply, rexc.RedisError | OSError):
                    self._raise(reply, "loading the function library")
                raise reply

    async def _eval(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call script ``name`` (a function of the library) with ``keys`` and ``args``;
        the hand-offs of flows across slots its reply names are delivered first."""
        handoffs: list[Handoff] = []
        reply = unwrap(await self._eval_one(name, keys, args), handoffs)
        if handoffs:
            await self._deliver(handoffs)
        return reply

    async def _eval_one(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> Any:
        """Call script ``name`` (a function of the library) with ``keys`` and ``args``."""
        function = self._library.functions[name]
        execute: Any = self._executor(name)
        try:
            reply = await execute("FCALL", function, len(keys), *keys, *args)
        except rexc.ResponseError as exc:
            if not _missing(exc):
                self._raise(exc, name)
            (reply,) = await self._reload_and_send([(name, keys, args)])
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, name)
        if isinstance(reply, Exception):
            self._raise(reply, name)
        return reply

    def _executor(self, name: str) -> Any:
        """What sends script ``name``: the lane when it is free and the script is one of
        the worker's per-job calls, else the pooled client (untyped in redis-py)."""
        lane = self._lane
        if lane is not None and not lane.busy and name in _LANE_SCRIPTS:
            return lane.execute
        return self._conn().execute_command

    async def _reload_and_send(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Load the library again and send ``calls`` again (they met "Function not found":
        FUNCTION FLUSH, a restart without persistence, a node added later; none of them
        ran). On a single Redis the load and the calls are one transaction, so no other
        flush can come between them (as EVAL, which carries its source, could not meet
        NOSCRIPT). Redis Cluster, and an ACL user without MULTI, load first, then re-send,
        a few times at most. Per call its reply or its error."""
        if not self.cluster:
            pipe = self._conn().pipeline(transaction=True)
            execute: Any = pipe.execute_command  # untyped in redis-py
            execute("FUNCTION", "LOAD", self._library.source)
            self._queue_calls(pipe, calls)
            try:
                loaded, *replies = await pipe.execute(raise_on_error=False)
            except rexc.NoPermissionError:
                pass  # no MULTI for this ACL user (not in the documented ACL): load, re-send
            except (rexc.RedisError, OSError) as exc:
                self._raise(exc, calls[0][0])
            else:
                if isinstance(loaded, Exception) and not _already_loaded(loaded):
                    self._raise(loaded, "loading the function library")
                return replies
        todo = list(range(len(calls)))
        replies = [None] * len(calls)
        for _ in range(_LOADS):
            await self._load_library()
            again = await self._pipelined([calls[i] for i in todo])
            for i, reply in zip(todo, again, strict=True):
                replies[i] = reply
            todo = [i for i in todo if _missing(replies[i])]
            if not todo:
                break
        return replies

    async def _eval_pipelined(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """Run several scripts in one round trip, in order (not as a transaction).

        A call that meets "Function not found" did not run: the library is loaded again
        and those calls alone are re-sent, in one more round trip. Each script is
        idempotent when re-sent, so redis-py's retry of the whole pipeline after a
        connection error is safe too.
        """
        replies = await self._pipelined(calls)
        missing = [i for i, reply in enumerate(replies) if _missing(reply)]
        if missing:
            again = await self._reload_and_send([calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        handoffs: list[Handoff] = []
        for i, (reply, (name, _, _)) in enumerate(zip(replies, calls, strict=True)):
            if isinstance(reply, Exception):
                self._raise(reply, name)
            replies[i] = unwrap(reply, handoffs)
        if handoffs:
            await self._deliver(handoffs)
        return replies

    def _queue_calls(
        self, pipe: Any, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> None:
        """Add an FCALL per call to ``pipe``."""
        functions = self._library.functions
        for name, keys, args in calls:
            pipe.execute_command("FCALL", functions[name], len(keys), *keys, *args)

    async def _pipelined(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        """One round trip of FCALLs; per call its reply or its error."""
        pipe = self._conn().pipeline(transaction=False)
        self._queue_calls(pipe, calls)
        try:
            replies: list[Any] = await pipe.execute(raise_on_error=False)
        except (rexc.RedisError, OSError) as exc:
            self._raise(exc, calls[0][0])
        return replies
