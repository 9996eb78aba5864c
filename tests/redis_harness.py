"""Spawning real redis-server processes for the tests (never a mock, never :6379)."""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")


# Servers started by the tests listen below the kernel's ephemeral range (32768 and up on
# Linux): a port handed out by bind(0) is one an outgoing client connection may take a moment
# later, which made a redis-server fail with "Address already in use" under load.
_SERVER_PORTS = (20000, 32000)
_CLUSTER_PORTS = (10000, 22000)  # the cluster bus port (+10000) stays below 32768 too


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(span: tuple[int, int] = _SERVER_PORTS) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the ephemeral range."""
    for _ in range(1000):
        port = random.randrange(*span)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {span[0]}..{span[1]}")


def _bind_failed(log: Path) -> bool:
    with contextlib.suppress(OSError):
        return "Address already in use" in log.read_text()
    return False


class _PortTaken(Exception):
    """redis-server could not listen: the port was taken after it was chosen."""


class RedisProcess:
    """One redis-server child process on a free port in its own directory.

    ``kill()`` / ``start()`` restart it on the same port and directory, for fault tests.
    """

    def __init__(self, *, appendonly: bool = False, extra: tuple[str, ...] = ()) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError("redis-server is not installed: `apt-get install redis-server`")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="typedq-redis-"))
        self.appendonly = appendonly
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.choose_port: Callable[[], int] = free_port
        self._started = False

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start (or restart, on the same port) and wait for PING. Before the first successful
        start, a port another process took in the meantime is replaced by a new one."""
        for _ in range(10):
            try:
                self._start_once()
            except _PortTaken:
                if self._started:
                    raise RuntimeError(
                        f"port {self.port} was taken while redis-server was down"
                    ) from None
                self.port = self.choose_port()
                continue
            self._started = True
            return
        raise RuntimeError("redis-server found no free port in 10 tries")

    def _start_once(self) -> None:
        assert REDIS_SERVER is not None
        (self.dir / "redis.log").unlink(missing_ok=True)
        args = [
            REDIS_SERVER,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "everysec",
            "--dir",
            str(self.dir),
            "--enable-debug-command",
            "local",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.dir / "redis.log"),
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if _bind_failed(self.dir / "redis.log"):
                    self.proc = None
                    raise _PortTaken
                raise RuntimeError(f"redis-server exited: {(self.dir / 'redis.log').read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock,
            ):
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer PING within 10 s")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)
        self.proc = None

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def redis_process(**kwargs: bool | tuple[str, ...]) -> Iterator[RedisProcess]:
    """A started RedisProcess, stopped and cleaned up afterwards."""
    server = RedisProcess(**kwargs)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        server.stop()


