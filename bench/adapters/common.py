"""The workload driver shared by every adapter (standard library only: it runs in every venv).

An adapter module defines a class with the methods below and calls :func:`main` with it.
``python -m bench.adapters.<system> '<json params>'`` then runs one workload and prints one
JSON line. The Redis URL comes from ``$BENCH_REDIS_URL`` (the runner sets it), so module-level
objects that the peers' own worker CLIs import (a Celery app, a taskiq broker, ...) see it too.

Worker processes are the peers' own (their CLI where they have one); their handler calls
:func:`hit` with the payload's enqueue timestamp. The first payload a worker sees is a warm-up
(``customer_id == -1``): it marks the worker as ready and is not counted. Once the worker has
run ``$BENCH_N`` counted jobs it writes a summary to ``$BENCH_OUT`` (atomically) and the driver
stops it with SIGTERM.

Workflow workloads (``chain``, ``fanin``) use each system's native workflow API: the adapter
enqueues one whole flow per call (:meth:`Adapter.enqueue_chain`, :meth:`Adapter.enqueue_fanin`),
and its handlers call :func:`link_done`, :func:`member_finished` and :func:`callback_started`,
which count tasks and flows in the worker process (:class:`FlowRecorder`). Each finished flow is
also reported to the driver over a loopback UDP datagram (``$BENCH_NOTIFY``), which keeps at
most ``window`` flows in flight, so latencies measure hand-offs, not an unbounded backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
# The PostgreSQL peers' runs (bench/pg_peers.py) set this and no Redis: a fresh database of
# the local PostgreSQL service per run. Their runs read no Redis CPU.
PG_URL = os.environ.get("BENCH_PG_URL", "")
ROOT = Path(__file__).resolve().parents[2]  # the repository root, cwd of worker processes
WARMUP_ID = -1
# customer_id, invoice_id, the enqueue timestamp and a note: 100 bytes as compact JSON.
NOTE = "x" * 25


def payload_dict(i: int, t: float) -> dict[str, Any]:
    """The 100-byte JSON-like payload every system carries (``t``: enqueue time, epoch s)."""
    return {"customer_id": i, "invoice_id": 1_000_000 + i, "t": t, "note": NOTE}


# -- the worker side ------------------------------------------------------------------------


class Recorder:
    """Counts handler finishes in a worker process and reports when ``$BENCH_N`` were seen."""

    def __init__(self) -> None:
        self.n = int(os.environ.get("BENCH_N", "0"))
        self.out = os.environ.get("BENCH_OUT", "")
        self.latencies: list[float] = []
        self.first = 0.0
        self.last = 0.0
        self.lock = threading.Lock()  # Celery runs handlers in threads
        self.reported = False

    def hit(self, customer_id: int, t_enqueued: float) -> None:
        now = time.time()
        if customer_id == WARMUP_ID:
            _write_atomic(self.out + ".ready", "{}")
            return
        with self.lock:
            if self.reported:
                return
            if not self.latencies:
                self.first = now
            self.latencies.append(now - t_enqueued)
            self.last = now
            if len(self.latencies) >= self.n > 0:
                self.reported = True
                lat = sorted(self.latencies)
                _write_atomic(
                    self.out,
                    json.dumps(
                        {
                            "count": len(lat),
                            "first": self.first,
                            "last": self.last,
                            "p50": _pct(lat, 50),
                            "p95": _pct(lat, 95),
                            "p99": _pct(lat, 99),
                            "p999": _pct(lat, 99.9),
                            "max": lat[-1],
                        }
                    ),
                )


def _write_atomic(path: str, text: str) -> None:
    if not path:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


def _read_json(path: str) -> dict[str, Any] | None:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    result: dict[str, Any] = json.loads(text)
    return result


def _pct(sorted_values: Sequence[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * len(sorted_values) + 0.5) - 1))
    return sorted_values[k]


RECORDER = Recorder()


def hit(customer_id: int, t_enqueued: float) -> None:
    """Called by every adapter's no-op handler at its end."""
    RECORDER.hit(customer_id, t_enqueued)


