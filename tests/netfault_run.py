"""Driving a fault run: worker processes of :mod:`tests.netfault_app`, a producer, a checker.

Shared by the network fault tests (tests/process/test_network_*.py), bench/soak.py and
bench/client_kill_figures.py. The broker's redis-server
may sit behind a :class:`~tests.netproxy.NetProxy` (workers and producer use
``worker_url``); the test's own observer and the ledger talk to their servers
directly, so faults never blind the judge.
"""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import redis.asyncio as aioredis

from tests import netfault_app
from tests.history import History, Report
from tests.netproxy import NetProxy, net_proxy
from tests.redis_harness import RedisProcess, redis_process
from tests.redis_support import with_socket_timeout
from tests.support import ROOT, spawn_worker, stop_workers
from typedq import JobState
from typedq.broker.base import BrokerSettings
from typedq.broker.redis import RedisBroker
from typedq.errors import TypedqError
from typedq.task import DEFAULT_QUEUE

log = logging.getLogger("tests.netfault_run")


class FaultRun:
    """Worker processes, a producer with fixed ids, and the history of one run.

    :param server: the broker's redis-server (observed directly)
    :param ledger: the redis-server whose db 0 holds the execution ledger
    :param worker_url: the URL workers and the producer use (the proxy's, or ``server.url``)
    :param lease: the app's lease, seconds
    :param concurrency: jobs per worker process
    """

    def __init__(
        self,
        server: RedisProcess,
        ledger: RedisProcess,
        worker_url: str,
        *,
        lease: float = 5.0,
        concurrency: int = 32,
        log_dir: Path | None = None,
    ) -> None:
        self.server = server
        self.ledger_server = ledger
        self.worker_url = worker_url
        self.lease = lease
        self.concurrency = concurrency
        self.log_dir = log_dir or server.dir
        self.workers: list[subprocess.Popen[bytes]] = []
        self.history = History()
        self.observer = RedisBroker(server.url, BrokerSettings(namespace=netfault_app.app.name))
        self.ledger = aioredis.Redis.from_url(ledger.url)

    # -- workers --------------------------------------------------------------------------

    def spawn_worker(self) -> subprocess.Popen[bytes]:
        """Start one ``python -m typedq worker tests.netfault_app:app`` process."""
        env = {
            "TYPEDQ_TEST_LEDGER": self.ledger_server.url,
            "TYPEDQ_TEST_LEASE": str(self.lease),
        }
        log_path = self.log_dir / f"worker-{len(self.workers)}-{time.monotonic_ns()}.log"
        with log_path.open("wb") as out:  # the child keeps its own descriptor
            proc = spawn_worker(
                "tests.netfault_app:app",
                self.worker_url,
                concurrency=self.concurrency,
                grace=2,
                env=env,
                output=out,
            )
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes]) -> None:
        """SIGKILL a worker (noted in the history: its running jobs may run again)."""
        self.history.note_killed(proc.pid)
        self.history.note_fault(time.monotonic(), f"SIGKILL worker {proc.pid}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.workers if p.poll() is None]

    def stop_workers(self) -> None:
        """SIGTERM every live worker, SIGKILL any that does not exit within 15 s."""
        stop_workers(self.workers, timeout=15)

    def worker_logs(self, pattern: str) -> list[str]:
        """Lines of every worker log containing ``pattern``."""
        return [
            line
            for path in sorted(self.log_dir.glob("worker-*.log"))
            for line in path.read_text(errors="replace").splitlines()
            if pattern in line
        ]

    def log_digest(self, top: int = 8) -> list[str]:
        """The most frequent WARNING/ERROR lines of the worker logs, numbers masked."""
        counts: Counter[str] = Counter()
        for line in self.worker_logs(""):
            if "WARNING" in line or "ERROR" in line or "Error" in line:
                counts[re.sub(r"[0-9A-Fa-f]{6,}|\d+(\.\d+)?", "#", line)[:200]] += 1
        return [f"{n} x {text}" for text, n in counts.most_common(top)]

    # -- producer -------------------------------------------------------------------------

    async def produce(
        self, total: int, *, seconds: float, work: float = 0.0, chunk: int = 250
    ) -> None:
        """Enqueue ``total`` jobs with fixed ids, spread over ``seconds``, through ``worker_url``.

        Each job works ``work`` seconds. A chunk whose enqueue fails (a fault hit it) is sent again as is: the ids are
        fixed, so a chunk that was in fact stored is not stored twice.
        """
        app = netfault_app.app
        app.use_broker(self.worker_url)
        started = time.monotonic()
        async with contextlib.AsyncExitStack() as stack:
            # The faults are already on: one may hit the producer's connect (a dropped
            # reply to its script loading), which is not retried; connect again, as a
            # producer service would.
            # (A deadline, not fail_after: the connected client's scopes outlive this loop.)
            give_up = time.monotonic() + 120
            while True:
                try:
                    await stack.enter_async_context(app)
                    break
                except TypedqError as exc:
                    if time.monotonic() > give_up:
                        raise
                    log.info("connecting the producer failed (%s); trying again", exc)
                    await anyio.sleep(0.2)
            for offset in range(0, total, chunk):
                messages = [
                    netfault_app.tick.message(
                        netfault_app.Tick(n=n, sleep=work), job_id=f"n{n:07d}"
                    )
                    for n in range(offset, min(total, offset + chunk))
                ]
                self.history.note_enqueued(m.id for m in messages)
                with anyio.fail_after(120):
                    while True:
                        try:
                            await app.client.enqueue_many(messages)
                            break
                        except TypedqError as exc:
                            log.info("enqueue of a chunk failed (%s); sending it again", exc)
                            await anyio.sleep(0.2)
                due = started + seconds * min(total, offset + chunk) / total
                await anyio.sleep(max(0.0, due - time.monotonic()))

    # -- observing and judging ------------------------------------------------------------

    async def connect(self) -> None:
        await self.observer.connect()

    async def close(self) -> None:
        await self.observer.close()
        await self.ledger.aclose()

    async def completed(self) -> int:
        """Completed jobs right now (0 while the broker's Redis is unreachable)."""
        try:
            return (await self.observer.counts(DEFAULT_QUEUE))[JobState.COMPLETED]
        except TypedqError:
            return 0

    async def wait_completed(self, total: int, deadline: float) -> bool:
        """Wait until ``total`` jobs completed or ``deadline`` seconds passed; True if they did."""
        with anyio.move_on_after(deadline):
            while await self.completed() < total:  # noqa: ASYNC110 -- other processes
                await anyio.sleep(0.1)
            return True
        return False

    async def check(self) -> Report:
        """Load the ledger and the final records, and judge the history."""
        await self.history.load_starts(self.ledger)
        await self.history.load_records(self.observer)
        return self.history.check()


# -- the network fault tests' runs (tests/process/test_network_*.py) -------------------------

#: Jobs per fault kind through the proxy: enough for ~5 s of busy slots (the faults land
#: on claims in flight throughout; each test checks how many faults it applied).
TOTAL = 3_000
WORKERS = 2
#: Jobs are enqueued over this many seconds (faster than they run: a backlog forms).
PRODUCE_SECONDS = 2.0
#: Seconds each job works (asleep): 2 x 32 slots run ~640 jobs/s, so a run keeps every
#: slot busy for ~5 s, with claims in flight all the time while the faults hit.
WORK = 0.1
#: Seconds after the last enqueue within which every job must have completed. Generous:
#: a job orphaned by a defect comes back only after its lease, and the box is shared.
DRAIN_DEADLINE = 90.0


@contextlib.asynccontextmanager
async def fault_run(
    log_dir: Path, *, lease: float, proxied: bool = True, socket_timeout: float | None = None
) -> AsyncIterator[tuple[FaultRun, NetProxy | None]]:
    """A broker redis-server (behind a proxy unless ``proxied=False``), a ledger server,
    2 worker processes; stopped and cleaned up afterwards.

    :param socket_timeout: the workers' and the producer's socket timeout (None: typedq's)
    """
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(redis_process())
        ledger_server = stack.enter_context(redis_process())
        proxy = stack.enter_context(net_proxy(server.port, lifetime=600)) if proxied else None
        url = proxy.url() if proxy is not None else server.url
        if socket_timeout is not None:
            url = with_socket_timeout(url, socket_timeout)
        run = FaultRun(
            server,
            ledger_server,
            url,
            lease=lease,
            concurrency=32,
            log_dir=log_dir,
        )
        await run.connect()
        try:
            for _ in range(WORKERS):
                run.spawn_worker()
            yield run, proxy
        finally:
            run.stop_workers()
            await run.close()


async def run_with_faults(
    run: FaultRun,
    faults: Callable[[anyio.Event], Coroutine[Any, Any, None]],
    *,
    total: int = TOTAL,
    work: float = WORK,
) -> tuple[Report, bool]:
    """Produce ``total`` jobs while ``faults`` runs (until told to stop), wait, then judge."""
    stop_faults = anyio.Event()
    began = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(faults, stop_faults)
        await run.produce(total, seconds=PRODUCE_SECONDS, work=work)
        drained = await run.wait_completed(total, DRAIN_DEADLINE)
        stop_faults.set()
    if not drained:
        # Faults are off now: give orphaned jobs their chance, so the report tells
        # "late" (stalled, then run) from "lost" (never completes).
        drained = await run.wait_completed(total, 30)
    report = await run.check()
    print(f"\n[network faults] took {time.monotonic() - began:.1f}s {report.figures()}")
    if not report.ok or report.stalls_no_dead_worker:
        print(report.summary())
        print("worker logs, most frequent warnings and errors:")
        for line in run.log_digest():
            print("  " + line)
    return report, drained


def assert_exactly_once(report: Report, run: FaultRun, total: int = TOTAL) -> None:
    """No worker died: nothing lost, nothing run twice, nothing stalled.

    (A plain module, not rewritten by pytest: each assert says what it compared.)
    """
    assert not run.history.killed_pids, f"workers killed: {run.history.killed_pids}"
    assert all(p.poll() is None for p in run.workers), "a worker process died"
    assert report.lost == {}, f"{len(report.lost)} jobs lost:\n{report.summary()}"
    assert report.duplicates == {}, (
        f"{len(report.duplicates)} jobs ran more than once:\n{report.summary()}"
    )
    assert report.stalls_no_dead_worker == 0, (
        f"{report.stalls_no_dead_worker} stalls with no dead worker:\n{report.summary()}"
    )
    assert report.completed == report.enqueued == total, (
        f"completed {report.completed}, enqueued {report.enqueued}, of {total}"
    )


async def every(period: float, stop: anyio.Event, action: Callable[[], object]) -> None:
    """Call ``action`` every ``period`` seconds until ``stop`` is set."""
    while not stop.is_set():
        action()
        with anyio.move_on_after(period):
            await stop.wait()


__all__ = [
    "DRAIN_DEADLINE",
    "PRODUCE_SECONDS",
    "ROOT",
    "TOTAL",
    "WORK",
    "WORKERS",
    "FaultRun",
    "assert_exactly_once",
    "every",
    "fault_run",
    "run_with_faults",
]