def flushall(port: int) -> None:
    """FLUSHALL over a raw socket (keeps the harness free of the client under test)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"FLUSHALL\r\n")
        reply = sock.recv(64)
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"FLUSHALL failed: {reply!r}")


__all__ = ["REDIS_SERVER", "RedisProcess", "flushall", "free_port", "redis_process"]


REDIS_CLI = shutil.which("redis-cli")


def _command(port: int, *words: str, timeout: float = 5.0) -> bytes:
    """One command over a raw socket; its raw reply (the harness does not use the client
    under test)."""
    payload = f"*{len(words)}\r\n".encode()
    for w in words:
        payload += f"${len(w.encode())}\r\n{w}\r\n".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(payload)
        data = b""
        while True:
            chunk = sock.recv(65536)
            data += chunk
            if not chunk or data.endswith(b"\r\n"):
                # A bulk reply may arrive in pieces: read until its announced length.
                if data.startswith(b"$"):
                    head, _, body = data.partition(b"\r\n")
                    if len(body) < int(head[1:]) + 2:
                        continue
                return data


def cluster_port() -> int:
    """A free port for a cluster node with its bus port (+10000) free too."""
    for _ in range(1000):
        port = free_port(_CLUSTER_PORTS)
        if _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


class RedisCluster:
    """A local Redis Cluster: ``primaries`` primaries with ``replicas`` replicas each, every node a
    :class:`RedisProcess` with ``--cluster-enabled yes``, joined by
    ``redis-cli --cluster create``; ready once every node reports ``cluster_state:ok``."""

    def __init__(
        self, primaries: int = 3, replicas: int = 1, *, node_timeout_ms: int = 2000
    ) -> None:
        self.primaries = primaries
        self.replicas = replicas
        #: ``cluster-node-timeout``: how long a silent primary takes to be failed over.
        self.node_timeout_ms = node_timeout_ms
        self.nodes = self._new_nodes()

    def _new_nodes(self) -> list[RedisProcess]:
        nodes = [
            RedisProcess(
                extra=(
                    *(
                        "--cluster-enabled",
                        "yes",
                        "--cluster-node-timeout",
                        str(self.node_timeout_ms),
                    ),
                    *("--repl-diskless-sync-delay", "0"),
                )
            )
            for _ in range(self.primaries * (1 + self.replicas))
        ]
        for node in nodes:
            node.port = cluster_port()
            node.choose_port = cluster_port
            node.extra += ("--cluster-config-file", str(node.dir / "nodes.conf"))
        return nodes

    @property
    def url(self) -> str:
        """``redis+cluster://`` naming the first primaries (the client discovers the rest)."""
        hosts = ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[: self.primaries])
        return f"redis+cluster://{hosts}"

    def start(self) -> None:
        """Start the nodes, join them, wait for ``cluster_state:ok``. A cluster that does not
        get there (seen once on a loaded machine: one node never learnt of the others) is
        stopped and made again on fresh ports, once."""
        if REDIS_CLI is None:
            raise RuntimeError("redis-cli is not installed: `apt-get install redis-tools`")
        try:
            self._start_once()
        except RuntimeError as exc:
            self.stop()
            print(f"local Redis Cluster: {exc}; making it again", file=sys.stderr)
            self.nodes = self._new_nodes()
            self._start_once()

    def _start_once(self) -> None:
        assert REDIS_CLI is not None
        for node in self.nodes:
            node.start()
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                str(self.replicas),
                "--cluster-yes",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        self.wait_ok()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every live node reports ``cluster_state:ok`` and knows every node."""
        deadline = time.monotonic() + timeout
        answered: list[RedisProcess] = []
        states: list[bool] = []
        while time.monotonic() < deadline:
            states = []
            live = [node for node in self.nodes if node.proc is not None]
            answered = []
            for node in live:
                with contextlib.suppress(OSError):  # a node not answering is not counted
                    info = _command(node.port, "CLUSTER", "INFO")
                    answered.append(node)
                    states.append(
                        b"cluster_state:ok" in info
                        and f"cluster_known_nodes:{len(self.nodes)}".encode() in info
                    )
            if states and all(states) and self._replicas_connected():
                return
            time.sleep(0.1)
        not_ok = [n.port for n, ok in zip(answered, states, strict=True) if not ok]
        raise RuntimeError(
            f"the local Redis Cluster did not reach cluster_state:ok in {timeout:.0f} s "
            f"(nodes not ok or not knowing all {len(self.nodes)}: {not_ok or 'none'}; "
            f"replicas in sync: {self._replicas_connected()})"
        )

    def _replicas_connected(self) -> bool:
        """Every replica the cluster should have is attached to its primary and in sync."""
        replicas = 0
        for node in self.nodes:
            if node.proc is None:
                continue
            with contextlib.suppress(OSError):
                role = _command(node.port, "ROLE")
                if role.startswith(b"*5\r\n$5\r\nslave"):
                    if b"connected" not in role:
                        return False
                    replicas += 1
        live = sum(1 for n in self.nodes if n.proc is not None)
        return replicas == live - self.primaries

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now."""
        ports = []
        for node in self.nodes:
            if node.proc is not None:
                with contextlib.suppress(OSError):
                    if _command(node.port, "ROLE").startswith(b"*3\r\n$6\r\nmaster"):
                        ports.append(node.port)
        return ports

    def flushall(self) -> None:
        """FLUSHALL on every primary (replicas follow)."""
        for port in self.primary_ports():
            reply = _command(port, "FLUSHALL")
            if not reply.startswith(b"+OK"):
                raise RuntimeError(f"FLUSHALL on {port} failed: {reply!r}")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


def _bulk(reply: bytes) -> str:
    """The text of a bulk-string reply."""
    head, _, body = reply.partition(b"\r\n")
    return body[: int(head[1:])].decode()