class FlowRecorder:
    """Counts workflow tasks and finished flows in a worker process.

    ``$BENCH_N`` flows are expected; when the last one finishes the summary goes to
    ``$BENCH_OUT`` (atomically). Every finished flow sends the cumulative count of finished
    flows to ``$BENCH_NOTIFY`` (``host:port``, UDP): a lost datagram is made good by the next.
    """

    def __init__(self) -> None:
        self.n = int(os.environ.get("BENCH_N", "0"))
        self.out = os.environ.get("BENCH_OUT", "")
        notify = os.environ.get("BENCH_NOTIFY", "")
        self.notify: tuple[str, int] | None = None
        self.sock: socket.socket | None = None
        if notify:
            host, _, port = notify.rpartition(":")
            self.notify = (host, int(port))
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.tasks = 0
        self.flows = 0
        self.latencies: list[float] = []  # chain: enqueue -> last link; fanin: last member -> cb
        self.totals: list[float] = []  # fanin: enqueue -> callback start
        self.first = 0.0
        self.last = 0.0
        self.lock = threading.Lock()  # Celery runs handlers in threads
        self.reported = False

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def task(self, now: float) -> None:
        with self.lock:
            if not self.tasks:
                self.first = now
            self.tasks += 1
            self.last = max(self.last, now)

    def flow(self, now: float, latency: float, total: float | None = None) -> None:
        with self.lock:
            if not self.tasks:
                self.first = now
            self.tasks += 1
            self.last = max(self.last, now)
            self.flows += 1
            self.latencies.append(latency)
            if total is not None:
                self.totals.append(total)
            flows = self.flows
            if self.sock is not None and self.notify is not None:
                with contextlib.suppress(OSError):
                    self.sock.sendto(str(flows).encode(), self.notify)
            if self.reported or flows < self.n or self.n <= 0:
                return
            self.reported = True
            lat = sorted(self.latencies)
            tot = sorted(self.totals)
            summary = {
                "count": flows,
                "tasks": self.tasks,
                "first": self.first,
                "last": self.last,
                "p50": _pct(lat, 50),
                "p95": _pct(lat, 95),
                "p99": _pct(lat, 99),
            }
            if tot:
                summary.update(total_p50=_pct(tot, 50), total_p95=_pct(tot, 95))
            _write_atomic(self.out, json.dumps(summary))


FLOWS = FlowRecorder()


def link_done(k: int, links: int, t_enqueued: float) -> None:
    """Called by a chain link at its end: ``k`` is its 0-based position in a chain of ``links``.

    The last link finishes its chain: latency = now - the chain's enqueue time.
    """
    now = time.time()
    if k >= links - 1:
        FLOWS.flow(now, now - t_enqueued)
    else:
        FLOWS.task(now)


def member_finished() -> float:
    """Called by a fan-out member at its end; returns its finish time, which the member passes
    on in its result so that the callback can tell when the last member finished."""
    now = time.time()
    FLOWS.task(now)
    return now


def callback_started(
    t_enqueued: float, member_finishes: Sequence[float], started: float | None = None
) -> None:
    """Called by a fan-in callback with the finish times its members returned: latency = the
    callback's start - the last member's finish. A callback that must first fetch its members'
    results from its broker takes ``started = time.time()`` as its first statement and passes it.
    """
    now = time.time() if started is None else started
    last_member = max(member_finishes) if member_finishes else now
    FLOWS.flow(now, now - last_member, now - t_enqueued)


# -- the producer side ------------------------------------------------------------------------


class Adapter(Protocol):
    """What each system implements (async; a sync library runs its calls in a thread pool)."""

    name: str
    version: str
    bulk_api: str  # how enqueue_batch is done, e.g. "Queue.addBulk" or "gather (no bulk API)"
    notes: str  # configuration worth knowing when reading the numbers

    async def connect(self) -> None: ...
    async def close(self) -> None: ...
    def make(self, i: int, t: float) -> Any: ...
    async def enqueue(self, payload: Any) -> None: ...
    async def enqueue_batch(self, payloads: list[Any]) -> None: ...
    def worker_argv(self, concurrency: int) -> list[str] | None:
        """The worker process command, or None to run the worker in process (memory://)."""
        ...

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None: ...


class FlowAdapter(Adapter, Protocol):
    """A system with a native workflow API (the ``chain`` and ``fanin`` workloads).

    ``flow_api`` says, per workload, which API is used, or starts with ``"n/a"`` and gives the
    reason the system has none (then the enqueue method is never called).
    """

    flow_api: dict[str, str]

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        """Enqueue chain ``i`` of ``links`` links (enqueue time ``t``) as one native flow."""
        ...

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        """Enqueue fan-out ``i`` of ``members`` members with its fan-in callback."""
        ...


