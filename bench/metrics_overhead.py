"""What metrics cost: end-to-end throughput at concurrency 16 with and without
``--metrics-port``, runs interleaved (off, on, off, on, ...), median of each.

Run: ``.venv/bin/python -m bench.metrics_overhead [--rounds 3] [--total 20000]``.

The workload is bench/redis_bench.py's end-to-end one (4 producers of single enqueues,
a no-op async handler, one worker process). With metrics on, ``/metrics`` is scraped
every second during the run (Prometheus' default is every 15 s: this is the harsher
case; ``--scrape-every`` changes it, 0 never scrapes), so the cost includes the queue
gauges' broker round trip. Besides throughput it reports the worker process's CPU time
per job, which a loaded machine disturbs less.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread

from bench.redis_bench import ROOT, app, fresh, noop, payload, records, redis_server, wait_done


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def worker(url: str, concurrency: int, metrics: bool) -> Iterator[tuple[int | None, int]]:
    """A worker process; yields the metrics port (None without metrics) and its pid."""
    extra = ["--metrics-port", "0", "--metrics-addr", "127.0.0.1"] if metrics else []
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "typedq", "--log-level", "INFO", "worker"),
            *("bench.redis_bench:app", "--concurrency", str(concurrency), "--broker", url),
            *extra,
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    port = None
    for line in proc.stderr:
        if metrics and "serving metrics on" in line:
            match = re.search(r":(\d+)/metrics", line)
            assert match is not None
            port = int(match.group(1))
        if " started: " in line:
            break
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    drain.start()
    try:
        yield port, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def fetch(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body: bytes = r.read()
    return body


def scrape_every(seconds: float, port: int, stop: threading.Event, scrapes: list[int]) -> None:
    while not stop.wait(seconds):
        scrapes.append(len(fetch(port)))


async def one_run(
    url: str, total: int, concurrency: int, metrics: bool, scrape: float
) -> tuple[float, float]:
    """Throughput (jobs/s) and the worker process's CPU seconds per job."""
    ids: list[str] = []
    per = total // 4
    with worker(url, concurrency, metrics) as (port, pid):
        cpu_before = cpu_seconds(pid)
        stop = threading.Event()
        scrapes: list[int] = []
        scraper = None
        if port is not None and scrape > 0:
            scraper = threading.Thread(target=scrape_every, args=(scrape, port, stop, scrapes))
            scraper.start()

        async def produce(base: int) -> None:
            for i in range(base, base + per):
                ids.append((await noop.enqueue(payload(i))).id)

        try:
            async with anyio.create_task_group() as tg:
                for p in range(4):
                    tg.start_soon(produce, p * per)
            await wait_done(per * 4)
        finally:
            stop.set()
            if scraper is not None:
                scraper.join()
        # One scrape after the run: the series are there (a run shorter than the
        # interval is checked too).
        if port is not None and b"typedq_jobs_total" not in await anyio.to_thread.run_sync(
            fetch, port
        ):
            raise RuntimeError("the scrape has no typedq_jobs_total")
        cpu = cpu_seconds(pid) - cpu_before
    done = await records(ids)
    span = max(r.finished_at for r in done) - min(r.enqueued_at for r in done)
    return len(done) / span, cpu / len(done)


async def main(rounds: int, total: int, concurrency: int, scrape: float) -> None:
    rates: dict[bool, list[float]] = {False: [], True: []}
    cpus: dict[bool, list[float]] = {False: [], True: []}
    with redis_server() as url:
        app.use_broker(url)
        for r in range(rounds):
            for metrics in (False, True):
                async with fresh(url):
                    rate, cpu = await one_run(url, total, concurrency, metrics, scrape)
                rates[metrics].append(rate)
                cpus[metrics].append(cpu)
                label = "on " if metrics else "off"
                print(
                    f"round {r + 1} metrics {label} {rate:8,.0f} jobs/s, "
                    f"worker CPU {cpu * 1e6:6.1f} µs/job",
                    flush=True,
                )
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    cpu_off, cpu_on = statistics.median(cpus[False]), statistics.median(cpus[True])
    print(
        f"median of {rounds}: off {off:,.0f} jobs/s, on {on:,.0f} jobs/s, "
        f"throughput cost {100 * (off - on) / off:+.1f}%; worker CPU per job off "
        f"{cpu_off * 1e6:.1f} µs, on {cpu_on * 1e6:.1f} µs "
        f"({100 * (cpu_on - cpu_off) / cpu_off:+.1f}%) (C={concurrency}, {total} jobs)"
    )


def per_job_cost(jobs: int = 200_000) -> float:
    """Seconds of CPU the metrics observer adds per job (started + finished), measured
    in-process without a broker: the deterministic part of the cost, which end-to-end
    runs on a shared machine can hide in their noise."""
    from prometheus_client import CollectorRegistry

    from typedq.broker.base import ClaimedJob, JobMessage
    from typedq.metrics import Metrics
    from typedq.observe import JobOutcome

    metrics = Metrics(CollectorRegistry())
    claimed = [
        ClaimedJob(
            message=JobMessage(id=f"j{i}", task="noop", queue="default", payload=b""),
            token=str(i),
            attempt=1,
            enqueued_at=time.time(),
        )
        for i in range(1000)
    ]
    start = time.process_time()
    for i in range(jobs):
        job = claimed[i % 1000]
        metrics.job_started(job)
        metrics.job_finished(job, JobOutcome.COMPLETED, 0.001)
    return (time.process_time() - start) / jobs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="scrape /metrics this often during a run (0: never)",
    )
    parser.add_argument("--micro", action="store_true", help="only the in-process CPU cost per job")
    ns = parser.parse_args()
    cost = per_job_cost()
    print(f"metrics observer: {cost * 1e6:.2f} µs of CPU per job (in-process, no broker)")
    if not ns.micro:
        anyio.run(main, ns.rounds, ns.total, ns.concurrency, ns.scrape_every)
