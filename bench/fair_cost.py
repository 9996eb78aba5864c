"""Redis time of a fair claim (typedq.fair) against a plain claim, with many active keys.

Run: ``.venv/bin/python -m bench.fair_cost [--keys 10000] [--per-key 3] [--batch 1,16]
[--calls 1000] [--rounds 3]``. Per round and batch size: the queue is filled with
``keys x per_key`` jobs, either plain (FIFO) or fair (one key per tenant: ``keys``
markers in the level list, a lane each), then ``calls`` claims of ``batch`` jobs run one
after another, and Redis' ``INFO commandstats`` gives µs per claim call (FCALL). Plain
and fair alternate within a round; the medians over the rounds are printed with their
ratio. Enqueue cost per job is printed too (a fair job is stored as a job string and
its id pushed to its lane, a plain one as a waiting entry).

``--callgrind``: the same claims (one round, ``--calls`` of them after one to warm up)
against redis-server under ``valgrind --tool=callgrind`` (bench/script_cost.py's
driver), reporting the instructions Redis executed per claim call, plain and fair:
deterministic on a loaded box, where the µs above spread wide. Keep ``--calls`` small
(200); filling the queue under valgrind takes a while.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import anyio
import msgspec
import redis.asyncio as aioredis

from bench.redis_server import redis_server
from typedq import App
from typedq.broker.base import JobMessage


def _messages(keys: int, per_key: int, fair: bool) -> list[JobMessage]:
    payload = msgspec.msgpack.encode({"n": 1})
    out = []
    for r in range(per_key):
        for k in range(keys):
            m = JobMessage(id=f"j{k}-{r}", task="t", queue="q", payload=payload)
            if fair:
                m = msgspec.structs.replace(m, fair_key=f"tenant{k}", fair_weight=1)
            out.append(m)
    return out


async def _usec(client: aioredis.Redis) -> tuple[float, int]:
    row: Any = (await client.info("commandstats")).get("cmdstat_fcall", {})
    return float(row.get("usec", 0)), int(row.get("calls", 0))


async def one(
    url: str, keys: int, per_key: int, batch: int, calls: int, fair: bool
) -> tuple[float, float]:
    """(µs per enqueued job, µs per claim call) of one filled queue."""
    client = aioredis.Redis.from_url(url)
    app = App("fairbench", broker=url)
    try:
        await client.flushall()
        async with app:
            broker: Any = app.broker
            messages = _messages(keys, per_key, fair)
            await client.config_resetstat()
            for s in range(0, len(messages), 500):
                await broker.enqueue(messages[s : s + 500])
            us, _ = await _usec(client)
            enqueue = us / len(messages)
            await client.config_resetstat()
            for _ in range(calls):
                await broker.claim(["q"], batch, worker_id="w", lease=600)
            us, n = await _usec(client)
            return enqueue, us / n
    finally:
        await client.aclose()


async def instructions(
    url: str, dump: Any, keys: int, per_key: int, batch: int, calls: int, fair: bool
) -> float:
    """Instructions redis-server (under callgrind) executed per claim call."""
    client = aioredis.Redis.from_url(url)
    app = App("fairbench", broker=url)
    try:
        await client.flushall()
        async with app:
            broker: Any = app.broker
            messages = _messages(keys, per_key, fair)
            # Batches of 100: a script of 500 fair jobs can outlast Redis' busy-reply
            # threshold (5 s) under valgrind on a loaded box, and the app's other
            # connection then gets BUSY.
            for s in range(0, len(messages), 100):
                await broker.enqueue(messages[s : s + 100])
            await broker.claim(["q"], batch, worker_id="w", lease=600)  # warm up
            dump()
            for _ in range(calls):
                await broker.claim(["q"], batch, worker_id="w", lease=600)
            return float(dump()) / calls
    finally:
        await client.aclose()


async def main_callgrind(keys: int, per_key: int, batches: list[int], calls: int) -> None:
    from bench.script_cost import callgrind_server

    with callgrind_server() as (url, dump):
        for batch in batches:
            plain = await instructions(url, dump, keys, per_key, batch, calls, False)
            fair = await instructions(url, dump, keys, per_key, batch, calls, True)
            print(
                f"keys {keys} x {per_key}, batch {batch:>2}: claim instructions/call plain "
                f"{plain / 1000:.1f}k fair {fair / 1000:.1f}k ({fair / plain:.2f}x)"
            )


async def main(keys: int, per_key: int, batches: list[int], calls: int, rounds: int) -> None:
    with redis_server() as server:
        for batch in batches:
            res: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
            for _ in range(rounds):
                for fair in (False, True):
                    res[fair].append(await one(server.url, keys, per_key, batch, calls, fair))
            plain_c = statistics.median(c for _, c in res[False])
            fair_c = statistics.median(c for _, c in res[True])
            plain_e = statistics.median(e for e, _ in res[False])
            fair_e = statistics.median(e for e, _ in res[True])
            print(
                f"keys {keys} x {per_key}, batch {batch:>2}: claim µs/call plain {plain_c:.1f} "
                f"fair {fair_c:.1f} ({fair_c / plain_c:.2f}x); enqueue µs/job plain "
                f"{plain_e:.2f} fair {fair_e:.2f} ({fair_e / plain_e:.2f}x)"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--per-key", type=int, default=3)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--callgrind", action="store_true", help="instructions per claim, redis under valgrind"
    )
    a = parser.parse_args()
    batches = [int(b) for b in a.batch.split(",")]
    if a.callgrind:
        anyio.run(main_callgrind, a.keys, a.per_key, batches, a.calls)
    else:
        anyio.run(main, a.keys, a.per_key, batches, a.calls, a.rounds)
