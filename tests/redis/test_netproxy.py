"""The fault injectors themselves: the loopback proxy does what it claims, and the
history checker classifies lost jobs and duplicates as documented."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import pytest

from tests.history import History, Start
from tests.netproxy import NetProxy, net_proxy
from tests.redis_harness import RedisProcess, flushall
from typedq import JobState
from typedq.broker.base import JobMessage, JobRecord


def command(*parts: str) -> bytes:
    """A RESP array (what a real client sends)."""
    out = [f"*{len(parts)}\r\n".encode()]
    for part in parts:
        out.append(f"${len(part.encode())}\r\n{part}\r\n".encode())
    return b"".join(out)


@contextlib.contextmanager
def connection(port: int, timeout: float = 5.0) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        yield sock


def ask(port: int, *parts: str) -> bytes:
    """One command straight to Redis, its reply."""
    with connection(port) as sock:
        sock.sendall(command(*parts))
        return sock.recv(1024)


def closed(sock: socket.socket) -> bool:
    """True when the peer closed or reset the connection (waits up to the socket timeout)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def proxy(redis_server: RedisProcess) -> Iterator[NetProxy]:
    flushall(redis_server.port)
    with net_proxy(redis_server.port, lifetime=60) as proxy:
        yield proxy


@pytest.mark.redis
def test_forwards_both_ways(proxy: NetProxy) -> None:
    with connection(proxy.port) as sock:
        for _ in range(3):
            sock.sendall(command("PING"))
            assert sock.recv(64) == b"+PONG\r\n"
    assert proxy.stats.connections == 1


@pytest.mark.redis
def test_a_dropped_reply_took_effect(proxy: NetProxy, redis_server: RedisProcess) -> None:
    with connection(proxy.port) as sock:
        sock.sendall(command("PING"))
        assert sock.recv(64) == b"+PONG\r\n"
        proxy.drop_next_reply()
        sock.sendall(command("INCR", "dropped"))
        assert closed(sock)  # no reply, the connection is cut
    # Redis ran the command: only its reply was lost.
    assert ask(redis_server.port, "GET", "dropped") == b"$1\r\n1\r\n"
    assert proxy.stats.replies_dropped == 1
    with connection(proxy.port) as sock:  # one drop only
        sock.sendall(command("PING"))
        assert sock.recv(64) == b"+PONG\r\n"


@pytest.mark.redis
def test_a_blackhole_holds_then_delivers(proxy: NetProxy, redis_server: RedisProcess) -> None:
    with connection(proxy.port) as sock:
        proxy.blackhole(1.5)
        began = time.monotonic()
        sock.sendall(command("INCR", "held"))
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):
            sock.recv(64)
        # Nothing reached Redis yet.
        assert ask(redis_server.port, "GET", "held") == b"$-1\r\n"
        sock.settimeout(10)
        assert sock.recv(64) == b":1\r\n"
        assert time.monotonic() - began >= 1.4


@pytest.mark.redis
def test_a_blackhole_that_drops_cuts_the_connections(
    proxy: NetProxy, redis_server: RedisProcess
) -> None:
    with connection(proxy.port) as sock:
        sock.sendall(command("PING"))
        assert sock.recv(64) == b"+PONG\r\n"
        proxy.blackhole(0.5, deliver=False)
        sock.sendall(command("INCR", "lost"))
        assert closed(sock)
    assert ask(redis_server.port, "GET", "lost") == b"$-1\r\n"


@pytest.mark.redis
def test_cut_all_resets_every_connection(proxy: NetProxy) -> None:
    with connection(proxy.port) as one, connection(proxy.port) as two:
        for sock in (one, two):
            sock.sendall(command("PING"))
            assert sock.recv(64) == b"+PONG\r\n"
        proxy.cut_all()
        assert closed(one)
        assert closed(two)
    assert proxy.stats.connections_cut == 2
    with connection(proxy.port) as sock:  # new connections work
        sock.sendall(command("PING"))
        assert sock.recv(64) == b"+PONG\r\n"


@pytest.mark.redis
def test_latency_delays_each_way(proxy: NetProxy) -> None:
    proxy.set_latency(0.3)
    with connection(proxy.port) as sock:
        began = time.monotonic()
        sock.sendall(command("PING"))
        assert sock.recv(64) == b"+PONG\r\n"
        assert time.monotonic() - began >= 0.55
    proxy.set_latency(0.0)


@pytest.mark.redis
def test_the_proxy_stops_by_itself(redis_server: RedisProcess) -> None:
    with net_proxy(redis_server.port, lifetime=0.3) as proxy:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with connection(proxy.port, timeout=1):
                    pass
            except OSError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the proxy still accepts connections after its lifetime")


def record(job_id: str, *, stalls: int = 0, state: JobState = JobState.COMPLETED) -> JobRecord:
    return JobRecord(
        message=JobMessage(id=job_id, task="t", queue="q", payload=b""),
        state=state,
        attempt=1 + stalls,
        enqueued_at=0.0,
        stalls=stalls,
    )


def test_history_classifies_lost_jobs_and_duplicates() -> None:
    history = History()
    history.note_enqueued(["ok", "missing", "failed", "killed", "expired", "race", "orphan"])
    history.note_killed(100)
    history.starts.update(
        {
            "ok": [Start(200, 1)],
            "failed": [Start(200, 1)],
            # Ran on a killed worker, then again after its lease expired: explained.
            "killed": [Start(100, 1), Start(200, 2)],
            # Ran twice after a lease expiry with no worker killed: explained, counted.
            "expired": [Start(200, 1), Start(300, 2)],
            # Ran twice with no lease expiry at all: a race.
            "race": [Start(200, 1), Start(300, 1)],
            # Claimed, its lease expired unused, then ran once: a stall, no duplicate.
            "orphan": [Start(300, 2)],
            "stranger": [Start(200, 1)],
        }
    )
    history.records.update(
        {
            "ok": record("ok"),
            "missing": None,
            "failed": record("failed", state=JobState.FAILED),
            "killed": record("killed", stalls=1),
            "expired": record("expired", stalls=1),
            "race": record("race"),
            "orphan": record("orphan", stalls=1),
        }
    )
    report = history.check()
    assert set(report.lost) == {"missing", "failed"}
    assert report.completed == 5
    assert report.duplicates == {"killed": 2, "expired": 2, "race": 2}
    assert report.explained_by_kill == {"killed"}
    assert report.explained_by_lease == {"expired"}
    assert set(report.unexplained) == {"race"}
    assert report.stalls == 3
    assert report.stalls_no_dead_worker == 2  # expired and orphan; killed ran on pid 100
    assert report.unknown_started == {"stranger"}
    assert not report.ok
    assert "lost=2" in report.figures()
    assert "unexplained=1" in report.figures()