def _slot_nodes(
    cluster: RedisCluster, slot: int, *, asking: int | None = None
) -> tuple[str, int, list[int]]:
    """The id and port of the primary serving ``slot`` (as the node on port ``asking``, by
    default the first live one, sees the cluster) and the ports of its replicas."""
    if asking is None:
        asking = next(n.port for n in cluster.nodes if n.proc is not None)
    nodes = _bulk(_command(asking, "CLUSTER", "NODES")).splitlines()
    by_id: dict[str, tuple[int, list[str]]] = {}
    for line in nodes:
        fields = line.split()
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        by_id[fields[0]] = (port, fields)
    primary = None
    for node_id, (port, fields) in by_id.items():
        if "master" in fields[2]:
            for spec in fields[8:]:
                lo, _, hi = spec.partition("-")
                if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                    primary = (node_id, port)
    assert primary is not None, f"no primary serves slot {slot}"
    replicas = [p for p, f in by_id.values() if f[3] == primary[0]]
    return primary[0], primary[1], replicas


def slot_owner(cluster: RedisCluster, slot: int) -> int:
    """The port of the primary serving ``slot``."""
    return _slot_nodes(cluster, slot)[1]


def shard_subscribers(port: int, channel: str) -> int:
    """``PUBSUB SHARDNUMSUB``: the clients of the node on ``port`` subscribed to the
    sharded channel ``channel``."""
    return int(_command(port, "PUBSUB", "SHARDNUMSUB", channel).rsplit(b":", 1)[1])


def subscribers(port: int, channel: str) -> int:
    """``PUBSUB NUMSUB``: the clients of the node on ``port`` subscribed to the (not
    sharded) channel ``channel``."""
    return int(_command(port, "PUBSUB", "NUMSUB", channel).rsplit(b":", 1)[1])


def kill_pubsub_clients(port: int) -> None:
    """``CLIENT KILL TYPE pubsub`` on the node on ``port``: it drops every subscriber."""
    reply = _command(port, "CLIENT", "KILL", "TYPE", "pubsub")
    if not reply.startswith(b":"):
        raise RuntimeError(f"CLIENT KILL on {port} failed: {reply!r}")


def function_flush(port: int) -> None:
    """``FUNCTION FLUSH`` on the node on ``port``: it forgets every function library (a
    primary's replicas too, by replication)."""
    reply = _command(port, "FUNCTION", "FLUSH")
    if not reply.startswith(b"+OK"):
        raise RuntimeError(f"FUNCTION FLUSH on {port} failed: {reply!r}")


def replica_of(cluster: RedisCluster, primary: int) -> int:
    """The port of a replica attached to the primary on ``primary`` (by the replicas' own
    ``ROLE``, which does not lag like the cluster's gossip)."""
    needle = f"\r\n:{primary}\r\n".encode()
    for node in cluster.nodes:
        if node.proc is not None:
            with contextlib.suppress(OSError):
                role = _command(node.port, "ROLE")
                if role.startswith(b"*5\r\n$5\r\nslave") and needle in role:
                    return node.port
    raise RuntimeError(f"no replica of the primary on {primary}")


def failover_slot(cluster: RedisCluster, slot: int, timeout: float = 60.0) -> tuple[int, int]:
    """``CLUSTER FAILOVER`` (a manual, graceful failover) of the primary serving ``slot``
    to its replica; returns (old primary port, new primary port) once the replica serves
    the slot and every node reports ``cluster_state:ok``.

    A manual failover that does not complete within Redis's own limit (5 s; it happens on
    a cluster formed moments ago: "Manual failover timed out") is asked for again.
    """
    _, old, _ = _slot_nodes(cluster, slot)
    replica = replica_of(cluster, old)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = _command(replica, "CLUSTER", "FAILOVER")
        if not reply.startswith(b"+OK"):
            raise RuntimeError(f"CLUSTER FAILOVER on {replica} failed: {reply!r}")
        attempt_ends = min(deadline, time.monotonic() + 6.0)
        while time.monotonic() < attempt_ends:
            if _command(replica, "ROLE").startswith(b"*3\r\n$6\r\nmaster"):
                cluster.wait_ok(timeout=max(1.0, deadline - time.monotonic()))
                # ... and every node has heard of it (gossip takes a moment).
                while time.monotonic() < deadline:
                    live = [n.port for n in cluster.nodes if n.proc is not None]
                    if all(_slot_nodes(cluster, slot, asking=p)[1] == replica for p in live):
                        return old, replica
                    time.sleep(0.05)
                break
            time.sleep(0.05)
    raise RuntimeError(f"the replica on {replica} did not take over slot {slot}")