def _redis_info(url: str, section: str) -> dict[str, str]:
    """One INFO section over a raw socket (no client library needed)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379), 10) as s:
        s.sendall(f"INFO {section}\r\n".encode())
        data = b""
        while b"\r\n" not in data:
            data += s.recv(65536)
        header, _, rest = data.partition(b"\r\n")
        size = int(header[1:])
        while len(rest) < size + 2:
            rest += s.recv(65536)
    return dict(line.split(":", 1) for line in rest.decode().splitlines() if ":" in line)


def _redis_info_memory(url: str) -> int:
    """``used_memory`` from INFO."""
    return int(_redis_info(url, "memory")["used_memory"])


# -- CPU accounting: what a run cost the producer, the worker process(es) and Redis ----------


def _tree_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and its live descendants (Linux /proc):
    some workers run their handlers in child processes (taskiq, the typedq supervisor)."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = text.rsplit(")", 1)[1].split()  # after "pid (comm)"
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total = 0.0
    for p in cpu:
        q = p
        while q > 1:
            if q == pid:
                total += cpu[p]
                break
            q = parent.get(q, 0)
    return total


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _redis_cpu() -> float:
    info = _redis_info(REDIS_URL, "cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


class CpuMeter:
    """CPU seconds spent between :meth:`start` and :meth:`stop` by the producer (this process),
    the worker process tree and redis-server; per job in ms per 1,000 jobs."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.begin: tuple[float, float | None, float] = (0.0, None, 0.0)

    def _sample(self) -> tuple[float, float | None, float]:
        proc = self.worker.proc
        worker = _tree_cpu(proc.pid) if proc is not None else None
        return _self_cpu(), worker, 0.0 if PG_URL else _redis_cpu()

    def start(self) -> None:
        self.begin = self._sample()

    def stop(self, jobs: int) -> dict[str, float]:
        end = self._sample()
        per_1k = 1000.0 * 1000.0 / jobs  # seconds -> ms, per 1,000 jobs
        out = {"producer_cpu_ms_per_1k": (end[0] - self.begin[0]) * per_1k}
        if not PG_URL:
            out["redis_cpu_ms_per_1k"] = (end[2] - self.begin[2]) * per_1k
        if end[1] is not None and self.begin[1] is not None:
            out["worker_cpu_ms_per_1k"] = (end[1] - self.begin[1]) * per_1k
        return out


async def _timed(coro: Awaitable[None]) -> float:
    started = time.perf_counter()
    await coro
    return time.perf_counter() - started


async def w_single(a: Adapter, n: int, producers: int) -> dict[str, Any]:
    """n single enqueues from `producers` coroutines, each awaiting one enqueue at a time."""
    lat: list[float] = []
    counter = iter(range(n))

    async def producer() -> None:
        for i in counter:
            t0 = time.perf_counter()
            await a.enqueue(a.make(i, time.time()))
            lat.append(time.perf_counter() - t0)

    started = time.perf_counter()
    await asyncio.gather(*(producer() for _ in range(producers)))
    elapsed = time.perf_counter() - started
    lat.sort()
    return {
        "jobs_per_s": n / elapsed,
        "elapsed_s": elapsed,
        "p50_ms": _pct(lat, 50) * 1000,
        "p99_ms": _pct(lat, 99) * 1000,
    }


async def w_bulk(a: Adapter, n: int, batch: int) -> dict[str, Any]:
    """n jobs as n/batch consecutive bulk calls; per-batch latency percentiles."""
    lat: list[float] = []
    started = time.perf_counter()
    for start in range(0, n, batch):
        now = time.time()
        payloads = [a.make(i, now) for i in range(start, min(n, start + batch))]
        lat.append(await _timed(a.enqueue_batch(payloads)))
    elapsed = time.perf_counter() - started
    lat.sort()
    return {
        "jobs_per_s": n / elapsed,
        "elapsed_s": elapsed,
        "batch_p50_ms": _pct(lat, 50) * 1000,
        "batch_p99_ms": _pct(lat, 99) * 1000,
    }


async def prefill(a: Adapter, n: int, chunk: int = 1000) -> None:
    """Fill the queue fast (not timed): bulk path in chunks, two chunks in flight."""
    sem = asyncio.Semaphore(2)

    async def one(start: int) -> None:
        async with sem:
            now = time.time()
            await a.enqueue_batch([a.make(i, now) for i in range(start, min(n, start + chunk))])

    await asyncio.gather(*(one(s) for s in range(0, n, chunk)))


