"""What work notices cost a busy worker: its last claim filled up (it is not waiting for
work) and its pub/sub listener stays subscribed while 4 producers enqueue N single jobs.

Run: ``PYTHONPATH=. .venv/bin/python bench/wake_cost.py [--jobs 20000]``. Prints, per
1,000 jobs, the CPU of the worker process (its listener reads every work notice it is
sent), redis-server's CPU, the time Redis spent in the scripts (``INFO commandstats``,
FCALL) and the PUBLISH calls. Since the waiter marks (keys.py ``Q W``) a busy worker is
sent no notice; before, every enqueue published one.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys

import anyio
import anyio.to_thread
import redis.asyncio as aioredis

from bench.redis_server import redis_server
from tests.redis_support import broker_at, message


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def worker(url: str) -> None:
    """The busy worker (a child process): subscribed, one full claim, then idle until
    told; prints its CPU seconds between the two lines it reads."""
    async with broker_at(url, "busy", deadline=600) as broker:
        await broker.wait_for_jobs(["q"], 0.01)  # subscribed
        assert len(await broker.claim(["q"], 1, worker_id="w", lease=600)) == 1  # full
        print("ready", flush=True)
        # stdin is read in a thread: the listener task keeps reading meanwhile.
        await anyio.to_thread.run_sync(sys.stdin.readline)
        start = _cpu()
        await anyio.to_thread.run_sync(sys.stdin.readline)
        print(_cpu() - start, flush=True)


def spawn_worker(url: str) -> subprocess.Popen[str]:
    """This file as the busy worker, talking over its stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ),
    )


async def redis_cpu(client: aioredis.Redis) -> float:
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def main(jobs: int) -> None:
    with redis_server() as server:
        url = server.url
        async with broker_at(url, "busy", deadline=600) as producer:
            await producer.enqueue([message("first")])
            proc = spawn_worker(url)
            assert proc.stdin is not None
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            client = aioredis.Redis.from_url(url)
            await client.config_resetstat()
            before = await redis_cpu(client)
            proc.stdin.write("go\n")
            proc.stdin.flush()

            async def produce(base: int) -> None:
                for i in range(base, base + jobs // 4):
                    await producer.enqueue([message(f"j{i}")])

            async with anyio.create_task_group() as tg:
                for k in range(4):
                    tg.start_soon(produce, k * (jobs // 4))
            await anyio.sleep(0.5)  # the notices sent are read
            proc.stdin.write("stop\n")
            proc.stdin.flush()
            worker_s = float(proc.stdout.readline())
            redis_s = await redis_cpu(client) - before
            stats = await client.info("commandstats")
            await client.aclose()
            proc.wait()
    publish = int(stats.get("cmdstat_publish", {}).get("calls", 0))
    fcall_us = int(stats.get("cmdstat_fcall", {}).get("usec", 0))
    print(
        f"busy worker, {jobs} enqueues, per 1k jobs: worker CPU {worker_s * 1e6 / jobs:.1f} ms, "
        f"redis-server CPU {redis_s * 1e6 / jobs:.1f} ms, scripts {fcall_us / jobs:.1f} ms, "
        f"PUBLISH {publish * 1000 / jobs:.1f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        anyio.run(worker, args.worker)
    else:
        anyio.run(main, args.jobs)
