"""typedq on Redis: what rate and concurrency limits cost, and how exact a rate limit is.

Run: ``.venv/bin/python -m bench.limits_bench [--quick] [--rounds N]``. Prints:

- drain throughput (20,000 pre-filled no-op jobs, one worker process at concurrency 16)
  with no limit, with a rate limit that never binds (``RateLimit(1_000_000, per=1.0)``),
  with a concurrency limit that never binds (``ConcurrencyLimit(10_000)``) and with
  both; runs interleaved, median of ``--rounds`` (default 3);
- the broker alone: claim-and-complete cycles of 16 jobs in this process, 20,000 jobs,
  with and without those limits (no worker runtime, so less noise), and the CPU time
  redis-server spent per job (``INFO cpu``; steadier than wall time on a busy machine);
- rate-limit accuracy: ``RateLimit(50, per=1.0)`` across two worker processes over 250
  jobs; the worst one-second window of the start times Redis recorded (its own clock),
  and the rate achieved between the first and the last start.

The worker processes run this module's ``app`` (``python -m typedq worker
bench.limits_bench:app``); ``$LIMITS_BENCH_MODE`` picks the limits its one task declares.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

import anyio
import msgspec
import redis.asyncio as aioredis

from bench.redis_bench import ROOT, flush, redis_server
from typedq import App, ConcurrencyLimit, JobState, RateLimit, Retention
from typedq.broker.base import Completion, JobRecord
from typedq.limits import LimitSpec

app = App("limitsbench", lease=30.0, retention=Retention(completed_max=1_000_000))

MODE = os.environ.get("LIMITS_BENCH_MODE", "none")
RATE: RateLimit[object] | None = {
    "rate": RateLimit(1_000_000, per=1.0),
    "both": RateLimit(1_000_000, per=1.0),
    "paced": RateLimit(50, per=1.0),
}.get(MODE)
CONCURRENCY: ConcurrencyLimit[object] | None = (
    ConcurrencyLimit(10_000) if MODE in ("concurrency", "both") else None
)


class Payload(msgspec.Struct, frozen=True):
    """About 100 bytes encoded, like the other benchmarks' payload."""

    n: int
    customer: str = "customer-0000000001"
    note: str = "x" * 60


@app.task(rate_limit=RATE, concurrency=CONCURRENCY)
async def work(item: Payload) -> None:
    """A no-op: what is measured is the queue."""


def worker(url: str, mode: str, concurrency: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LIMITS_BENCH_MODE": mode}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "typedq", "--log-level", "WARNING", "worker"),
            *("bench.limits_bench:app", "--concurrency", str(concurrency), "--broker", url),
        ],
        env=env,
        cwd=ROOT,
    )


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


async def wait_done(total: int) -> None:
    while (await app.broker.counts("default"))[JobState.COMPLETED] < total:  # noqa: ASYNC110
        await anyio.sleep(0.02)


async def records(ids: Sequence[str]) -> list[JobRecord]:
    out: list[JobRecord] = []
    for i in range(0, len(ids), 1000):
        out += [r for r in await app.broker.get(ids[i : i + 1000]) if r is not None]
    return out


async def drain(url: str, mode: str, total: int) -> float:
    await flush(url)
    async with app:
        jobs = await work.enqueue_many(Payload(i) for i in range(total))
        procs = [worker(url, mode, 16)]
        try:
            await wait_done(total)
        finally:
            stop(procs)
        done = await records([j.id for j in jobs])
    return len(done) / (max(r.finished_at for r in done) - min(r.started_at for r in done))


def worst_window(starts_us: Sequence[int], window_us: int) -> int:
    starts = sorted(starts_us)
    worst, lo = 0, 0
    for hi, t in enumerate(starts):
        while starts[lo] <= t - window_us:
            lo += 1
        worst = max(worst, hi - lo + 1)
    return worst


async def accuracy(url: str, total: int) -> tuple[int, float, dict[str, int]]:
    await flush(url)
    async with app:
        procs = [worker(url, "paced", 16) for _ in range(2)]
        try:
            await anyio.sleep(1.0)  # both processes up and claiming before the jobs come
            jobs = await work.enqueue_many(Payload(i) for i in range(total))
            await wait_done(total)
        finally:
            stop(procs)
        done = await records([j.id for j in jobs])
    starts = sorted(round(r.started_at * 1_000_000) for r in done)
    per_process: dict[str, int] = {}
    for r in done:
        pid = (r.worker_id or "?").split(".")[-2]
        per_process[pid] = per_process.get(pid, 0) + 1
    rate = (len(starts) - 1) / ((starts[-1] - starts[0]) / 1_000_000)
    return worst_window(starts, 1_000_000), rate, per_process


