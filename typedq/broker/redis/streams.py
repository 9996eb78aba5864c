"""Job streams on Redis (capability JobStreams, :mod:`typedq.broker.streams`): one Redis
stream per job, ``Q js:<id>`` in the job's queue slot (layout in :mod:`.keys`).

Appends are one script call per job's batch (``stream_append.lua``: the fence, the
trims, every XADD and the TTL in one round trip; several jobs' batches pipelined).
Reads are XREAD BLOCK on connections of their own: a client (a pool of up to
:data:`READER_CONNECTIONS`) made at the first read, apart from the command pool, so
readers waiting on quiet streams never hold the connections jobs need. A waiting read
holds one connection, and returns as soon as an entry comes (no polling).

Readers (``read_stream(..., reader=)``, counted by ``flow_keys``): a sorted set beside
the stream, ``Q jr:<id>`` (``stream_reader.lua``), which a reader joins at its first
read and refreshes only when its entry would end within the read's wait plus
:data:`REFRESH_MARGIN` (about every 5 s of its reads, one script call on the command
pool), and leaves in one call. The emit path never touches it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

from ...names import check_name
from ..streams import READER_TTL, STREAM_MAX, StreamAppend, StreamEntry
from .codec import STATES, as_int, text
from .connection import SOCKET_TIMEOUT, make_client, make_cluster_client
from .core import RedisCore

__all__ = ["READER_CONNECTIONS", "StreamOps"]

#: Seconds of a reader's registration (``stream_reader.lua``) that must be left beyond a
#: read's wait, else the read refreshes it first: with READER_TTL 10 s, a reader refreshes
#: about every 5 s of its reads.
REFRESH_MARGIN = READER_TTL / 2
#: Registrations this broker remembers before it forgets the ones already ended.
_HELD_MAX = 1024

#: Stream reads waiting at once per broker (one connection each; on Redis Cluster per
#: node); reads beyond wait, bounded, for one to come free.
READER_CONNECTIONS = 256


class StreamOps(RedisCore):
    """The job-stream methods of :class:`~.broker.RedisBroker`."""

    url: str
    #: The stream readers' client (made at the first read), or None.
    _stream_readers: Any = None
    #: (job id, reader id) -> until when (monotonic) its registration in the stream's
    #: readers (``Q jr:<id>``) holds for sure; made at the first registration.
    _reader_until: dict[tuple[str, str], float]

    def _readers(self) -> Any:
        """The stream readers' client: its own connections, made at the first read."""
        self._conn()  # NotConnected before connect and after close
        client = self._stream_readers
        if client is None:
            name = f"typedq:{self.settings.namespace}:streams"
            if self.cluster:
                client = make_cluster_client(
                    self.url, client_name=name, max_connections=READER_CONNECTIONS
                )
            else:
                client = make_client(
                    self.url,
                    client_name=name,
                    max_connections=READER_CONNECTIONS,
                    health_check_interval=0,
                )
            self._stream_readers = client
        return client

    async def _close_readers(self) -> None:
        """Close the stream readers' client (the broker closes)."""
        client, self._stream_readers = self._stream_readers, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
                await client.connection_pool.disconnect()

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
        self,
        job_id: str,
        *,
        queue: str,
        after: str,
        timeout: float,
        limit: int = 1000,
        reader: str = "",
    ) -> list[StreamEntry]:
        key = self.keys.job_stream(check_name("queue", queue), job_id)
        start = after or "0-0"
        # It must answer before the socket timeout, so a long wait is several reads (the
        # caller's loop).
        block = (
            0
            if timeout <= 0
            else max(1, min(int(timeout * 1000), int(SOCKET_TIMEOUT * 1000) - 1000))
        )
        if reader:
            await self._join_readers(queue, job_id, reader, block)
        with self._translate("read_stream"):
            readers = self._readers()
            if block == 0:
                reply: Any = await readers.xread({key: start}, count=max(1, limit))
            else:
                reply = await readers.xread({key: start}, count=max(1, limit), block=block)
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

    async def _join_readers(self, queue: str, job_id: str, reader: str, block_ms: int) -> None:
        """Count ``reader`` among the stream's readers for the read about to wait
        ``block_ms``: one ``stream_reader`` call when its entry would end within the
        read plus :data:`REFRESH_MARGIN` (so once every few seconds of a reader's reads,
        never per entry read); else nothing."""
        now = time.monotonic()
        held = self._reader_until.get((job_id, reader))
        need = now + block_ms / 1000 + REFRESH_MARGIN
        if held is not None and held >= need:
            return
        ttl_ms = block_ms + round(READER_TTL * 1000)
        await self._eval(
            "stream_reader",
            [self.keys.job_readers(queue, job_id)],
            [self.keys.prefix, reader, ttl_ms],
        )
        held_map = self._reader_until
        if len(held_map) >= _HELD_MAX:
            for gone in [k for k, t in held_map.items() if t < now]:
                del held_map[gone]
        held_map[(job_id, reader)] = now + ttl_ms / 1000

    async def leave_stream(self, job_id: str, *, queue: str, reader: str) -> None:
        self._reader_until.pop((job_id, reader), None)
        await self._eval(
            "stream_reader",
            [self.keys.job_readers(check_name("queue", queue), job_id)],
            [self.keys.prefix, reader, 0],
        )
