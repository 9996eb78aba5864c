"""Job streams on Redis (capability JobStreams, :mod:`typedq.broker.streams`): one Redis
stream per job, ``Q js:<id>`` in the job's queue slot (layout in :mod:`.keys`).

Appends are one script call per job's batch (``stream_append.lua``: the fence, the
trims, every XADD and the TTL in one round trip; several jobs' batches pipelined).
Reads are XREAD BLOCK on a pooled connection, as the queue event streams' (the
connection is held, dedicated to the read, while it waits; a read returns as soon as an
entry comes: no polling).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...names import check_name
from ..streams import STREAM_MAX, StreamAppend, StreamEntry
from .codec import STATES, as_int, text
from .connection import SOCKET_TIMEOUT
from .core import RedisCore

__all__ = ["StreamOps"]


class StreamOps(RedisCore):
    """The job-stream methods of :class:`~.broker.RedisBroker`."""

    async def append_streams(self, appends: Sequence[StreamAppend]) -> list[bool]:
        if not appends:
            self._conn()
            return []
        calls = []
        k = self.keys
        for a in appends:
            ttl_ms = max(1, round(a.ttl * 1000))
            args: list[Any] = [
                k.prefix,
                a.queue,
                a.job_id,
                a.token,
                a.attempt,
                a.seq,
                "1" if a.fresh else "",
                "1" if a.end else "",
                ttl_ms,
                STREAM_MAX,
                *a.items,
            ]
            calls.append(("stream_append", [k.job(a.queue, a.job_id)], args))
        replies = await self._eval_many(calls)
        return [bool(as_int(r)) for r in replies]

    async def read_stream(
        self, job_id: str, *, queue: str, after: str, timeout: float, limit: int = 1000
    ) -> list[StreamEntry]:
        key = self.keys.job_stream(check_name("queue", queue), job_id)
        start = after or "0-0"
        with self._translate("read_stream"):
            if timeout <= 0:
                reply: Any = await self._conn().xread({key: start}, count=max(1, limit))
            else:
                # Held on one pooled connection while it waits: it must answer before
                # the socket timeout, so a long wait is several reads (the caller's loop).
                block = max(1, min(int(timeout * 1000), int(SOCKET_TIMEOUT * 1000) - 1000))
                reply = await self._conn().xread({key: start}, count=max(1, limit), block=block)
        entries: list[Any] = reply[0][1] if reply else []
        out = []
        for entry_id, fields in entries:
            f = {text(name): value for name, value in fields.items()}
            end = f.get("e")
            data = f.get("d", b"")
            out.append(
                StreamEntry(
                    position=text(entry_id),
                    attempt=as_int(f.get("a")),
                    seq=as_int(f.get("n")),
                    data=data if isinstance(data, bytes) else str(data).encode(),
                    end=STATES.get(text(end)) if end is not None else None,
                )
            )
        return out
