"""The issue's CLIENT KILL figures at full size: 5,000 jobs, ``CLIENT KILL TYPE normal``
every 200 ms.

    .venv/bin/python -m bench.client_kill_figures            # 5,000 jobs, ~80 kills
    .venv/bin/python -m bench.client_kill_figures --jobs 10000

Two worker processes of tests/netfault_app.py (``python -m typedq worker``, 32 slots
each) connected straight to a redis-server of their own run the jobs (0.2 s of work
each: ~16 s of busy slots) while ``CLIENT KILL TYPE normal`` is sent to Redis every
200 ms; tests/history.py then judges the run from a ledger on a second redis-server.
Prints the figures (stalls with no dead worker, lost, duplicates). Exit status: 0 when
all three are 0 and every job completed, 1 otherwise. The same run on 2,000 jobs is a
test: tests/process/test_network_faults.py::test_client_kill_every_200ms_figures.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

import anyio
import redis.asyncio as aioredis

from tests.netfault_run import WORK, WORKERS, fault_run, run_with_faults


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="bench.client_kill_figures", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=5_000, help="jobs enqueued (5000)")
    parser.add_argument(
        "--every", type=float, default=0.2, help="seconds between two CLIENT KILLs (0.2)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the worker logs")
    return parser.parse_args(argv)


async def figures(args: argparse.Namespace, workdir: Path) -> int:
    kills = 0
    async with fault_run(workdir, lease=5.0, proxied=False) as (run, _):
        admin = aioredis.Redis.from_url(run.server.url)

        async def faults(stop: anyio.Event) -> None:
            nonlocal kills
            while not stop.is_set():
                # SKIPME is the default: this connection survives its own kills.
                await admin.client_kill_filter(_type="normal")
                kills += 1
                with anyio.move_on_after(args.every):
                    await stop.wait()

        try:
            report, drained = await run_with_faults(run, faults, total=args.jobs, work=2 * WORK)
        finally:
            await admin.aclose()
        died = [p.pid for p in run.workers if p.poll() is not None]
    print(
        f"CLIENT KILL TYPE normal x{kills} every {args.every * 1000:.0f} ms, {args.jobs} jobs, "
        f"{WORKERS} worker processes: stalls_no_dead_worker={report.stalls_no_dead_worker} "
        f"lost={len(report.lost)} duplicates={len(report.duplicates)} "
        f"completed={report.completed}"
    )
    ok = (
        drained
        and not died
        and not report.lost
        and not report.duplicates
        and report.stalls_no_dead_worker == 0
        and report.completed == report.enqueued == args.jobs
    )
    if died:
        print(f"worker processes died: {died}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="typedq-client-kill-"))
    status = anyio.run(figures, args, workdir, backend="asyncio")
    if args.keep:
        print(f"logs kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