class WorkerProcess:
    """The system's worker in its own process (or in this one, for memory://)."""

    def __init__(self, a: Adapter, n: int, concurrency: int) -> None:
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="bench-")
        self.out = os.path.join(self.dir, "result.json")
        self.n = n
        self.concurrency = concurrency
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = os.path.join(self.dir, "worker.log")
        self.task: asyncio.Task[None] | None = None
        self.stop_event = asyncio.Event()

    def start(self) -> None:
        os.environ["BENCH_N"] = str(self.n)
        os.environ["BENCH_OUT"] = self.out
        argv = self.a.worker_argv(self.concurrency)
        if argv is None:  # in-process worker: the recorder of this process counts
            RECORDER.__init__()  # type: ignore[misc]
            FLOWS.__init__()  # type: ignore[misc]
            self.task = asyncio.ensure_future(
                self.a.run_worker_in_process(self.concurrency, self.stop_event)
            )
            return
        # e.g. BENCH_WORKER_PREFIX="py-spy record -o /tmp/w.svg --" to profile the worker
        argv = os.environ.get("BENCH_WORKER_PREFIX", "").split() + argv
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT
            )

    async def wait_file(self, path: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (result := _read_json(path)) is None:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"worker exited with {self.proc.returncode}: {self.tail()}")
            if self.task is not None and self.task.done():
                self.task.result()
                raise RuntimeError("in-process worker stopped early")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {os.path.basename(path)} in {timeout}s: {self.tail()}")
            await asyncio.sleep(0.005)
        return result

    async def ready(self, timeout: float = 60) -> None:
        await self.a.enqueue(self.a.make(WARMUP_ID, time.time()))
        await self.wait_file(self.out + ".ready", timeout)

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log).read_text()[-3000:]
        return ""

    async def stop(self) -> None:
        if self.task is not None:
            self.stop_event.set()
            await asyncio.wait_for(self.task, 30)
        if self.proc is not None and self.proc.poll() is None:
            # py-spy (BENCH_WORKER_PREFIX) writes its profile on SIGINT, not on SIGTERM
            profiled = bool(os.environ.get("BENCH_WORKER_PREFIX"))
            self.proc.send_signal(signal.SIGINT if profiled else signal.SIGTERM)
            for _ in range(200):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            else:
                self.proc.kill()
                self.proc.wait()


async def w_e2e(
    a: Adapter, n: int, producers: int, concurrency: int, min_rate: float = 50.0
) -> dict[str, Any]:
    """n jobs from `producers` single-enqueue loops while the worker runs at `concurrency`;
    a worker slower than `min_rate` jobs/s (after 120 s) fails the run."""
    worker = WorkerProcess(a, n, concurrency)
    worker.start()
    try:
        await worker.ready()
        counter = iter(range(n))

        async def producer() -> None:
            for i in counter:
                await a.enqueue(a.make(i, time.time()))

        meter = CpuMeter(worker)
        meter.start()
        started = time.time()
        await asyncio.gather(*(producer() for _ in range(producers)))
        enqueued = time.time() - started
        res = await worker.wait_file(worker.out, timeout=max(120.0, n / min_rate))
        cpu = meter.stop(n)
    finally:
        await worker.stop()
    elapsed = res["last"] - started
    return {
        "jobs_per_s": n / elapsed,
        "elapsed_s": elapsed,
        "enqueue_s": enqueued,
        "p50_ms": res["p50"] * 1000,
        "p95_ms": res["p95"] * 1000,
        "p99_ms": res["p99"] * 1000,
        **cpu,
    }


