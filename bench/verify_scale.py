"""``typedq verify`` at scale (issue 28): a broker holding ``--jobs`` jobs of ``--tasks``
tasks (over ``--queues`` queues; ``--scheduled`` of them delayed, the rest waiting) and
``--rare`` jobs of an old fingerprint enqueued last, checked two ways:

- ``sample``: the scan of a broker that cannot count jobs itself
  (``typedq.verify.count_fingerprints``: ids paged, records read), ``--sample`` jobs;
- ``exact``: ``verify`` itself, whose job counts the broker makes (capability
  ``FingerprintCounts``: list.lua's walk counting every job where it is stored).

For each: how long it took, the jobs counted, how many of the rare jobs it found, and
what it cost Redis: the script calls it made, their mean time in the server (INFO
commandstats: wall time, which a loaded box stretches) and the server's main-thread CPU
time per call (INFO cpu), the commands over 1 ms and the longest one (SLOWLOG, reset
before each check, threshold 1 ms).

Run: ``.venv/bin/python -m bench.verify_scale [--jobs 1000000 --tasks 50 --queues 10]
[--page 500 1000] [--walks 1 4]`` (a fresh redis-server of its own; ~1-2 minutes to fill at 1,000,000
jobs). ``--callgrind --jobs 20000``: the same on a redis-server under callgrind, in
server instructions per call (load-independent).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Callable

import anyio
import msgspec
import redis

from bench.redis_server import redis_server
from bench.script_cost import callgrind_server
from typedq import App
from typedq import verify as verify_module
from typedq.broker.base import JobMessage
from typedq.names import new_job_id
from typedq.verify import count_fingerprints, verify

#: The fingerprint the rare jobs carry: an old release's, never recorded.
OLD = "0123456789abcdef"


class Order(msgspec.Struct):
    order_id: int
    customer: str


class Done(msgspec.Struct):
    ok: bool


def _slowest(port: int) -> tuple[int, int, str]:
    """(entries in the slow log, the longest one's µs, its command)."""
    client = redis.Redis(port=port)
    try:
        entries = client.slowlog_get(1000)
    finally:
        client.close()
    if not entries:
        return 0, 0, "-"
    worst = max(entries, key=lambda e: e["duration"])
    command = worst["command"]
    words = command.decode() if isinstance(command, bytes) else str(command)
    return len(entries), int(worst["duration"]), " ".join(words.split()[:3])


def _fcalls(port: int) -> tuple[int, float]:
    """(FCALL calls, their total server µs) since the last CONFIG RESETSTAT."""
    client = redis.Redis(port=port)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    fcall = stats.get("cmdstat_fcall", {})
    return int(fcall.get("calls", 0)), float(fcall.get("usec", 0))


def build(url: str, tasks: int, queues: int) -> App:
    app = App("verifyscale", broker=url)
    for i in range(tasks):

        async def handler(order: Order) -> Done:
            return Done(ok=True)

        handler.__name__ = f"task{i}"
        app.task(name=f"task{i}", queue=f"q{i % queues}")(handler)
    return app


def _reset(port: int) -> float:
    """Reset the slow log and the command stats; the server's CPU seconds so far."""
    client = redis.Redis(port=port)
    try:
        client.config_set("slowlog-log-slower-than", 1000)
        client.slowlog_reset()
        client.config_resetstat()
    finally:
        client.close()
    return _cpu(port)


def _cpu(port: int) -> float:
    """The server's main-thread CPU seconds so far."""
    client = redis.Redis(port=port)
    try:
        cpu = client.info("cpu")
    finally:
        client.close()
    return float(cpu["used_cpu_user_main_thread"]) + float(cpu["used_cpu_sys_main_thread"])


def _cost(port: int, cpu_before: float) -> str:
    cpu = _cpu(port) - cpu_before
    calls, usec = _fcalls(port)
    slow = _slowest(port)
    mean = usec / calls if calls else 0.0
    per_call = cpu / calls * 1000 if calls else 0.0
    return (
        f"{calls:,} script calls, mean {mean / 1000:.2f} ms in the server ({per_call:.2f} ms "
        f"CPU; {cpu:.2f} s CPU in all); commands over 1 ms: {slow[0]}, the longest "
        f"{slow[1] / 1000:.1f} ms ({slow[2]})"
    )


async def fill(app: App, opts: argparse.Namespace) -> None:
    """The jobs: each task's share (``--scheduled`` of it delayed an hour, enqueued first,
    the rest waiting), then the rare jobs of the old fingerprint."""
    per_task = opts.jobs // opts.tasks
    delayed = int(per_task * opts.scheduled)
    for task in app.tasks.values():
        for first in range(0, per_task, 10_000):
            batch = range(first, min(per_task, first + 10_000))
            now = [n for n in batch if n >= delayed]
            later = [n for n in batch if n < delayed]
            if later:
                await task.enqueue_many(
                    (Order(order_id=n, customer="c") for n in later), delay=3600
                )
            if now:
                await task.enqueue_many(Order(order_id=n, customer="c") for n in now)
    payload = msgspec.msgpack.encode(Order(order_id=-1, customer="c"))
    rare = [
        JobMessage(
            id=new_job_id(),
            task=f"task{i % opts.tasks}",
            queue=f"q{i % opts.tasks % opts.queues}",
            payload=payload,
            fingerprint=OLD,
        )
        for i in range(opts.rare)
    ]
    await app.broker.enqueue(rare)


async def checks(
    app: App, opts: argparse.Namespace, measured: Callable[[], Callable[[], str]]
) -> list[str]:
    """The sample scan, then verify once per ``--page`` and ``--walks``; a line each. ``measured()``
    starts a measurement and answers the function that ends it (its text)."""
    queues = [f"q{i}" for i in range(opts.queues)]
    lines = []
    done = measured()
    started = time.perf_counter()
    counts, read, capped = await count_fingerprints(app.broker, queues, sample=opts.sample)
    took = time.perf_counter() - started
    found = sum(n for (_, fp), n in counts.items() if fp == OLD)
    lines.append(
        f"sample scan (--sample {opts.sample:,}): {took:.2f} s, read {read:,} jobs "
        f"(capped: {capped}), rare jobs found {found} of {opts.rare}; {done()}"
    )
    for page, walks in [(p, w) for p in opts.page for w in opts.walks]:
        verify_module.COUNT_PAGE = page
        verify_module.COUNT_WALKS = walks
        done = measured()
        started = time.perf_counter()
        report = await verify(app, app.broker, sample=opts.sample)
        took = time.perf_counter() - started
        rows: Counter[str] = Counter()
        for row in report.rows:
            rows[row.fingerprint] += row.jobs
        lines.append(
            f"exact (verify, broker counts, {page} jobs per call, {walks} walks at once): "
            f"{took:.2f} s, "
            f"counted {report.scanned:,} jobs (exact: {report.exact}), rare jobs found "
            f"{rows[OLD]} of {opts.rare}, exit code {report.exit_code}; {done()}"
        )
    return lines


async def main(opts: argparse.Namespace) -> None:
    if opts.callgrind:
        await main_callgrind(opts)
        return
    with redis_server() as server:
        app = build(server.url, opts.tasks, opts.queues)
        async with app:
            started = time.perf_counter()
            await fill(app, opts)
            filled = time.perf_counter() - started

            def measured() -> Callable[[], str]:
                cpu = _reset(server.port)
                return lambda: _cost(server.port, cpu)

            lines = await checks(app, opts, measured)
        memory = server.info("memory")["used_memory_human"]
    print(
        f"{opts.jobs:,} jobs of {opts.tasks} tasks in {opts.queues} queues "
        f"({opts.scheduled:.0%} scheduled, the rest waiting) + {opts.rare} of an old "
        f"fingerprint (filled in {filled:.1f} s, Redis {memory})"
    )
    for line in lines:
        print(line)


async def main_callgrind(opts: argparse.Namespace) -> None:
    """The same checks on a redis-server under callgrind: the server's instructions per
    script call and per job counted, which a loaded box does not change (times under
    valgrind mean nothing)."""
    with callgrind_server() as (url, dump):
        port = int(url.rsplit(":", 1)[1])
        app = build(url, opts.tasks, opts.queues)
        async with app:
            await fill(app, opts)

            def measured() -> Callable[[], str]:
                _reset(port)
                dump(None)

                def end() -> str:
                    instructions = dump(None)
                    calls, _ = _fcalls(port)
                    per_call = instructions / calls if calls else 0.0
                    return (
                        f"{calls:,} script calls, {instructions / 1e6:,.0f}M server "
                        f"instructions, {per_call / 1000:,.0f}k per call"
                    )

                return end

            lines = await checks(app, opts, measured)
    print(
        f"callgrind: {opts.jobs:,} jobs of {opts.tasks} tasks in {opts.queues} queues "
        f"({opts.scheduled:.0%} scheduled) + {opts.rare} of an old fingerprint"
    )
    for line in lines:
        print(line)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=50)
    parser.add_argument("--queues", type=int, default=10)
    parser.add_argument("--scheduled", type=float, default=0.1)
    parser.add_argument("--rare", type=int, default=10)
    parser.add_argument("--sample", type=int, default=10_000)
    parser.add_argument(
        "--walks",
        type=int,
        nargs="+",
        default=[verify_module.COUNT_WALKS],
        help="queue states counted at once (typedq.verify.COUNT_WALKS); several: one check each",
    )
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="run redis-server under valgrind's callgrind: instructions instead of times "
        "(use a smaller --jobs)",
    )
    parser.add_argument(
        "--page",
        type=int,
        nargs="+",
        default=[verify_module.COUNT_PAGE],
        help="jobs per count_fingerprints call (typedq.verify.COUNT_PAGE); several: one check each",
    )
    anyio.run(main, parser.parse_args())
