"""Schedules with real worker processes on Redis: each tick is enqueued once however many
processes run the scheduler, with one SIGKILLed midway and one whose clock is skewed.

Workers run :mod:`tests.schedule_app`; its handler counts every execution per tick in a
ledger (database 1 of the same redis-server), read from outside the workers.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping

import anyio
import pytest
import redis.asyncio as aioredis

from tests import schedule_app
from tests.redis_harness import RedisProcess, flushall
from tests.support import spawn_worker, stop_workers

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.anyio, pytest.mark.asyncio_only]

#: The schedule's interval (``$TYPEDQ_TEST_EVERY`` of tests.schedule_app), in µs: a quarter
#: second, so the ~18 ticks the test counts pass in ~5 s rather than ~18 s of 1 s ticks
#: (ticks are multiples of the interval, whatever the interval: nothing here needs 1 s).
EVERY_US = 250_000


def ledger_url(server: RedisProcess) -> str:
    return f"redis://127.0.0.1:{server.port}/1"


@contextlib.contextmanager
def workers(
    server: RedisProcess, envs: list[Mapping[str, str]]
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One worker process of tests.schedule_app per environment; stopped after."""
    procs = []
    for i, extra in enumerate(envs):
        env = {
            "TYPEDQ_TEST_LEDGER": ledger_url(server),
            "TYPEDQ_TEST_LEASE": "1.0",
            "TYPEDQ_TEST_EVERY": str(EVERY_US / 1e6),
            **extra,
        }
        log_path = server.dir / f"sched-worker-{i}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as log:
            procs.append(
                spawn_worker(
                    "tests.schedule_app:app",
                    server.url,
                    concurrency=4,
                    grace=2,
                    env=env,
                    output=log,
                )
            )
    try:
        yield procs
    finally:
        stop_workers(procs)


def _counts(raw: Mapping[bytes | str, bytes | str]) -> dict[float, int]:
    return {float(k): int(v) for k, v in raw.items()}


async def test_three_processes_fire_each_tick_once_through_a_sigkill_and_clock_skew(
    redis_server: RedisProcess,
) -> None:
    flushall(redis_server.port)
    ledger = aioredis.Redis.from_url(ledger_url(redis_server))
    envs: list[Mapping[str, str]] = [
        {},
        {"TYPEDQ_TEST_SKEW": "30"},  # a local clock 30 s ahead: would fire ticks early
        {"TYPEDQ_TEST_SKEW": "-30"},  # and one 30 s behind: would fire them late, again
    ]
    try:
        with workers(redis_server, envs) as procs:
            with anyio.fail_after(60):
                # Wait until ticks flow, then let ~8 of them pass, kill one, ~10 more.
                while not await ledger.hlen("first_runs"):  # noqa: ASYNC110 - other processes
                    await anyio.sleep(0.1)
                await anyio.sleep(8 * EVERY_US / 1e6)
                procs[0].send_signal(signal.SIGKILL)
                procs[0].wait()
                await anyio.sleep(10 * EVERY_US / 1e6)
            assert all(p.poll() is None for p in procs[1:])
            stop_workers(procs[1:])
        runs = _counts(await ledger.hgetall("runs"))
        first_runs = _counts(await ledger.hgetall("first_runs"))
    finally:
        await ledger.aclose()
    schedule_app.app.use_broker(redis_server.url)
    async with schedule_app.app:
        (state,) = await schedule_app.app.broker.schedule_states()
    ticks = sorted(round(t * 1e6) for t in first_runs)  # µs: exact arithmetic
    # Each tick was enqueued once: one first attempt per tick (a tick job the killed
    # process was running may have run again, as attempt 2, after its lease expired).
    assert set(first_runs.values()) == {1}, first_runs
    assert set(runs) == set(first_runs)
    # None missed between the first and the last: multiples of the interval, one after
    # the other.
    assert ticks == [ticks[0] + i * EVERY_US for i in range(len(ticks))]
    assert all(t % EVERY_US == 0 for t in ticks)
    assert len(ticks) >= 15
    # The broker's record agrees: everything fired once, nothing skipped.
    # (This process's tests.schedule_app has the default 1 s interval, hence its own name.)
    assert state.name == f"{schedule_app.tick.name}.every-0.25s"
    assert state.skipped == 0
    assert state.fired >= len(ticks)  # ticks fired while the test stopped may not have run
    assert state.fired <= len(ticks) + 3