async def redis_cpu(url: str) -> float:
    """Seconds of CPU redis-server has used (user + system, main thread and children)."""
    client = aioredis.Redis.from_url(url)
    try:
        info = await client.info("cpu")
    finally:
        await client.aclose()
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def cycles(url: str, mode: str, total: int) -> tuple[float, float]:
    """Jobs/s of a bare claim/complete loop (batches of 16) on the broker, and
    redis-server CPU microseconds per job."""
    await flush(url)
    limited = App("limitsbench", lease=30.0, retention=Retention(completed_max=1_000_000))
    limited.use_broker(url)
    async with limited:
        broker = limited.broker
        spec = LimitSpec.of(
            RateLimit(1_000_000, per=1.0) if mode in ("rate", "both") else None,
            ConcurrencyLimit(10_000) if mode in ("concurrency", "both") else None,
        )
        if spec is not None:
            broker.set_limits({"work": spec})
        for i in range(0, total, 1000):
            await broker.enqueue([work.message(Payload(n)) for n in range(i, i + 1000)])
        done = 0
        cpu = await redis_cpu(url)
        started = time.perf_counter()
        claimed = await broker.claim(["default"], 16, worker_id="bench", lease=30)
        while claimed:
            done += len(claimed)
            finished = [Completion(c.message.id, c.token, b"") for c in claimed]
            _, claimed = await broker.complete_and_claim(
                finished, ["default"], 16, worker_id="bench", lease=30
            )
        elapsed = time.perf_counter() - started
        cpu = await redis_cpu(url) - cpu
    assert done == total, (done, total)
    return total / elapsed, cpu / total * 1e6


def modes() -> Iterator[str]:
    yield from ("none", "rate", "concurrency", "both")


async def main(quick: bool, rounds: int, parts: set[str]) -> None:
    total = 2_000 if quick else 20_000
    with redis_server() as url:
        app.use_broker(url)
        if "drain" in parts:
            await drains(url, total, rounds)
        if "broker" in parts:
            await broker_cycles(url, total, rounds)
        if "accuracy" in parts:
            worst, rate, per_process = await accuracy(url, 250)
            print(
                f"RateLimit(50, per=1.0), 2 processes, 250 jobs: worst 1-second window "
                f"{worst} starts (limit 50); {rate:.1f} starts/s first to last; "
                f"per process {per_process}"
            )


async def drains(url: str, total: int, rounds: int) -> None:
    results: dict[str, list[float]] = {m: [] for m in modes()}
    for _ in range(rounds):
        for mode in modes():
            results[mode].append(await drain(url, mode, total))
    base = statistics.median(results["none"])
    for mode, rates in results.items():
        median = statistics.median(rates)
        print(
            f"drain {total:,} C=16  {mode:<12} {median:9,.0f} jobs/s "
            f"({median / base:6.1%} of no limit; runs: {', '.join(f'{r:,.0f}' for r in rates)})",
            flush=True,
        )


async def broker_cycles(url: str, total: int, rounds: int) -> None:
    cycle: dict[str, list[tuple[float, float]]] = {m: [] for m in modes()}
    for _ in range(rounds):
        for mode in modes():
            cycle[mode].append(await cycles(url, mode, total))
    base = statistics.median(r for r, _ in cycle["none"])
    base_cpu = statistics.median(c for _, c in cycle["none"])
    for mode, runs in cycle.items():
        median = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(
            f"broker claim+complete x16 {mode:<12} {median:9,.0f} jobs/s ({median / base:6.1%}); "
            f"redis CPU {cpu:5.1f} us/job ({cpu / base_cpu:6.1%}); "
            f"runs: {', '.join(f'{r:,.0f}' for r, _ in runs)}",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 jobs per drain")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--parts", default="drain,broker,accuracy", help="comma-separated: drain,broker,accuracy"
    )
    args = parser.parse_args()
    anyio.run(main, args.quick, args.rounds, set(args.parts.split(",")))
