"""What the event stream costs Redis: server CPU per job of a drain with the queue's
stream off (nobody ever subscribed) and on, runs interleaved (off, on, off, on, ...),
median of each.

Run: ``.venv/bin/python -m bench.events_cost [--rounds 3] [--total 20000]``.

Each run: a fresh redis-server state, ``total`` pre-filled jobs of bench/redis_bench.py's
no-op task, drained by one worker process at C=16. Redis CPU is ``used_cpu_user +
used_cpu_sys`` from ``INFO cpu`` around the drain, per job; the script calls' µs from
``INFO commandstats`` (``FCALL``; ``EVALSHA`` on older commits) tells the scripts' share
(claim, complete, ...).
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import anyio
import redis.asyncio as aioredis

from bench.redis_bench import app, fresh, noop, payload, redis_server, wait_done, worker_process


async def _info(url: str) -> tuple[float, float, int]:
    """Redis CPU seconds so far, script calls' µs in total and calls."""
    client = aioredis.Redis.from_url(url)
    try:
        cpu: dict[str, Any] = await client.info("cpu")
        stats: dict[str, Any] = await client.info("commandstats")
    finally:
        await client.aclose()
        await client.connection_pool.disconnect()
    calls = [stats.get(k, {"usec": 0, "calls": 0}) for k in ("cmdstat_fcall", "cmdstat_evalsha")]
    return (
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        sum(float(c["usec"]) for c in calls),
        sum(int(c["calls"]) for c in calls),
    )


async def one_run(url: str, total: int, on: bool) -> tuple[float, float]:
    """Redis CPU µs per job and script µs per job of one drain."""
    if on:
        await app.broker.enable_events("default")
    await noop.enqueue_many([payload(i) for i in range(total)])
    cpu0, usec0, _ = await _info(url)
    with worker_process(url, 16):
        await wait_done(total)
    cpu1, usec1, _ = await _info(url)
    return (cpu1 - cpu0) * 1e6 / total, (usec1 - usec0) / total


async def complete_cost(url: str, total: int, on: bool) -> float:
    """script µs per job of the complete script alone (batches of 100), the part the
    event write is added to: the drain's noise on a shared machine hides a few µs."""
    from typedq.broker.base import Completion

    if on:
        await app.broker.enable_events("default")
    await noop.enqueue_many([payload(i) for i in range(total)])
    claimed = []
    while len(claimed) < total:
        claimed += await app.broker.claim(["default"], 500, worker_id="bench", lease=600)
    _, usec0, calls0 = await _info(url)
    for i in range(0, total, 100):
        batch = claimed[i : i + 100]
        await app.broker.complete([Completion(c.message.id, c.token, b"\xc0") for c in batch])
    _, usec1, calls1 = await _info(url)
    assert calls1 - calls0 == total // 100
    return (usec1 - usec0) / total


async def main(rounds: int, total: int, micro: bool) -> None:
    if micro:
        costs: dict[bool, list[float]] = {False: [], True: []}
        with redis_server() as url:
            app.use_broker(url)
            for _ in range(rounds):
                for on in (False, True):
                    async with fresh(url):
                        costs[on].append(await complete_cost(url, total, on))
        off, on_ = statistics.median(costs[False]), statistics.median(costs[True])
        print(
            f"complete script, median of {rounds}: events off {off:.2f} µs/job, on "
            f"{on_:.2f} µs/job ({on_ - off:+.2f} µs, {100 * (on_ - off) / off:+.0f}%)"
        )
        return
    results: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    with redis_server() as url:
        app.use_broker(url)
        for r in range(rounds):
            for on in (False, True):
                async with fresh(url):
                    cpu, script = await one_run(url, total, on)
                results[on].append((cpu, script))
                print(
                    f"round {r + 1} events {'on ' if on else 'off'}: Redis CPU {cpu:6.1f} µs/job, "
                    f"scripts {script:6.1f} µs/job",
                    flush=True,
                )
    for on in (False, True):
        cpu = statistics.median(c for c, _ in results[on])
        script = statistics.median(s for _, s in results[on])
        print(
            f"median of {rounds}, events {'on ' if on else 'off'}: Redis CPU {cpu:.1f} µs/job, "
            f"scripts {script:.1f} µs/job ({total} jobs, C=16)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--total", type=int, default=20_000)
    parser.add_argument(
        "--micro", action="store_true", help="only the complete script's cost per job"
    )
    ns = parser.parse_args()
    anyio.run(main, ns.rounds, ns.total, ns.micro)
