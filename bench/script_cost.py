"""Redis time per call of each typedq script in the end-to-end workload (bench/redis_bench.py).

Run: ``.venv/bin/python -m bench.script_cost [--concurrency 1,16] [--jobs 20000]``, or
``--micro [--batch 1,16]``: enqueue, claim and complete alone, one call after another with
``batch`` jobs each (2,000 calls per script), each script's ``usec_per_call`` from
``INFO commandstats`` (the end-to-end mix of C=1 and C=16 in isolation: at C=1 a worker's
calls hold one job, at C=16 about 16).

``INFO commandstats`` sums every script under one command (FCALL, or EVALSHA before the
function library), so this runs the end-to-end workload with Redis's slow log keeping
every command (``slowlog-log-slower-than 0``) and sums the logged durations per script: a
FCALL names its function (``typedq_<hash>_<script>``), an EVALSHA its SHA1 (mapped to the
script by the typedq being run, for comparisons with older commits). The durations are
the ones ``INFO commandstats`` adds up (the same clock around each command); the slow
log itself costs Redis some CPU, so take CPU per job from redis_bench.py, not here.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import anyio
import redis.asyncio as aioredis

from bench import redis_bench
from bench.redis_bench import end_to_end, fresh, redis_server

_LOG_LEN = 2_000_000


def _script_names() -> dict[str, str]:
    """SHA1 -> script name for a typedq that runs scripts by EVALSHA (none otherwise)."""
    try:
        from typedq.broker.redis import scripts
    except ImportError:
        return {}
    table: Any = getattr(scripts, "SCRIPTS", {})
    return {sha: name for name, (_, sha) in table.items()}


def _name(args: list[bytes], shas: dict[str, str]) -> str:
    command = args[0].decode().upper()
    if command == "FCALL" and len(args) > 1:
        return args[1].decode().split("_", 2)[-1]
    if command == "EVALSHA" and len(args) > 1:
        return shas.get(args[1].decode(), "?")
    return command


async def _drain(client: aioredis.Redis, into: list[Any]) -> None:
    """Move the slow log's entries into ``into``: read and reset in one transaction, so no
    entry is lost or read twice; small reads keep each reply small."""
    pipe: Any = client.pipeline(transaction=True)
    pipe.execute_command("SLOWLOG", "GET", -1)
    pipe.execute_command("SLOWLOG", "RESET")
    entries, _ = await pipe.execute()
    into.extend(entries)


async def per_script(url: str, concurrency: int, jobs: int) -> dict[str, tuple[int, float]]:
    """Script (or other command) -> (calls, µs per call) over one end-to-end run."""
    client = aioredis.Redis.from_url(url, socket_timeout=120)
    entries: list[Any] = []
    try:
        await client.config_set("slowlog-max-len", _LOG_LEN)
        async with fresh(url):
            await client.config_set("slowlog-log-slower-than", 0)
            await client.slowlog_reset()
            async with anyio.create_task_group() as tg:

                async def drain_often() -> None:
                    while True:
                        await anyio.sleep(0.5)
                        await _drain(client, entries)

                tg.start_soon(drain_often)
                await end_to_end(url, jobs, concurrency)
                tg.cancel_scope.cancel()
            await client.config_set("slowlog-log-slower-than", -1)
            await _drain(client, entries)
    finally:
        await client.aclose()
    shas = _script_names()
    total: dict[str, list[float]] = {}
    for entry in entries:
        # [id, timestamp, µs, args, client address, client name] (or parsed by redis-py).
        if isinstance(entry, dict):
            duration, args = entry["duration"], entry["command"].split(b" ")
        else:
            duration, args = entry[2], entry[3]
        key = _name(list(args), shas)
        t = total.setdefault(key, [0, 0.0])
        t[0] += 1
        t[1] += duration
    return {k: (int(c), us / c) for k, (c, us) in total.items()}


async def micro(url: str, batch: int, calls: int = 2000) -> dict[str, float]:
    """Script -> µs per call of enqueue, claim and complete of ``batch`` jobs per call."""
    from typedq.broker.base import Completion, JobMessage

    broker: Any = redis_bench.app.broker
    client = aioredis.Redis.from_url(url)

    async def script_us() -> tuple[float, int]:
        stats = await client.info("commandstats")
        rows = [stats.get(k, {}) for k in ("cmdstat_fcall", "cmdstat_evalsha")]
        return sum(float(r.get("usec", 0)) for r in rows), sum(int(r.get("calls", 0)) for r in rows)

    out: dict[str, float] = {}
    try:
        body = b"\x93\xa4noop\xc4\x10" + b"x" * 16 + b"\x80"
        messages = [
            [
                JobMessage(id=f"m{c}-{i}", task="noop", queue="mq", payload=body)
                for i in range(batch)
            ]
            for c in range(calls)
        ]
        await client.config_resetstat()
        for batch_messages in messages:
            await broker.enqueue(batch_messages)
        us, n = await script_us()
        out["enqueue"] = us / n
        await client.config_resetstat()
        held = []
        for _ in range(calls):
            held.append(await broker.claim(["mq"], batch, worker_id="w", lease=600))
        us, n = await script_us()
        out["claim"] = us / n
        await client.config_resetstat()
        for jobs in held:
            await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])
        us, n = await script_us()
        out["complete"] = us / n
    finally:
        await client.aclose()
    return out


async def main_micro(batches: list[int], rounds: int) -> None:
    with redis_server() as url:
        redis_bench.app.use_broker(url)
        for b in batches:
            runs: dict[str, list[float]] = {}
            for _ in range(rounds):
                async with fresh(url):
                    for k, v in (await micro(url, b)).items():
                        runs.setdefault(k, []).append(v)
            line = ", ".join(f"{k} {statistics.median(v):.2f} µs/call" for k, v in runs.items())
            print(f"batch {b:<3} (median of {rounds}) {line}", flush=True)


async def main(concurrency: list[int], jobs: int) -> None:
    with redis_server() as url:
        redis_bench.app.use_broker(url)
        for c in concurrency:
            stats = await per_script(url, c, jobs)
            # 'get' is the benchmark reading the jobs back once they are done.
            scripts = {k: v for k, v in stats.items() if k.islower() and k != "get"}
            line = ", ".join(f"{k} {n} x {us:.2f} µs" for k, (n, us) in sorted(scripts.items()))
            per_1k = sum(n * us for n, us in scripts.values()) / jobs
            print(f"C={c:<3} {line}; scripts {per_1k:.1f} ms/1k jobs", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per run (default 20000)")
    parser.add_argument("--micro", action="store_true", help="enqueue/claim/complete alone")
    parser.add_argument("--batch", default="1,16", help="--micro: jobs per call (default 1,16)")
    parser.add_argument("--rounds", type=int, default=3, help="--micro: rounds (default 3)")
    args = parser.parse_args()
    if args.micro:
        anyio.run(main_micro, [int(b) for b in args.batch.split(",")], args.rounds)
    else:
        anyio.run(main, [int(c) for c in args.concurrency.split(",")], args.jobs)
