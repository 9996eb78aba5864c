"""The benchmarks' own redis-server: a throwaway server for one benchmark run.

::

    with redis_server() as server:
        ...  # server.url, server.port, server.command("FLUSHALL")

No persistence (``--save ""``, no AOF), ``noeviction``, bound to 127.0.0.1, its own
temporary directory. The port is drawn from 61000-64999, above the kernel's ephemeral
range (32768-60999 by default on Linux, so no outgoing connection can hold it) and apart
from the test suite's servers (20000-31999), so a benchmark and a test run side by side
never race for a port; a port taken between the draw and the listen is drawn again.

This module is independent of ``tests/`` on purpose: the benchmark harness must not
change when the suite's fixtures do. (The Redis Cluster and fault benchmarks still use
the suite's cluster spawner and fault proxy: they measure exactly that machinery.)
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PORTS = range(61000, 65000)
START_TIMEOUT = 10.0


def resp(*args: str) -> bytes:
    """``args`` as one RESP command (an array of bulk strings)."""
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def command(port: int, *args: str, timeout: float = 60.0) -> bytes:
    """Send one command to the server on ``port``; its status line, or its bulk reply's
    payload (what ``INFO`` answers). An error reply raises."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(resp(*args))
        data = b""
        while b"\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"redis on port {port} closed the connection")
            data += chunk
        header, _, rest = data.partition(b"\r\n")
        if header.startswith(b"-"):
            raise RuntimeError(f"redis on port {port}: {' '.join(args)}: {header[1:].decode()}")
        if not header.startswith(b"$"):
            return header
        size = int(header[1:])
        while len(rest) < size + 2:
            rest += sock.recv(65536)
        return rest[:size]


class BenchRedis:
    """A started redis-server child process (see :func:`redis_server`)."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, folder: Path) -> None:
        self.proc = proc
        self.port = port
        self.folder = folder

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *args: str) -> bytes:
        return command(self.port, *args)

    def flushall(self) -> None:
        self.command("FLUSHALL")

    def info(self, section: str) -> dict[str, str]:
        text = self.command("INFO", section).decode()
        return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _spawn(port: int, folder: Path) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed: run `make redis-server`")
    options = {
        "bind": "127.0.0.1",
        "port": str(port),
        "save": "",
        "appendonly": "no",
        "maxmemory-policy": "noeviction",
        "dir": str(folder),
        "logfile": str(folder / "redis.log"),
    }
    argv = [binary]
    for name, value in options.items():
        argv += [f"--{name}", value]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _answers_ping(port: int) -> bool:
    try:
        return command(port, "PING", timeout=0.5) == b"+PONG"
    except OSError:
        return False


def _start(folder: Path) -> BenchRedis:
    for _ in range(20):
        port = random.choice(PORTS)
        proc = _spawn(port, folder)
        deadline = time.monotonic() + START_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if _answers_ping(port):
                return BenchRedis(proc, port, folder)
            time.sleep(0.02)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"redis-server on port {port} did not answer PING in time")
        log = folder / "redis.log"
        text = log.read_text() if log.exists() else ""
        if "Address already in use" not in text:
            raise RuntimeError(f"redis-server exited at start: {text[-2000:]}")
        log.unlink()  # that port was taken: draw another
    raise RuntimeError(f"no free port for redis-server in {PORTS.start}-{PORTS.stop - 1}")


@contextlib.contextmanager
def redis_server() -> Iterator[BenchRedis]:
    """A fresh redis-server for the block; stopped (SIGTERM) and its folder removed after."""
    folder = Path(tempfile.mkdtemp(prefix="typedq-bench-redis-"))
    try:
        server = _start(folder)
        try:
            yield server
        finally:
            server.proc.terminate()
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