async def w_latency(a: Adapter, n: int, rate: float, concurrency: int) -> dict[str, Any]:
    """Open loop: job i is due at ``start + i / rate`` by the clock, whatever the previous
    enqueues are doing (each is sent as its own task), and its latency counts from that
    intended time, so a slow enqueue cannot hide its own delay (no coordinated omission).
    Latency = intended send -> the no-op handler's end (for a no-op handler, the pickup).
    A send more than 1 ms behind its time is counted as late; a job that never finishes fails
    the run (the worker reports only once all ``n`` finished)."""
    worker = WorkerProcess(a, n, concurrency)
    worker.start()
    late = 0
    try:
        await worker.ready()
        meter = CpuMeter(worker)
        meter.start()
        sends: set[asyncio.Task[None]] = set()
        errors: list[BaseException] = []

        def sent(task: asyncio.Task[None]) -> None:
            sends.discard(task)
            exc = None if task.cancelled() else task.exception()
            if exc is not None:
                errors.append(exc)

        start_clock = time.perf_counter() + 0.05
        start_epoch = time.time() + 0.05
        for i in range(n):
            due = start_clock + i / rate
            wait = due - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            elif wait < -0.001:
                late += 1
            task = asyncio.ensure_future(a.enqueue(a.make(i, start_epoch + i / rate)))
            sends.add(task)
            task.add_done_callback(sent)
        if sends:
            await asyncio.gather(*sends, return_exceptions=True)
        if errors:
            raise errors[0]
        # A worker slower than the offered rate drains a backlog after the last send; allow
        # down to 50 jobs/s, as the other workloads do (RQ's one-at-a-time worker needs it).
        res = await worker.wait_file(worker.out, timeout=max(60.0, 2 * n / rate, n / 50))
        cpu = meter.stop(n)
    finally:
        await worker.stop()
    return {
        "offered_per_s": rate,
        "jobs": n,
        "late_sends": late,
        "p50_ms": res["p50"] * 1000,
        "p99_ms": res["p99"] * 1000,
        "p999_ms": res["p999"] * 1000,
        "max_ms": res["max"] * 1000,
        **cpu,
    }


async def w_drain(a: Adapter, n: int, concurrency: int) -> dict[str, Any]:
    """n pre-filled jobs; the clock runs from the first handler finish to the last."""
    await prefill(a, n)
    worker = WorkerProcess(a, n, concurrency)
    worker.start()
    try:
        res = await worker.wait_file(worker.out, timeout=max(120.0, n / 50))
    finally:
        await worker.stop()
    elapsed = res["last"] - res["first"]
    return {"jobs_per_s": (n - 1) / elapsed, "elapsed_s": elapsed}


async def w_memory(a: Adapter, n: int) -> dict[str, Any]:
    """Redis used_memory delta per waiting job after n enqueues (bulk path, no worker)."""
    if not REDIS_URL.startswith(("redis://", "rediss://")):
        raise RuntimeError("the memory workload needs Redis")
    await a.enqueue(a.make(0, time.time()))  # creates the queue's keys and loads scripts
    before = _redis_info_memory(REDIS_URL)
    started = time.perf_counter()
    await prefill(a, n)
    fill_s = time.perf_counter() - started
    after = _redis_info_memory(REDIS_URL)
    return {
        "bytes_per_job": (after - before) / n,
        "used_memory_before": before,
        "used_memory_after": after,
        "fill_s": fill_s,
    }


async def w_history(a: Adapter, n: int, concurrency: int, history: int) -> dict[str, Any]:
    """The claim under history (PostgreSQL peers): ``history`` finished jobs written straight
    into the system's own tables (the adapter's ``fill_history``, untimed, then VACUUM
    ANALYZE as autovacuum would have done by then), then the drain of ``n`` jobs."""
    fixture = "none"
    fill_s = 0.0
    if history:
        started = time.perf_counter()
        fixture = await a.fill_history(history)  # type: ignore[attr-defined]
        fill_s = time.perf_counter() - started
        # The whole database: every system's tables alike, whatever they are named.
        vacuum = await asyncio.create_subprocess_exec("psql", PG_URL, "-qc", "VACUUM ANALYZE")
        if await vacuum.wait() != 0:
            raise RuntimeError("VACUUM ANALYZE failed")
    out = await w_drain(a, n, concurrency)
    out.update(history=history, fill_s=fill_s, fixture=fixture, ms_per_job=1000 / out["jobs_per_s"])
    return out


class _FlowFeedback(asyncio.DatagramProtocol):
    """Receives the worker's cumulative count of finished flows; frees that many window slots."""

    def __init__(self, window: asyncio.Semaphore) -> None:
        self.window = window
        self.done = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        with contextlib.suppress(ValueError):
            count = int(data)
            while self.done < count:
                self.done += 1
                self.window.release()


FLOW_TASKS = {"chain": lambda size: size, "fanin": lambda size: size + 1}


