"""Spawning real redis-server processes for the tests (never a mock, never :6379)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REDIS_SERVER = shutil.which("redis-server")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


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

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS_SERVER is not None
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
