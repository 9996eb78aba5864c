"""typedq on Redis: the benchmark workloads (bench/README.md) against a redis-server this script spawns.

Run: ``.venv/bin/python -m bench.redis_bench [--quick] [--workloads e2e,drain]
[--concurrency 1,16]``. Prints one line per workload:

- single enqueue: 10,000 jobs, 32 concurrent producers each awaiting one ``enqueue``
- bulk enqueue: 10,000 jobs in batches of 100 (one after another), p99 per batch
- end-to-end: 20,000 tasks from 4 producers (single enqueues), a no-op async handler
  in one worker process at concurrency 1, 4, 16, 64; throughput and p50/p95
  enqueue-to-finish latency (both stamps from the Redis clock, read from the jobs)
- drain: 20,000 pre-filled jobs, one worker process at concurrency 16
- memory: Redis bytes per waiting job (100k jobs here; bench/redis_memory.py does 1M)

End-to-end and drain also print Redis' own cost from ``INFO commandstats`` (reset
before the run; see :func:`redis_cost`): the milliseconds Redis spent on commands per
1,000 jobs, and the script calls and all commands per job, producers included; and
the CPU time per job of the worker process and of redis-server (steadier than jobs/s
on a shared machine).

The payload is a ~100-byte msgpack struct. Workers are separate processes
(``python -m typedq worker bench.redis_bench:app``) so producer and worker each get
a core, as they would in production.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import anyio
import msgspec
import redis.asyncio as aioredis

from bench.redis_server import redis_server as bench_redis
from typedq import App, JobState, Retention
from typedq.broker.base import JobRecord

ROOT = Path(__file__).resolve().parent.parent

app = App("bench", lease=30.0, retention=Retention(completed_max=1_000_000))

# The benchmark's redis-server runs without persistence on purpose (as for the peers):
# drop that one connect-time warning, here and in the worker processes (they import us).
logging.getLogger("typedq.broker.redis").addFilter(
    lambda record: "without persistence" not in record.getMessage()
)


class Payload(msgspec.Struct, frozen=True):
    """About 100 bytes encoded: a small JSON-like payload."""

    user_id: int
    email: str
    tags: list[str]
    note: str


def payload(i: int) -> Payload:
    return Payload(
        user_id=i,
        email=f"user{i:07d}@example.com",
        tags=["alpha", "beta", "gamma"],
        note="x" * 40,
    )


@app.task
async def noop(item: Payload) -> None:
    """The no-op handler of the end-to-end and drain workloads."""
    return None


# -- redis-server and worker processes ------------------------------------------------


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A throwaway redis-server (no persistence, ``noeviction``) on a free port; yields its URL
    (the benchmarks' own spawner, ``bench/redis_server.py``)."""
    with bench_redis() as server:
        yield server.url


@contextlib.contextmanager
def worker_process(
    url: str, concurrency: int, processes: int = 1
) -> Iterator[subprocess.Popen[bytes]]:
    """``typedq worker`` for this app (``processes`` > 1: under its supervisor)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "typedq", "--log-level", "WARNING", "worker"),
            *("bench.redis_bench:app", "--concurrency", str(concurrency), "--broker", url),
            # Only when asked: the flag is newer than some commits this file is run against.
            *(("--processes", str(processes)) if processes > 1 else ()),
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def flush(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.flushall()
    finally:
        await client.aclose()


async def reset_stats(url: str) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        await client.config_resetstat()
    finally:
        await client.aclose()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (Linux ``/proc``; 0 elsewhere).
    On a shared machine CPU per job is steadier than jobs per second."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def redis_cpu(url: str) -> float:
    """Redis' own CPU seconds (``INFO cpu``: commands, networking, everything)."""
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("cpu")
    finally:
        await client.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def redis_cost(url: str, jobs: int) -> str:
    """Redis' command time per 1,000 jobs and calls per job since :func:`reset_stats`.

    ``scripts``: the time of the script calls (FCALL; EVALSHA/EVAL before), the commands they run
    included; ``all``: every command's time summed, so a script's own commands count
    twice (in the script and under their own name), as ``INFO commandstats`` shows them.
    """
    client = aioredis.Redis.from_url(url)
    try:
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    is_script = ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval")
    script_us = sum(int(v["usec"]) for k, v in stats.items() if k in is_script)
    all_us = sum(int(v["usec"]) for v in stats.values())
    scripts = sum(int(v["calls"]) for k, v in stats.items() if k in is_script)
    calls = sum(int(v["calls"]) for v in stats.values())
    return (
        f"redis ms/1k jobs: scripts {script_us / jobs:.1f}, all {all_us / jobs:.1f}; "
        f"{scripts / jobs:.2f} scripts/job, {calls / jobs:.2f} commands/job"
    )


async def wait_done(total: int) -> None:
    while (await app.broker.counts("default"))[JobState.COMPLETED] < total:  # noqa: ASYNC110
        await anyio.sleep(0.02)


async def records(ids: Sequence[str]) -> list[JobRecord]:
    out: list[JobRecord] = []
    for i in range(0, len(ids), 1000):
        out += [r for r in await app.broker.get(ids[i : i + 1000]) if r is not None]
    return out


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- workloads ------------------------------------------------------------------------


async def single_enqueue(total: int, producers: int = 32) -> float:
    per = total // producers

    async def produce(base: int) -> None:
        for i in range(base, base + per):
            await noop.enqueue(payload(i))

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for p in range(producers):
            tg.start_soon(produce, p * per)
    return per * producers / (time.perf_counter() - start)


