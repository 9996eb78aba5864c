"""Exactly-once over slow links: 2 real worker processes, 3,000 jobs per fault kind.

The runs of test_network_faults.py (its docstring says what is judged, and how), with
the proxy holding bytes instead of dropping them: blackholes past the client's socket
timeout, and latency with spikes. A file of its own so that ``--dist loadfile`` runs
these two long runs on another process than the other three.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from tests.netfault_run import assert_exactly_once, fault_run, run_with_faults

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]

#: The workers' and the producer's socket timeout in the blackhole test, seconds: 1 s (a
#: redis-py option in the broker URL's query overrides typedq's 5 s), so blackholes past it
#: last 1.4 s rather than 7 s.
BLACKHOLE_SOCKET_TIMEOUT = 1.0


async def test_blackholes(tmp_path: Path) -> None:
    """Two blackholes (0.4 s, then 1.4 s: past the client's 1 s socket timeout, so every
    command in flight is re-sent and the originals still arrive afterwards). The lease
    (15 s) outlasts both, so no lease may expire."""
    timeout = BLACKHOLE_SOCKET_TIMEOUT

    async def faults(stop: anyio.Event) -> None:
        with anyio.move_on_after(1.5):
            await stop.wait()
        assert proxy is not None
        proxy.blackhole(0.4 * timeout)
        with anyio.move_on_after(1.5):
            await stop.wait()
        proxy.blackhole(1.4 * timeout)

    async with fault_run(tmp_path, lease=15.0, socket_timeout=timeout) as (run, proxy):
        report, _ = await run_with_faults(run, faults)
        assert proxy is not None
        print(f"[network faults] proxy: {proxy.stats}")
        assert proxy.stats.blackholes == 2
        assert_exactly_once(report, run)


async def test_latency(tmp_path: Path) -> None:
    """20 ms on every chunk both ways (a slow link), with a 1 s spike every 3 s."""

    async def faults(stop: anyio.Event) -> None:
        assert proxy is not None
        while not stop.is_set():
            proxy.set_latency(0.02)
            with anyio.move_on_after(3.0):
                await stop.wait()
            proxy.set_latency(1.0)
            with anyio.move_on_after(0.3):
                await stop.wait()
        proxy.set_latency(0.0)

    async with fault_run(tmp_path, lease=5.0) as (run, proxy):
        report, _ = await run_with_faults(run, faults)
        assert_exactly_once(report, run)
