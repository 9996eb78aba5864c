"""What tracing costs: end-to-end throughput and the worker's CPU per job at C=16 with
tracing off, on with no TracerProvider (no-op spans), on with the SDK recording every
span, and on with the SDK sampling one trace in ten (``ParentBased(TraceIdRatioBased
(0.1))``), runs interleaved (off, noop, sdk, sampled, off, ...), median of each.

Run: ``.venv/bin/python -m bench.tracing_overhead [--rounds 3] [--total 20000]``.

``--drain`` measures a drain instead, steadier on a shared machine: the producer
enqueues ``--total`` jobs one by one (each with a trace context of its own, traced in
the run's mode), then a worker process starts and drains them; its CPU per job from
its start-up line to the last completion. The modes there are the whole observability
configurations: ``off``, ``metrics`` (``--metrics-port``, scraped every second), and
metrics with the SDK sampling one trace in a hundred (``m+1/100``), one in ten
(``m+1/10``) or recording every span (``m+all``).

The workload is bench/redis_bench.py's end-to-end one (4 producers of single enqueues,
a no-op async handler, one worker process running bench/tracing_app.py). The producer
traces in the same mode as the worker, so process spans have a remote parent. Before
the runs it prints the in-process CPU per job of a process span (start + end) in each
mode: the deterministic part of the cost.
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
from collections.abc import Iterator

import anyio

from bench.metrics_overhead import cpu_seconds, scrape_every
from bench.redis_bench import ROOT, fresh, payload, records, redis_server, wait_done
from bench.tracing_app import app, configure, noop

MODES = ("off", "noop", "sdk", "sampled")


#: The drain's configurations: name -> (tracing mode, metrics on). ``ctx`` and ``sdk``
#: (not run by default) split ``m+1/100``'s cost: the producer traces (sampling one
#: in a hundred) but the worker does not (``ctx``: the context in the envelope), and
#: the SDK is installed in the worker but the app does not trace (``sdk``).
DRAIN_MODES = {
    "off": ("off", False),
    "metrics": ("off", True),
    "m+1/100": ("sampled:0.01", True),
    "m+1/10": ("sampled:0.1", True),
    "m+all": ("sdk", True),
}
DIAGNOSTIC_MODES = {"ctx": ("off", True), "sdk": ("installed", True)}
#: The producer's tracing in the diagnostic modes (otherwise the worker's).
PRODUCER_MODE = {"ctx": "sampled:0.01", "sdk": "off"}


@contextlib.contextmanager
def worker(url: str, concurrency: int, mode: str, metrics: bool = False) -> Iterator[int]:
    """A worker process tracing in ``mode`` (with ``/metrics`` scraped every second when
    ``metrics``); yields its pid once it has started."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "typedq", "--log-level", "INFO", "worker"),
            *("bench.tracing_app:app", "--concurrency", str(concurrency), "--broker", url),
            *(("--metrics-port", "0", "--metrics-addr", "127.0.0.1") if metrics else ()),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), "TYPEDQ_BENCH_TRACING": mode},
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    port = None
    for line in proc.stderr:
        if "serving metrics on" in line:
            match = re.search(r":(\d+)/metrics", line)
            assert match is not None
            port = int(match.group(1))
        if " started: " in line:
            break
    drain = threading.Thread(target=proc.stderr.read, daemon=True)
    drain.start()
    stop = threading.Event()
    if port is not None:
        scrapes: list[int] = []
        threading.Thread(target=scrape_every, args=(1.0, port, stop, scrapes), daemon=True).start()
    try:
        yield proc.pid
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def drain_run(url: str, total: int, concurrency: int, name: str) -> float:
    """Worker CPU seconds per job draining ``total`` jobs enqueued one by one before."""
    mode, metrics = {**DRAIN_MODES, **DIAGNOSTIC_MODES}[name]
    configure(PRODUCER_MODE.get(name, mode), install=False)  # the producer's

    async def produce(base: int, count: int) -> None:
        for i in range(base, base + count):
            await noop.enqueue(payload(i))

    per = total // 32
    async with anyio.create_task_group() as tg:
        for p in range(32):
            tg.start_soon(produce, p * per, per)
    with worker(url, concurrency, mode, metrics) as pid:
        cpu_before = cpu_seconds(pid)
        await wait_done(per * 32)
        cpu = cpu_seconds(pid) - cpu_before
    return cpu / (per * 32)


async def drain_main(rounds: int, total: int, concurrency: int, names: list[str]) -> None:
    cpus: dict[str, list[float]] = {n: [] for n in names}
    with redis_server() as url:
        app.use_broker(url)
        for r in range(rounds):
            for name in names:
                async with fresh(url):
                    cpu = await drain_run(url, total, concurrency, name)
                cpus[name].append(cpu)
                print(f"round {r + 1} {name:8} worker CPU {cpu * 1e6:6.1f} µs/job", flush=True)
    base = statistics.median(cpus[names[0]])
    for name in names:
        med = statistics.median(cpus[name])
        runs = ", ".join(f"{c * 1e6:.1f}" for c in cpus[name])
        print(
            f"median of {rounds}, {name:8}: worker CPU {med * 1e6:6.1f} µs/job "
            f"({100 * (med - base) / base:+5.1f}% vs {names[0]}; runs {runs}) "
            f"(drain of {total}, C={concurrency})"
        )


