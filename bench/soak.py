"""Soak: many jobs over many minutes under randomly mixed faults, judged by a history checker.

    make soak                                         # 100,000 jobs over ~10 minutes
    .venv/bin/python -m bench.soak --jobs 5000 --minutes 1 --seed 7   # a short run

Two worker processes of tests/netfault_app.py (``python -m typedq worker``) and a
producer reach a redis-server (``appendonly yes``, ``appendfsync always``, its own
directory) through the loopback proxy of tests/netproxy.py. While the jobs are
enqueued at a steady pace, a seeded random schedule injects, one at a time:

- ``sigkill``: SIGKILL a worker process, start a new one a moment later;
- ``redis-restart``: SIGKILL redis-server and start it again on the same AOF;
- ``client-kill``: a burst of ``CLIENT KILL TYPE normal`` sent straight to Redis;
- ``blackhole``: the proxy forwards nothing for 1-8 s (then delivers the held bytes,
  or drops them and cuts every connection).

Every handler run is recorded in a ledger on a second redis-server that no fault
touches. When the last job is enqueued the faults stop, every job must complete,
and tests/history.py reports lost jobs and duplicates not explained by a lease
expiry. Exit status: 0 when nothing was lost and every duplicate is explained, 1
otherwise. Not part of ``make test`` (it runs for minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import anyio
import redis.asyncio as aioredis

from tests.netfault_run import FaultRun
from tests.netproxy import NetProxy
from tests.redis_harness import RedisProcess

FAULTS = ("sigkill", "redis-restart", "client-kill", "blackhole")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs enqueued (100000)")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="enqueueing spreads over this long (10)"
    )
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    parser.add_argument("--concurrency", type=int, default=32, help="jobs per worker (32)")
    parser.add_argument("--lease", type=float, default=5.0, help="lease seconds (5)")
    parser.add_argument("--work", type=float, default=0.1, help="seconds each job sleeps (0.1)")
    parser.add_argument(
        "--fault-every", type=float, default=6.0, help="mean seconds between faults (6)"
    )
    parser.add_argument(
        "--faults",
        default=",".join(FAULTS),
        help=f"comma-separated fault kinds to mix (default: all of {','.join(FAULTS)})",
    )
    parser.add_argument(
        "--drain-minutes", type=float, default=5.0, help="time allowed to finish after (5)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.faults.split(",") if k]
    unknown = set(kinds) - set(FAULTS)
    if unknown or not kinds:
        parser.error(f"--faults takes kinds from {', '.join(FAULTS)}; got {args.faults!r}")
    args.fault_kinds = kinds
    if args.seed is None:
        args.seed = random.randrange(1_000_000)
    return args


class Soak:
    """One soak run: servers, proxy, workers, producer, fault schedule, verdict."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = workdir
        self.server = RedisProcess(appendonly=True, extra=("--appendfsync", "always"))
        self.ledger = RedisProcess()
        self.proxy = NetProxy(self.server.port, lifetime=args.minutes * 60 + 3600)
        self.run: FaultRun | None = None
        self.fault_counts: Counter[str] = Counter()
        self.began = time.monotonic()

    def say(self, text: str) -> None:
        print(f"[soak {time.monotonic() - self.began:7.1f}s] {text}", flush=True)

    async def main(self) -> int:
        args = self.args
        self.server.start()
        self.ledger.start()
        self.proxy.start()
        run = self.run = FaultRun(
            self.server,
            self.ledger,
            self.proxy.url(),
            lease=args.lease,
            concurrency=args.concurrency,
            log_dir=self.workdir,
        )
        try:
            await run.connect()
            for _ in range(args.workers):
                run.spawn_worker()
            self.say(
                f"seed={args.seed} jobs={args.jobs} minutes={args.minutes} workers={args.workers}"
                f" concurrency={args.concurrency} lease={args.lease}s work={args.work}s"
                f" faults={','.join(args.fault_kinds)} every ~{args.fault_every}s"
                f" dir={self.workdir}"
            )
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(self.faults, stop)
                tg.start_soon(self.progress, stop)
                # Small chunks: a steady flow, so a fault always finds jobs in flight.
                await run.produce(args.jobs, seconds=args.minutes * 60, work=args.work, chunk=50)
                self.say("all jobs enqueued; faults stop, waiting for the rest to finish")
                stop.set()
            # Bring back everything the faults took down before judging.
            self.proxy.set_latency(0.0)
            while len(run.alive()) < args.workers:
                run.spawn_worker()
            drained = await run.wait_completed(args.jobs, args.drain_minutes * 60)
            report = await run.check()
            data_lost = run.worker_logs("lost its data")
        finally:
            run.stop_workers()
            await run.close()
            self.proxy.stop()
            self.server.stop()
            self.ledger.stop()
        self.say(f"faults injected: {dict(self.fault_counts)}; proxy: {self.proxy.stats}")
        self.say("drained" if drained else "NOT drained within the drain time")
        print(report.summary(examples=10))
        if data_lost:
            print(f"workers reported lost Redis data {len(data_lost)} times: {data_lost[0]}")
        if report.ok and drained and not data_lost:
            print(f"SOAK OK (seed {args.seed})")
            return 0
        print(f"SOAK FAILED (seed {args.seed}): see above; re-run with --seed {args.seed}")
        return 1

    async def progress(self, stop: anyio.Event) -> None:
        assert self.run is not None
        while not stop.is_set():
            with anyio.move_on_after(15):
                await stop.wait()
            self.say(
                f"completed {await self.run.completed()} / enqueued "
                f"{len(self.run.history.enqueued)}; workers alive {len(self.run.alive())}"
            )

    async def faults(self, stop: anyio.Event) -> None:
        while not stop.is_set():
            with anyio.move_on_after(self.rng.expovariate(1 / self.args.fault_every)):
                await stop.wait()
            if stop.is_set():
                return
            kind = self.rng.choice(self.args.fault_kinds)
            self.fault_counts[kind] += 1
            await getattr(self, "fault_" + kind.replace("-", "_"))()

    async def fault_sigkill(self) -> None:
        assert self.run is not None
        alive = self.run.alive()
        if not alive:
            return
        victim = self.rng.choice(alive)
        self.say(f"fault: SIGKILL worker {victim.pid}")
        self.run.kill_worker(victim)
        await anyio.sleep(self.rng.uniform(0.2, 2.0))
        self.say(f"started worker {self.run.spawn_worker().pid}")

    async def fault_redis_restart(self) -> None:
        down = self.rng.uniform(0.2, 3.0)
        self.say(f"fault: SIGKILL redis-server, restart it on its AOF after {down:.1f}s")
        assert self.run is not None
        self.run.history.note_fault(time.monotonic(), "redis restart")
        self.server.kill(signal.SIGKILL)
        await anyio.sleep(down)
        await anyio.to_thread.run_sync(self.server.start)

    async def fault_client_kill(self) -> None:
        times = self.rng.randint(1, 10)
        self.say(f"fault: CLIENT KILL TYPE normal x{times}, every 200 ms")
        admin = aioredis.Redis.from_url(self.server.url)
        try:
            for _ in range(times):
                with contextlib.suppress(Exception):  # Redis may be restarting
                    await admin.client_kill_filter(_type="normal")
                await anyio.sleep(0.2)
        finally:
            await admin.aclose()

    async def fault_blackhole(self) -> None:
        seconds = self.rng.uniform(1.0, 8.0)
        deliver = self.rng.random() < 0.5
        then = "deliver the held bytes" if deliver else "drop them and cut every connection"
        self.say(f"fault: proxy blackhole for {seconds:.1f}s, then {then}")
        self.proxy.blackhole(seconds, deliver=deliver)
        await anyio.sleep(seconds)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="typedq-soak-"))
    status = anyio.run(Soak(args, workdir).main, backend="asyncio")
    if args.keep:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
