"""Throughput of the embedded broker: enqueue_many N jobs, then drain them at concurrency C.

    .venv/bin/python bench/embedded.py [--jobs 100000] [--concurrency 64] [--runs 3]

Prints the median of the runs, in jobs per second of wall time and, in brackets, per
second of this process's CPU time (steadier on a shared machine: other processes' load
does not count). The handler is an async no-op; the payload is a small msgspec Struct
(about 100 bytes encoded).

Two more lines split the drain between the broker and the worker runtime:

- ``broker alone``: the same jobs through the broker with no worker (prebuilt envelopes
  stored with ``enqueue_batches``, then ``complete_and_claim`` in batches of C, as a
  worker's settle loop calls it): the most a drain could reach with a free worker;
- ``drain share``: how much of the drain's wall time is spent inside broker calls, and in
  the cyclic garbage collector (whoever allocated), the rest being the worker runtime and
  the event loop.
"""

from __future__ import annotations

import argparse
import functools
import gc
import inspect
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import msgspec

from typedq import App, JobState
from typedq.broker.base import Completion, JobMessage
from typedq.broker.memory import MemoryBroker
from typedq.names import new_job_id


class Payload(msgspec.Struct):
    customer_id: int
    invoice_id: int
    note: str


# Broker calls that wait (for work, a result, an event) are not broker work.
_WAITING_CALLS = {
    "wait_for_jobs",
    "wait_finished",
    "read_events",
    "wait_cancel_requests",
    "sleep_until_us",
}


@contextmanager
def timed_broker_calls(spent: list[float]) -> Iterator[None]:
    """Add the time spent inside the MemoryBroker's calls to ``spent[0]``, and the time
    spent in the cyclic GC to ``spent[1]``, while the block runs."""
    originals: dict[str, Callable[..., Any]] = {}
    own = set(vars(MemoryBroker))  # the rest is inherited (its job path: broker/memory/core.py)
    for name in dir(MemoryBroker):
        method = inspect.getattr_static(MemoryBroker, name)
        if inspect.iscoroutinefunction(method) and name not in _WAITING_CALLS:
            originals[name] = method

            def timed(method: Callable[..., Any] = method) -> Callable[..., Any]:
                @functools.wraps(method)
                async def call(*args: Any, **kwargs: Any) -> Any:
                    started = time.perf_counter()
                    try:
                        return await method(*args, **kwargs)
                    finally:
                        spent[0] += time.perf_counter() - started

                return call

            setattr(MemoryBroker, name, timed())
    gc_started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_started[0] = time.perf_counter()
        else:
            spent[1] += time.perf_counter() - gc_started[0]

    gc.callbacks.append(on_gc)
    try:
        yield
    finally:
        gc.callbacks.remove(on_gc)
        for name, method in originals.items():
            if name in own:
                setattr(MemoryBroker, name, method)
            else:
                delattr(MemoryBroker, name)


async def one_run(
    jobs: int, concurrency: int, spent: list[float]
) -> tuple[float, float, float, float]:
    app = App("bench", broker="memory://", retention=None)
    done = anyio.Event()
    remaining = jobs

    @app.task
    async def noop(payload: Payload) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            done.set()

    payloads = [Payload(customer_id=i, invoice_id=i, note="x" * 70) for i in range(jobs)]
    async with app:
        started, cpu = time.perf_counter(), time.process_time()
        await noop.enqueue_many(payloads)
        enqueue_s = time.perf_counter() - started
        enqueue_cpu = time.process_time() - cpu
        started, cpu = time.perf_counter(), time.process_time()
        with timed_broker_calls(spent):
            async with app.worker(concurrency=concurrency):
                await done.wait()
        drain_s = time.perf_counter() - started
        drain_cpu = time.process_time() - cpu
        counts = await app.broker.counts("default")
        assert counts[JobState.COMPLETED] == min(jobs, app.settings.retention.completed_max)
    spent[0] /= drain_s
    spent[1] /= drain_s
    return jobs / enqueue_s, jobs / drain_s, jobs / enqueue_cpu, jobs / drain_cpu


async def broker_alone(jobs: int, batch: int) -> tuple[float, float]:
    """Enqueue and drain through the broker only: no worker, no handler."""
    broker = MemoryBroker()
    await broker.connect()
    try:
        payload = msgspec.msgpack.encode(Payload(customer_id=1, invoice_id=1, note="x" * 70))
        messages = [
            JobMessage(id=new_job_id(), task="noop", queue="default", payload=payload)
            for _ in range(jobs)
        ]
        started = time.perf_counter()
        await broker.enqueue_batches([messages[i : i + 1000] for i in range(0, jobs, 1000)])
        enqueue_s = time.perf_counter() - started
        started = time.perf_counter()
        claimed = await broker.claim(["default"], batch, worker_id="w", lease=60)
        drained = 0
        while claimed:
            items = [Completion(c.message.id, c.token, b"\xc0") for c in claimed]
            drained += len(items)
            _, claimed = await broker.complete_and_claim(
                items, ["default"], len(items), worker_id="w", lease=60
            )
        drain_s = time.perf_counter() - started
        assert drained == jobs
    finally:
        await broker.close()
    return jobs / enqueue_s, jobs / drain_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    results = []
    shares = []
    for _ in range(args.runs):
        spent = [0.0, 0.0]
        results.append(anyio.run(one_run, args.jobs, args.concurrency, spent))
        shares.append(spent)
    alone = [anyio.run(broker_alone, args.jobs, args.concurrency) for _ in range(args.runs)]
    enqueue = statistics.median(r[0] for r in results)
    drain = statistics.median(r[1] for r in results)
    in_broker = statistics.median(s[0] for s in shares)
    in_gc = statistics.median(s[1] for s in shares)
    print(
        f"embedded broker, {args.jobs} jobs, concurrency {args.concurrency}, median of {args.runs}:"
    )
    enqueue_cpu = statistics.median(r[2] for r in results)
    drain_cpu = statistics.median(r[3] for r in results)
    print(f"  enqueue_many: {enqueue:,.0f} jobs/s ({enqueue_cpu:,.0f} per CPU second)")
    print(f"  drain:        {drain:,.0f} jobs/s ({drain_cpu:,.0f} per CPU second)")
    print(
        f"  broker alone: enqueue {statistics.median(a[0] for a in alone):,.0f} jobs/s, "
        f"claim+complete {statistics.median(a[1] for a in alone):,.0f} jobs/s"
    )
    print(
        f"  drain share:  {in_broker:.0%} in broker calls, {in_gc:.0%} in the GC, "
        f"{max(0.0, 1 - in_broker - in_gc):.0%} worker runtime and event loop"
    )


if __name__ == "__main__":
    main()
