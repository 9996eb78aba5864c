"""Connections to Redis: client settings, and the fixes they need.

Client settings (under test in tests/process/test_redis_faults.py): socket timeout 5 s, connect
timeout 2 s, TCP keepalive, health checks every 10 s, and at most :data:`RETRIES`
automatic retries on connection errors and timeouts with jittered exponential backoff
(50 ms to 1 s). Automatic retries are safe because every script is idempotent when re-sent
(see :mod:`typedq.broker.redis`).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import socket
from typing import Any
from urllib.parse import quote, unquote

import anyio
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import MaxConnectionsError
from redis.exceptions import TimeoutError as RedisTimeoutError

_hiredis_pack: Any
try:
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # redis-py works without it; its own packer is used then
    _hiredis_pack = None

__all__ = [
    "CLUSTER_SCHEMES",
    "CLUSTER_SPARE_CONNECTIONS",
    "CONNECT_TIMEOUT",
    "HEALTH_CHECK_INTERVAL",
    "MAX_CONNECTIONS",
    "RETRIES",
    "SOCKET_TIMEOUT",
    "Lane",
    "PoolExhausted",
    "answers_plain_text",
    "cluster_nodes",
    "cluster_node_url",
    "make_client",
    "make_cluster_client",
]

#: Seconds a command may wait for its reply before it counts as failed.
SOCKET_TIMEOUT = 5.0
#: Seconds to open a connection.
CONNECT_TIMEOUT = 2.0
#: Idle seconds after which a pooled connection is PINGed before use.
HEALTH_CHECK_INTERVAL = 10
#: Automatic retries of a command on ConnectionError/TimeoutError (scripts are idempotent).
RETRIES = 3
#: Connections in the command pool; callers beyond it wait (bounded) for one. On Redis
#: Cluster: the client's calls in flight (each holds at most one connection per node).
MAX_CONNECTIONS = 64
#: Connections per node of a cluster client beyond its calls in flight: for the calls
#: redis-py makes inside one (a pipeline's command re-sent alone after a redirection).
CLUSTER_SPARE_CONNECTIONS = 8


class PoolExhausted(MaxConnectionsError):
    """No connection came free within the bounded wait (:data:`SOCKET_TIMEOUT`): every
    one stayed busy with a call that Redis had not answered yet."""


def make_client(
    url: str,
    *,
    client_name: str,
    max_connections: int,
    health_check_interval: int,
    retries: int = RETRIES,
) -> aioredis.Redis:
    """A client for ``url`` with typedq's settings (raises ValueError for a bad URL).

    redis-py options in the URL's query override the defaults; a ``rediss://`` URL
    verifies the server's name unless the URL says otherwise.

    :param retries: automatic retries on connection errors (0 for a sharded pub/sub
        connection: a lost one is re-placed by the listener, which knows the slot map)
    """
    keepalive: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            keepalive[option] = value
    tls: dict[str, Any] = {}
    if url.startswith("rediss://") and "ssl_check_hostname" not in url:
        # Fail closed: verify the server's name, whatever the redis-py version's default.
        tls = {"ssl_check_hostname": True, "ssl_cert_reqs": "required"}
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        **tls,
        max_connections=max_connections,
        timeout=SOCKET_TIMEOUT,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_keepalive=True,
        socket_keepalive_options=keepalive,
        health_check_interval=health_check_interval,
        retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), retries),
        client_name=client_name,
    )
    return aioredis.Redis(connection_pool=_with_lost_send_fix(pool))


async def answers_plain_text(host: str, port: int) -> bool:
    """True when ``host:port`` answers a plain-text ``PING`` like Redis does.

    Tells a ``rediss://`` URL pointing at a Redis without TLS (the usual mistake: it stays
    silent during the TLS handshake, which redis-py reports as a timeout) from other
    handshake failures.
    """
    try:
        with anyio.fail_after(CONNECT_TIMEOUT):
            async with await anyio.connect_tcp(host, port) as stream:
                await stream.send(b"PING\r\n")
                reply = await stream.receive(64)
    except (OSError, TimeoutError, anyio.EndOfStream, anyio.BrokenResourceError):
        return False
    return reply[:1] in (b"+", b"-")


class _LostSendIsConnectionError:
    """Mixed into redis-py's connection class: a send on a connection that was just lost fails
    with ConnectionResetError, which redis-py turns into the ConnectionError it retries.

    On Python 3.12 to 3.13.5, ``writelines`` on a selector transport whose connection is lost
    raises AttributeError (``_loop`` is already None; python/cpython#136234), where ``write``
    would drop the data and let ``drain`` report the loss. redis-py sends with ``writelines``,
    so a connection cut by the network escaped its retries and our error handling as a bare
    AttributeError. The method only writes to the socket: an AttributeError there means the
    transport was torn down.
    """

    async def _send_packed_command(self, command: Any) -> None:
        try:
            await super()._send_packed_command(command)  # type: ignore[misc]
        except AttributeError as exc:
            raise ConnectionResetError(f"connection lost while sending ({exc})") from exc

    def _write(self, command: Any) -> Any:
        """Hand ``command`` to the transport (redis-py's write step, with the fix above);
        returns the stream writer, for its ``drain``."""
        writer = self._writer  # type: ignore[attr-defined]
        try:
            writer.writelines(command)
        except AttributeError as exc:
            raise ConnectionResetError(f"connection lost while sending ({exc})") from exc
        return writer

    # redis-py's asyncio connections pack commands in pure Python, re-joining a growing
    # buffer per argument: an enqueue of 100 jobs (600 arguments) spent more time there
    # than in everything else typedq does for it. hiredis packs in C (as redis-py's sync
    # client does); anything it does not take (bytearray, bool, None, a non-UTF-8
    # encoder) goes to redis-py's own packer, which packs it or raises DataError.
    def pack_command(self, *args: Any) -> list[bytes]:
        encoder = self.encoder  # type: ignore[attr-defined]
        if (
            _hiredis_pack is not None
            and encoder.encoding == "utf-8"
            and encoder.encoding_errors == "strict"
            and isinstance(args[0], str)
            and " " not in args[0]
        ):
            try:
                return [_hiredis_pack(args)]
            except TypeError:
                pass
        return super().pack_command(*args)  # type: ignore[misc, no-any-return]

    def pack_commands(self, commands: Any) -> list[bytes]:
        # One buffer per command: the transport joins them into one write.
        return [b"".join(self.pack_command(*command)) for command in commands]

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        """redis-py's send with its write timeout as ``asyncio.timeout`` instead of
        ``asyncio.wait_for``: on Python 3.11 wait_for runs every write in a task of its
        own (measured 9.3 us against 3.5 us per call, and event-loop turns before the
        command leaves); from 3.12 on wait_for is built on asyncio.timeout, and arms its
        timer on every write. Same steps and errors as redis-py 8's.

        The timeout is armed only when the write can wait: when the stream's protocol is
        paused (its transport's buffer, or TLS's beneath it, above the high-water mark).
        Otherwise ``drain`` cannot wait for the peer (it only reports a lost connection):
        no timer per command, where a worker at concurrency 1 sends one per job. (The
        pause flag is asyncio's own, ``FlowControlMixin._paused``, what ``drain`` tests;
        taken as paused should it be missing.)"""
        conn: Any = self
        timeout = conn.socket_timeout
        if not timeout:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
            return
        if not conn.is_connected:
            await conn.connect_check_health(check_health=False)
        if check_health:
            await conn.check_health()
        try:
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            writer = self._write(command)
            if getattr(writer._protocol, "_paused", True):
                async with asyncio.timeout(timeout):
                    await writer.drain()
            else:
                await writer.drain()
        except TimeoutError:
            await conn.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as exc:
            await conn.disconnect(nowait=True)
            if len(exc.args) == 1:
                err_no, errmsg = "UNKNOWN", exc.args[0]
            else:
                err_no, errmsg = exc.args[0], exc.args[1]
            raise RedisConnectionError(
                f"Error {err_no} while writing to socket. {errmsg}."
            ) from exc
        except BaseException:
            await conn.disconnect(nowait=True)
            raise


def _with_lost_send_fix(pool: aioredis.ConnectionPool) -> aioredis.ConnectionPool:
    """``pool``, making its connections with :class:`_LostSendIsConnectionError` mixed in
    (whatever class the URL chose: TCP, TLS or Unix socket)."""
    base = pool.connection_class
    pool.connection_class = type(base.__name__, (_LostSendIsConnectionError, base), {})
    return pool


class _ReadWatch:
    """The read timeout of a lane's calls: one timer shared by all of them instead of one
    armed and cancelled per call (redis-py's ``read_response``), which at one call per
    job cost as much as an event-loop turn, and filled the loop's timer heap with
    cancelled timers for ``SOCKET_TIMEOUT`` seconds each.

    The timer is armed for the deadline of the read in flight when there is none; when
    it fires, a later read (a later deadline) re-arms it for that one, no read leaves it
    unarmed, and a read past its deadline is cancelled (as ``asyncio.timeout`` does: its
    task's cancel request, taken back by :meth:`Lane._read`, which raises the timeout)."""

    __slots__ = ("_deadline", "_loop", "_task", "_timer", "expired")

    def __init__(self) -> None:
        self._deadline: float | None = None
        self._task: asyncio.Task[Any] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The task whose read this watch cancelled (until that read took it back).
        self.expired: asyncio.Task[Any] | None = None

    def start(
        self, task: asyncio.Task[Any], loop: asyncio.AbstractEventLoop, timeout: float
    ) -> None:
        """A read of ``task`` starts: it may take ``timeout`` seconds."""
        self._deadline = deadline = loop.time() + timeout
        self._task = task
        timer = self._timer
        if timer is None or self._loop is not loop or deadline < timer.when():
            # (Earlier than the timer: a read after one of a longer, relaxed, timeout.)
            if timer is not None:
                timer.cancel()
            self._loop = loop
            self._timer = loop.call_at(deadline, self._check)

    def reschedule(self, when: float | None) -> None:
        """Move the deadline of the read in flight to loop time ``when`` (None: none);
        redis-py calls it (as it would on ``asyncio.timeout``) to relax the timeout of
        an active read while the server announces maintenance."""
        if self._task is None or self._loop is None:
            return
        self._deadline = when
        if when is not None and (self._timer is None or when < self._timer.when()):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(when, self._check)

    def stop(self) -> None:
        """The read ended (its timer stays armed for the next one, or runs out)."""
        self._deadline = self._task = None

    def close(self) -> None:
        """Disarm the timer (the lane is closed)."""
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
        self.stop()

    def _check(self) -> None:
        self._timer = None
        deadline, task, loop = self._deadline, self._task, self._loop
        if deadline is None or task is None or loop is None:
            return  # no read in flight: armed again by the next one
        if loop.time() < deadline:
            self._timer = loop.call_at(deadline, self._check)  # a later read's deadline
            return
        self.stop()
        self.expired = task
        task.cancel()


class Lane:
    """One connection of a client's pool, kept out of it for one caller at a time: the
    worker's hot script calls (claim, settle and claim) without the pool's checkout and
    release, redis-py's observability hooks and its per-command plumbing around them.

    The command still goes through the connection's own methods, so its semantics are the
    pooled path's: the pool's class and settings (TLS, AUTH/ACL user, database, client
    name, socket and connect timeouts, the fixes of :class:`_LostSendIsConnectionError`),
    a reconnect on first use after a loss, the health check of an idle connection, the
    same :class:`~redis.asyncio.retry.Retry` (the connection's own: on a connection error
    or timeout it disconnects, backs off and sends again, which is safe because every
    script is idempotent when re-sent), a disconnect when the caller is cancelled between
    send and reply (no reply is left on the wire for the next call), and error replies
    raised as redis-py's ``ResponseError`` subclasses. Only FCALL-like commands go here:
    the reply is returned undecoded, as no response callback applies to them.

    A caller finding :attr:`busy` takes the pooled path instead: the lane never waits.

    The reply's read timeout (the connection's socket timeout) is kept by one timer
    shared by the lane's calls (:class:`_ReadWatch`); a read past it fails as redis-py's
    does: the connection dropped, then redis-py's ``TimeoutError`` (which the retry
    re-sends). redis-py relaxing an active read's timeout (server maintenance
    notifications) moves the watch's deadline, as it would move its own timer's.
    """

    __slots__ = ("_conn", "_pool", "_watch", "busy")

    def __init__(self, pool: aioredis.ConnectionPool) -> None:
        self._pool: Any = pool  # get_connection is untyped in redis-py
        self._conn: Any = None
        self._watch = _ReadWatch()
        #: True while a call is on the lane (then callers use the pool).
        self.busy = False

    async def execute(self, *args: Any) -> Any:
        """Send one command on the lane's connection and return its reply (as
        ``Redis.execute_command`` would for a command without a response callback)."""
        self.busy = True
        try:
            conn = self._conn
            if conn is None:
                # Checked out once, for good: it counts against the pool's size, and the
                # pool's disconnect (at close) closes it with the others.
                conn = self._conn = await self._pool.get_connection()
            packed = conn.pack_command(*args)

            async def once() -> Any:
                await conn.send_packed_command(packed)
                return await self._read(conn)

            async def failed(error: Exception, failures: int) -> None:
                await conn.disconnect(error=error, failure_count=failures)

            return await conn.retry.call_with_retry(once, failed, with_failure_count=True)
        finally:
            self.busy = False

    async def _read(self, conn: Any) -> Any:
        """``conn.read_response()``, its timeout kept by the lane's shared timer."""
        timeout = conn.socket_timeout
        if not timeout:
            return await conn.read_response()
        task = asyncio.current_task()
        assert task is not None
        cancelling = task.cancelling()
        watch = self._watch
        watch.start(task, asyncio.get_running_loop(), timeout)
        # Where redis-py looks for the active read's timeout to relax it (see reschedule).
        conn._active_read_timeout = watch
        try:
            # math.inf: no timer of redis-py's own (the watch keeps the deadline).
            return await conn.read_response(timeout=math.inf)
        except asyncio.CancelledError:
            if watch.expired is task:
                watch.expired = None
                # Only the watch's cancel (asyncio.timeout's rule): the read timed out.
                # read_response has dropped the connection (no reply left on the wire).
                if task.uncancel() <= cancelling:
                    raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None
            raise
        finally:
            conn._active_read_timeout = None
            watch.stop()
            if watch.expired is task:  # cancelled, but the read ended another way
                watch.expired = None
                task.uncancel()

    async def close(self) -> None:
        """Give the connection back to the pool (it is reused, or closed with it). One a
        call still uses stays checked out: the pool's disconnect closes it, and nobody
        else gets it meanwhile (its read keeps its deadline)."""
        conn, self._conn = self._conn, None
        if not self.busy:
            self._watch.close()
        if conn is not None and not self.busy:
            await self._pool.release(conn)


#: URL schemes of Redis Cluster (``rediss+cluster`` speaks TLS).
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """The nodes, user, password and TLS flag of ``redis+cluster://[user:pw@]h:p[,h:p...]``
    (raises ValueError naming what is wrong)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in CLUSTER_SCHEMES:
        raise ValueError("a cluster URL starts with redis+cluster:// or rediss+cluster://")
    rest = rest.split("?", 1)[0]
    netloc, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError("Redis Cluster has only database 0")
    user: str | None = None
    password: str | None = None
    if "@" in netloc:
        creds, netloc = netloc.rsplit("@", 1)
        name, has_pw, pw = creds.partition(":")
        user, password = unquote(name) or None, unquote(pw) if has_pw else None
    nodes: list[tuple[str, int]] = []
    for part in netloc.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"{part!r} is not host:port")
        nodes.append((host.strip("[]"), int(port)))
    return nodes, user, password, scheme == "rediss+cluster"


#: True inside a call of a cluster client that holds one of its permits: the calls
#: redis-py makes within it (a pipeline's fallback) take none.
_in_call: contextvars.ContextVar[bool] = contextvars.ContextVar("typedq_in_call", default=False)


class _Cluster(RedisCluster):
    """redis-py's cluster client, with its calls in flight bounded, and routing FCALL by
    its keys as it does EVALSHA (left to itself it asks a node for the keys of every
    FCALL: ``COMMAND GETKEYS``, FCALL has "movable keys", one more round trip per script
    call with all its arguments).

    The bound: redis-py's pool of a cluster node does not wait for a free connection, it
    raises ``MaxConnectionsError`` (with no message) as soon as ``max_connections`` are in
    use. 500 concurrent ``job.result()`` (a read each) on one queue, so one node, failed
    436 times so. Here a call (a command, or a pipeline's round trip) takes one of
    ``calls`` permits first, and a call uses at most one connection per node: with the
    node pools ``calls + CLUSTER_SPARE_CONNECTIONS`` large, a call always finds one. A
    caller finding no permit waits for one (first come, first served) up to ``wait``
    seconds, then fails with :class:`PoolExhausted`, as the standalone client's blocking
    pool does.
    """

    def __init__(self, *args: Any, calls: int, wait: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = calls
        self._wait = wait
        self._permits = asyncio.Semaphore(calls)

    async def _acquire(self) -> None:
        """Take a permit (waiting at most ``wait`` seconds; raises PoolExhausted)."""
        permits = self._permits
        if not permits.locked():
            await permits.acquire()  # free: returns at once, no timer armed
            return
        try:
            async with asyncio.timeout(self._wait):
                await permits.acquire()
        except TimeoutError:
            raise PoolExhausted(
                f"none came free within {self._wait:g} s; {self.calls} calls in flight"
            ) from None

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if _in_call.get():
            return await super().execute_command(*args, **kwargs)
        await self._acquire()
        token = _in_call.set(True)
        try:
            return await super().execute_command(*args, **kwargs)
        finally:
            _in_call.reset(token)
            self._permits.release()

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            return super().pipeline(transaction, shard_hint)  # raises: not on a cluster
        # (mypy takes an attribute its command mixins declare for abstract; redis-py
        # builds its ClusterPipeline the same way)
        return _Pipeline(self, transaction)  # type: ignore[abstract]

    async def _determine_slot(self, command: str, *args: Any) -> int:
        if command.upper() in ("FCALL", "FCALL_RO") and len(args) >= 2:
            keys = args[2 : 2 + int(args[1])]
            slots = {self.keyslot(key) for key in keys}
            if len(slots) == 1:
                return slots.pop()
        return await super()._determine_slot(command, *args)


class _Pipeline(ClusterPipeline):
    """A pipeline of :class:`_Cluster`: its round trip holds one of the client's permits."""

    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> Any:
        client: _Cluster = self.cluster_client  # type: ignore[assignment]
        if _in_call.get():
            return await super().execute(raise_on_error, allow_redirections)
        await client._acquire()
        token = _in_call.set(True)
        try:
            return await super().execute(raise_on_error, allow_redirections)
        finally:
            _in_call.reset(token)
            client._permits.release()


def make_cluster_client(
    url: str, *, client_name: str, max_connections: int, wait: float = SOCKET_TIMEOUT
) -> Any:
    """A Redis Cluster client for ``url`` with typedq's timeouts and retries (MOVED/ASK
    and a primary's failover are followed by redis-py: it re-reads the slot map).

    :param max_connections: its calls in flight at most (callers beyond wait, bounded,
        for one to end); each node's pool holds
        ``max_connections + CLUSTER_SPARE_CONNECTIONS`` connections
    :param wait: seconds a call waits for one of them before it fails with
        :class:`PoolExhausted`
    """
    nodes, user, password, tls = cluster_nodes(url)
    keepalive: dict[int, int] = {}
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            keepalive[option] = value
    return _Cluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        calls=max_connections,
        wait=wait,
        username=user,
        password=password,
        ssl=tls,
        max_connections=max_connections + CLUSTER_SPARE_CONNECTIONS,
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_keepalive=True,
        socket_keepalive_options=keepalive,
        retry=Retry(ExponentialWithJitterBackoff(cap=1.0, base=0.05), RETRIES),
        client_name=client_name,
    )


def cluster_node_url(url: str, host: str, port: int) -> str:
    """A plain ``redis://`` (``rediss://``) URL of one node of a cluster URL, with its
    credentials: the sharded pub/sub connection to the node that owns some queue's slot
    (see :mod:`typedq.broker.redis.listener`)."""
    _, user, password, tls = cluster_nodes(url)
    creds = ""
    if user or password:
        creds = f"{quote(user or '', safe='')}:{quote(password or '', safe='')}@"
    if ":" in host:
        host = f"[{host}]"
    return f"{'rediss' if tls else 'redis'}://{creds}{host}:{port}/0"