async def w_flow(
    a: FlowAdapter,
    workload: str,
    n: int,
    size: int,
    concurrency: int,
    producers: int,
    window: int,
) -> dict[str, Any]:
    """n flows (chains of `size` links, or fan-outs of `size` members with a callback) from
    `producers` loops, each awaiting one flow enqueue at a time, with at most `window` flows
    unfinished; the worker runs at `concurrency`. The clock runs from the first enqueue to the
    last task's finish."""
    enqueue = a.enqueue_chain if workload == "chain" else a.enqueue_fanin
    slots = asyncio.Semaphore(window)
    loop = asyncio.get_running_loop()
    transport, feedback = await loop.create_datagram_endpoint(
        lambda: _FlowFeedback(slots), local_addr=("127.0.0.1", 0)
    )
    host, port = transport.get_extra_info("sockname")[:2]
    os.environ["BENCH_NOTIFY"] = f"{host}:{port}"
    os.environ["BENCH_FLOWS"] = workload
    worker = WorkerProcess(a, n, concurrency)
    worker.start()
    try:
        await worker.ready()
        counter = iter(range(n))

        async def producer() -> None:
            for i in counter:
                await slots.acquire()
                await enqueue(i, time.time(), size)

        started = time.time()
        await asyncio.gather(*(producer() for _ in range(producers)))
        enqueued = time.time() - started
        res = await worker.wait_file(worker.out, timeout=max(120.0, n * size / 50))
    finally:
        transport.close()
        await worker.stop()
    elapsed = res["last"] - started
    tasks = n * FLOW_TASKS[workload](size)
    out = {
        "tasks_per_s": tasks / elapsed,
        "flows_per_s": n / elapsed,
        "elapsed_s": elapsed,
        "enqueue_s": enqueued,
        "tasks": tasks,
        "tasks_counted": res["tasks"],
        "window": window,
        "p50_ms": res["p50"] * 1000,
        "p95_ms": res["p95"] * 1000,
        "p99_ms": res["p99"] * 1000,
    }
    if "total_p50" in res:
        out.update(total_p50_ms=res["total_p50"] * 1000, total_p95_ms=res["total_p95"] * 1000)
    del feedback
    return out


async def _run(a: Adapter, params: dict[str, Any]) -> dict[str, Any]:
    workload = params["workload"]
    n = int(params["n"])
    runs: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "single": lambda: w_single(a, n, int(params.get("producers", 32))),
        "bulk": lambda: w_bulk(a, n, int(params.get("batch", 100))),
        "e2e": lambda: w_e2e(
            a,
            n,
            int(params.get("producers", 4)),
            int(params["concurrency"]),
            float(params.get("min_rate", 50)),
        ),
        "drain": lambda: w_drain(a, n, int(params.get("concurrency", 16))),
        "latency": lambda: w_latency(
            a, n, float(params.get("rate", 1000)), int(params.get("concurrency", 16))
        ),
        "memory": lambda: w_memory(a, n),
        "history": lambda: w_history(
            a, n, int(params.get("concurrency", 16)), int(params.get("history", 0))
        ),
        "chain": lambda: _flow(a, params),
        "fanin": lambda: _flow(a, params),
    }
    await a.connect()
    try:
        result = await runs[workload]()
    finally:
        await a.close()
    return result


def _flow(a: Adapter, params: dict[str, Any]) -> Awaitable[dict[str, Any]]:
    return w_flow(
        a,  # type: ignore[arg-type]  # main() checked flow_api
        params["workload"],
        int(params["n"]),
        int(params["size"]),
        int(params.get("concurrency", 16)),
        int(params.get("producers", 4)),
        int(params.get("window", 32)),
    )


def flow_api(a: Adapter, workload: str) -> str:
    """What the adapter uses for a workflow workload, or ``n/a: reason``."""
    apis: dict[str, str] = getattr(a, "flow_api", {})
    return apis.get(workload, "n/a: the adapter does not implement it")


def main(a: Adapter, argv: Sequence[str] | None = None) -> None:
    """Run one workload (JSON params in argv[1]) and print one JSON line."""
    args = list(sys.argv[1:] if argv is None else argv)
    params: dict[str, Any] = json.loads(args[0])
    out: dict[str, Any] = {
        "system": a.name,
        "version": a.version,
        "bulk_api": a.bulk_api,
        "notes": a.notes,
        "params": params,
    }
    if params["workload"] in FLOW_TASKS:
        out["flow_api"] = flow_api(a, params["workload"])
        if out["flow_api"].startswith("n/a"):
            out["unsupported"] = out["flow_api"]
            print(json.dumps(out), flush=True)
            return
    try:
        out["result"] = asyncio.run(_run(a, params))
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:4000]
    print(json.dumps(out), flush=True)