async def one_run(url: str, total: int, concurrency: int, mode: str) -> tuple[float, float]:
    """Throughput (jobs/s) and the worker process's CPU seconds per job."""
    ids: list[str] = []
    per = total // 4
    with worker(url, concurrency, mode) as pid:
        cpu_before = cpu_seconds(pid)

        async def produce(base: int) -> None:
            for i in range(base, base + per):
                ids.append((await noop.enqueue(payload(i))).id)

        async with anyio.create_task_group() as tg:
            for p in range(4):
                tg.start_soon(produce, p * per)
        await wait_done(per * 4)
        cpu = cpu_seconds(pid) - cpu_before
    done = await records(ids)
    span = max(r.finished_at for r in done) - min(r.enqueued_at for r in done)
    return len(done) / span, cpu / len(done)


async def main(rounds: int, total: int, concurrency: int) -> None:
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[float]] = {m: [] for m in MODES}
    with redis_server() as url:
        app.use_broker(url)
        for r in range(rounds):
            for mode in MODES:
                # The producer traces in the same mode (its own SDK provider, not the
                # global one), so the worker's process spans have a remote parent.
                configure(mode, install=False)
                async with fresh(url):
                    rate, cpu = await one_run(url, total, concurrency, mode)
                rates[mode].append(rate)
                cpus[mode].append(cpu)
                print(
                    f"round {r + 1} tracing {mode:4} {rate:8,.0f} jobs/s, "
                    f"worker CPU {cpu * 1e6:6.1f} µs/job",
                    flush=True,
                )
    off, cpu_off = statistics.median(rates["off"]), statistics.median(cpus["off"])
    for mode in MODES[1:]:
        on, cpu_on = statistics.median(rates[mode]), statistics.median(cpus[mode])
        print(
            f"median of {rounds}, {mode}: {on:,.0f} jobs/s vs off {off:,.0f} "
            f"({100 * (on - off) / off:+.1f}%); worker CPU per job {cpu_on * 1e6:.1f} µs vs "
            f"{cpu_off * 1e6:.1f} µs ({100 * (cpu_on - cpu_off) / cpu_off:+.1f}%) "
            f"(C={concurrency}, {total} jobs)"
        )


def per_job_cost(mode: str, jobs: int = 50_000) -> float:
    """CPU seconds of one process span (start, make current, end) in ``mode``,
    in-process, no broker; ``off`` is the worker's ``is None`` test. As when the producer
    traces in the same mode, each job carries a trace context of its own (single
    enqueues): sampled (``sdk``), one in ten sampled (``sampled``), none (``noop``: a
    producer without the SDK writes none)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    from typedq.broker.base import ClaimedJob, JobMessage
    from typedq.outcomes import Complete
    from typedq.tracing import Tracing

    tracing: Tracing | None = None
    if mode == "noop":
        tracing = Tracing()
    elif mode in ("sdk", "sampled"):
        sampler = ParentBased(TraceIdRatioBased(0.1)) if mode == "sampled" else None
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
        tracing = Tracing(provider)
    claimed = [
        ClaimedJob(
            message=JobMessage(
                id=f"j{i}",
                task="noop",
                queue="default",
                payload=b"",
                trace_context=""
                if mode == "noop"
                else f"traceparent=00-{i + 1:032x}-b7ad6b7169203331-"
                f"{'00' if mode == 'sampled' and i % 10 else '01'}",
            ),
            token="t",  # noqa: S106  # a lease token, not a password
            attempt=1,
            enqueued_at=time.time(),
        )
        for i in range(1000)
    ]
    outcome = Complete(b"\xc0")
    start = time.process_time()
    for i in range(jobs):
        job = claimed[i % 1000]
        traced = tracing.process(job) if tracing is not None else None
        if traced is not None:
            traced.end(outcome)
    return (time.process_time() - start) / jobs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--micro", action="store_true", help="only the in-process CPU per job")
    parser.add_argument("--drain", action="store_true", help="a pre-filled drain (see above)")
    parser.add_argument(
        "--modes", default=",".join(DRAIN_MODES), help="the drain's modes, comma-separated"
    )
    ns = parser.parse_args()
    if ns.drain:
        names = [n for n in ns.modes.split(",") if n]
        anyio.run(drain_main, ns.rounds, ns.total, ns.concurrency, names)
        sys.exit(0)
    for m in MODES:
        print(f"process span, {m:4}: {per_job_cost(m) * 1e6:6.2f} µs of CPU per job (in-process)")
    if not ns.micro:
        anyio.run(main, ns.rounds, ns.total, ns.concurrency)
