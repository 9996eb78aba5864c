"""A small TCP proxy for network fault tests: loopback only, in its own thread.

It sits between typedq clients (workers, producers) and a real redis-server and
forwards bytes both ways, chunk by chunk, until told to misbehave:

- :meth:`NetProxy.drop_next_reply` swallows the next server->client chunk and cuts
  that connection: the command took effect on Redis, the client never hears so (the
  ambiguous case every re-sent script must survive);
- :meth:`NetProxy.blackhole` accepts and keeps every connection open but forwards
  nothing for N seconds; afterwards the held bytes are delivered in order (a partition
  that heals: TCP delivers what was sent, even by a client that gave up and closed),
  or, with ``deliver=False``, thrown away and the connections cut;
- :meth:`NetProxy.set_latency` delays every chunk (order kept);
- :meth:`NetProxy.hold_after` forwards client->server chunks until one holding a
  marker (a script's name) has gone through, then holds every later one (the client
  stops there, whatever the load on the box: a gate in the data path, not a watcher
  racing the client);
- :meth:`NetProxy.cut_all` resets every open connection now (RST, no FIN handshake).

The proxy listens and connects on 127.0.0.1 only, never anywhere else, and shuts
itself down after ``lifetime`` seconds even if a test forgets to stop it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from tests.redis_harness import free_port

LOOPBACK = "127.0.0.1"
#: Bytes read per chunk from either side.
CHUNK = 65536


@dataclass
class ProxyStats:
    """What the proxy did, for reports."""

    connections: int = 0
    upstream_refused: int = 0
    replies_dropped: int = 0
    connections_cut: int = 0
    blackholes: int = 0
    bytes_up: int = 0
    bytes_down: int = 0


@dataclass(eq=False)
class _Link:
    """One client connection and its upstream connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False
    #: Directions (of two) that ended cleanly.
    ended: int = 0
    #: Open during a dropping blackhole: forwards nothing more, cut when it ends.
    doomed: bool = False


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST: SO_LINGER 0 discards unsent data instead of a FIN handshake."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class NetProxy:
    """A loopback TCP proxy to ``127.0.0.1:upstream_port`` with fault controls.

    Use as a context manager (or :meth:`start` / :meth:`stop`). The controls are safe
    to call from any thread: they only set state that the proxy's loop reads, or hand
    work to that loop.

    :param upstream_port: the redis-server's port on 127.0.0.1
    :param lifetime: seconds after which the proxy stops by itself
    """

    def __init__(self, upstream_port: int, *, lifetime: float = 900.0) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.lifetime = lifetime
        self.stats = ProxyStats()
        self._latency = 0.0
        self._blackhole_until = 0.0
        self._drop_replies = 0
        self._hold_marker: bytes | None = None
        self._holding = False
        self._on_hold: Callable[[], None] | None = None
        self._links: set[_Link] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stopping: asyncio.Event | None = None
        self._error: BaseException | None = None

    def url(self, db: int = 0) -> str:
        """The redis:// URL that goes through the proxy."""
        return f"redis://{LOOPBACK}:{self.port}/{db}"

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the proxy thread and wait until it listens."""
        self._thread = threading.Thread(target=self._run, name="netproxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the proxy did not start listening within 10 s")
        if self._error is not None:
            raise RuntimeError(f"the proxy failed to start: {self._error!r}")

    def stop(self) -> None:
        """Cut every connection, stop listening, and join the thread."""
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(stopping.set)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> NetProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- controls -------------------------------------------------------------------------

    def drop_next_reply(self, count: int = 1) -> None:
        """Swallow the next ``count`` server->client chunks, cutting each one's connection.

        Calls do not add up while no reply flows: at most ``count`` drops are pending, so
        a periodic call drops replies at its pace, never a burst after a quiet spell.
        """
        self._drop_replies = max(self._drop_replies, count)

    def blackhole(self, seconds: float, *, deliver: bool = True) -> None:
        """Forward nothing on any connection (old or new) for ``seconds``.

        :param deliver: afterwards deliver the held bytes in order (True), or drop them
            and cut every connection that was open during the blackhole (False)
        """
        self.stats.blackholes += 1
        self._blackhole_until = max(self._blackhole_until, time.monotonic() + seconds)
        if not deliver:
            self._call(self._cut_after, seconds)

    def hold_after(self, marker: bytes, on_hold: Callable[[], None] | None = None) -> None:
        """Forward client->server chunks until one containing ``marker`` has been
        delivered, then hold every later one (for good: the proxy's stop cuts them).
        ``on_hold`` is called, in the proxy's thread, when the first one is held: at once,
        where a test's own task could come too late on a loaded box (the client's read
        timeout runs from its send)."""
        self._hold_marker, self._holding, self._on_hold = marker, False, on_hold

    def set_latency(self, seconds: float) -> None:
        """Delay every chunk, in both directions, by ``seconds`` (0 to turn it off)."""
        self._latency = max(0.0, seconds)

    def cut_all(self) -> None:
        """Reset every open connection now (clients see a connection error)."""
        self._call(self._cut_links)

    @property
    def open_connections(self) -> int:
        """Client connections open right now."""
        return len(self._links)

    # -- the loop -------------------------------------------------------------------------

    def _call(self, fn: Callable[..., object], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn, *args)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start() or ignored at the end
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, LOOPBACK, self.port, reuse_address=True)
        self._ready.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.lifetime)
        finally:
            server.close()
            self._cut_links(count=False)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 2)
            # A connection accepted as the proxy stopped (its upstream connect still in
            # flight at the first cut) is cut too, not left open when the loop closes.
            self._cut_links(count=False)

    def _cut_links(self, *, count: bool = True) -> None:
        for link in list(self._links):
            self._close(link, reset=True)
            if count:
                self.stats.connections_cut += 1

    def _cut_after(self, seconds: float) -> None:
        links = set(self._links)
        assert self._loop is not None
        # Marked now, not at the cut: on a loaded machine the cut may run a little after the
        # blackhole ends, and the bytes held meanwhile must not get through in that gap.
        for link in links:
            link.doomed = True

        def cut() -> None:
            for link in links:
                if not link.closed:
                    self._close(link, reset=True)
                    self.stats.connections_cut += 1

        self._loop.call_later(seconds, cut)

    def _close(self, link: _Link, *, reset: bool) -> None:
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        for writer in (link.client, link.server):
            if reset:
                _reset(writer)
            else:
                writer.close()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            # Redis is down (a restart): the client sees its connection refused-ish.
            self.stats.upstream_refused += 1
            _reset(writer)
            return
        except BaseException:  # cancelled as the proxy's loop ends
            _reset(writer)
            raise
        link = _Link(client=writer, server=up_writer)
        self._links.add(link)
        if self._stopping is not None and self._stopping.is_set():
            self._close(link, reset=True)  # accepted as the proxy stopped
            return
        link.tasks = [
            asyncio.create_task(self._pipe(link, reader, up_writer, upstream=True)),
            asyncio.create_task(self._pipe(link, up_reader, writer, upstream=False)),
        ]

    async def _pipe(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        """Read chunks on one side and queue them for the other side, stamped with a due time."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.create_task(self._deliver(link, queue, writer, upstream=upstream))
        link.tasks.append(sender)
        last_due = 0.0
        try:
            while True:
                data = await reader.read(CHUNK)
                # Never earlier than the chunk before it: latency keeps the order.
                last_due = max(last_due, time.monotonic() + self._latency)
                queue.put_nowait((last_due, data))
                if not data:
                    break
                if upstream:
                    self.stats.bytes_up += len(data)
                else:
                    self.stats.bytes_down += len(data)
            await sender
        except OSError:
            self._close(link, reset=False)
            return
        link.ended += 1
        if link.ended == 2:  # both directions passed their end of stream on
            self._close(link, reset=False)

    async def _deliver(
        self,
        link: _Link,
        queue: asyncio.Queue[tuple[float, bytes]],
        writer: asyncio.StreamWriter,
        *,
        upstream: bool,
    ) -> None:
        """Write queued chunks when due: after any blackhole, after their latency."""
        try:
            while True:
                due, data = await queue.get()
                # Re-checked in a loop: a blackhole may start or grow while we wait.
                while (wait := max(due, self._blackhole_until) - time.monotonic()) > 0:  # noqa: ASYNC110
                    await asyncio.sleep(wait)
                if upstream and data and self._holding and self._on_hold is not None:
                    on_hold, self._on_hold = self._on_hold, None
                    on_hold()
                while upstream and data and self._holding:  # noqa: ASYNC110
                    await asyncio.sleep(0.01)
                if link.doomed:
                    continue  # held in a dropping blackhole: dropped, the link is cut
                if not data:  # end of stream: pass the FIN on
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                if not upstream and self._drop_replies > 0:
                    self._drop_replies -= 1
                    self.stats.replies_dropped += 1
                    self._close(link, reset=True)
                    return
                writer.write(data)
                await writer.drain()
                marker = self._hold_marker
                if upstream and marker is not None and marker in data:
                    self._holding = True
        except OSError:
            self._close(link, reset=False)


@contextlib.contextmanager
def net_proxy(upstream_port: int, *, lifetime: float = 900.0) -> Iterator[NetProxy]:
    """A started :class:`NetProxy` to ``127.0.0.1:upstream_port``, stopped afterwards."""
    proxy = NetProxy(upstream_port, lifetime=lifetime)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


__all__ = ["NetProxy", "ProxyStats", "net_proxy"]