async def bulk_enqueue(total: int, batch: int = 100) -> tuple[float, float]:
    items = [payload(i) for i in range(total)]
    latencies = []
    start = time.perf_counter()
    for i in range(0, total, batch):
        t = time.perf_counter()
        await noop.enqueue_many(items[i : i + batch])
        latencies.append(time.perf_counter() - t)
    return total / (time.perf_counter() - start), pct(latencies, 0.99)


async def end_to_end(url: str, total: int, concurrency: int) -> tuple[float, float, float, str]:
    ids: list[str] = []
    per = total // 4
    with worker_process(url, concurrency) as proc:
        await anyio.sleep(1.0)  # let the worker connect before the clock starts
        await reset_stats(url)
        cpu = process_cpu(proc.pid), await redis_cpu(url)

        async def produce(base: int) -> None:
            for i in range(base, base + per):
                ids.append((await noop.enqueue(payload(i))).id)

        async with anyio.create_task_group() as tg:
            for p in range(4):
                tg.start_soon(produce, p * per)
        await wait_done(per * 4)
        cost = await redis_cost(url, per * 4)
        worker_us = (process_cpu(proc.pid) - cpu[0]) / (per * 4) * 1e6
        redis_us = (await redis_cpu(url) - cpu[1]) / (per * 4) * 1e6
        cost += f"; CPU µs/job: worker {worker_us:.0f}, redis-server {redis_us:.0f}"
    done = await records(ids)
    latency = [r.finished_at - r.enqueued_at for r in done]
    span = max(r.finished_at for r in done) - min(r.enqueued_at for r in done)
    return len(done) / span, pct(latency, 0.5), pct(latency, 0.95), cost


async def drain(
    url: str, total: int, concurrency: int = 16, processes: int = 1
) -> tuple[float, str]:
    jobs = await noop.enqueue_many([payload(i) for i in range(total)])
    await reset_stats(url)
    redis_before = await redis_cpu(url)
    with worker_process(url, concurrency, processes) as proc:
        await wait_done(total)
        cost = await redis_cost(url, total)
        cpu = (await redis_cpu(url) - redis_before) / total * 1e6
        # Worker start-up (imports, connect) included: it is no part of the job path.
        worker_us = process_cpu(proc.pid) / total * 1e6
        cost += f"; CPU µs/job: worker {worker_us:.0f} (start-up included), redis-server {cpu:.0f}"
    done = await records([j.id for j in jobs])
    rate = len(done) / (max(r.finished_at for r in done) - min(r.started_at for r in done))
    return rate, cost


async def bytes_per_waiting_job(url: str, total: int) -> float:
    client = aioredis.Redis.from_url(url)
    try:
        before = int((await client.info("memory"))["used_memory"])
        for i in range(0, total, 10_000):
            await noop.enqueue_many([payload(n) for n in range(i, min(total, i + 10_000))])
        after = int((await client.info("memory"))["used_memory"])
    finally:
        await client.aclose()
    return (after - before) / total


@contextlib.asynccontextmanager
async def fresh(url: str) -> AsyncIterator[None]:
    """An empty Redis and the app connected to it. The app is closed while Redis is
    flushed: a connected app would rightly report the flush as lost data."""
    await flush(url)
    async with app:
        yield


WORKLOADS = ("single", "bulk", "e2e", "drain", "memory")


async def main(quick: bool, workloads: Sequence[str], concurrency: Sequence[int]) -> None:
    scale = 10 if quick else 1
    with redis_server() as url:
        app.use_broker(url)
        if "single" in workloads:
            async with fresh(url):
                rate = await single_enqueue(10_000 // scale)
            print(f"single enqueue   {rate:10,.0f} jobs/s  (32 producers)", flush=True)
        if "bulk" in workloads:
            async with fresh(url):
                rate, p99 = await bulk_enqueue(10_000 // scale)
            print(
                f"bulk enqueue     {rate:10,.0f} jobs/s  (batches of 100; p99 {p99 * 1e3:.2f} ms)",
                flush=True,
            )
        if "e2e" in workloads:
            for c in concurrency:
                async with fresh(url):
                    rate, p50, p95, cost = await end_to_end(url, 20_000 // scale, c)
                print(
                    f"end-to-end C={c:<3} {rate:8,.0f} jobs/s  "
                    f"(p50 {p50 * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms; {cost})",
                    flush=True,
                )
        if "drain" in workloads:
            async with fresh(url):
                rate, cost = await drain(url, 20_000 // scale)
            print(f"drain C=16       {rate:10,.0f} jobs/s  ({cost})", flush=True)
        if "memory" in workloads:
            async with fresh(url):
                size = await bytes_per_waiting_job(url, 100_000 // scale)
            print(f"memory           {size:10,.0f} bytes per waiting job (100k waiting)")
        print(f"(one run; payload {len(msgspec.msgpack.encode(payload(0)))} bytes)")


def _names(value: str) -> list[str]:
    names = [w.strip() for w in value.split(",") if w.strip()]
    unknown = sorted(set(names) - set(WORKLOADS))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown workload {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}"
        )
    return names


def _numbers(value: str) -> list[int]:
    try:
        out = [int(c) for c in value.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {value!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"concurrency must be 1 or more: {value!r}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the jobs (smoke run)")
    parser.add_argument(
        "--workloads",
        type=_names,
        default=list(WORKLOADS),
        help=f"comma-separated, of {','.join(WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--concurrency",
        type=_numbers,
        default=[1, 4, 16, 64],
        help="end-to-end worker concurrencies, comma-separated (default: 1,4,16,64)",
    )
    args = parser.parse_args()
    anyio.run(main, args.quick, args.workloads, args.concurrency)
