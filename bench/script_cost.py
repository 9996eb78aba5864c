"""Redis time per call of each typedq script in the end-to-end workload (bench/redis_bench.py).

Run: ``.venv/bin/python -m bench.script_cost [--concurrency 1,16] [--jobs 20000]``, or
``--micro [--batch 1,16]``: enqueue, claim and complete alone, one call after another with
``batch`` jobs each (2,000 calls per script), each script's ``usec_per_call`` from
``INFO commandstats`` (the end-to-end mix of C=1 and C=16 in isolation: at C=1 a worker's
calls hold one job, at C=16 about 16).

``--callgrind [--batch 1,16] [--calls 200] [--keep DIR] [--completed-max N]``: the same
calls (and settle+claim, a worker's steady state: the completions of the previous claim
sent with the next claim; and ``cycle (drained)``, the end-to-end shape of a worker that
keeps up: ``batch`` jobs enqueued in one call, then a settle+claim of 16 slots that comes
up short on the drained queue, per job both scripts' cost) against the
system redis-server run under ``valgrind --tool=callgrind``, reporting the instructions
redis-server executed per call and per job. Deterministic (same code, same count, to a
fraction of a percent) however loaded the box is, where wall-clock and CPU-time A/Bs are
not; valgrind makes Redis ~50x slower, so keep ``--calls`` small. Includes each command's
parsing and reply (what a FCALL costs Redis), not the client's side. ``--keep DIR`` keeps
each measured phase's dump as ``DIR/<script>-b<batch>.out``, for ``callgrind_annotate``
(where the instructions go, by function of redis-server and its bundled Lua).
Last, ``enqueue (handed off)``: an enqueue whose jobs all go to a worker waiting for a
direct hand-off (``calls / 4`` calls, each after the worker's registration).
``--completed-max N`` keeps N completed jobs (the bench app keeps 1,000,000): with N below
the jobs a run completes, completions run at the retention cap, each deleting the oldest
completed job as production queues do once they reach it (the default cap is 10,000).

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
import contextlib
import glob
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import redis.asyncio as aioredis

from bench import redis_bench
from bench.redis_bench import end_to_end, fresh, redis_server
from typedq import App, Retention

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


@contextlib.contextmanager
def callgrind_server(keep: str | None = None) -> Iterator[tuple[str, Callable[[str | None], int]]]:
    """redis-server under callgrind on a free port: its URL, and a function that returns
    the instructions it executed since the previous call (``callgrind_control -d``); given
    a label and ``keep``, it keeps that interval's dump as ``keep/<label>.out``."""
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    work = tempfile.mkdtemp(prefix="typedq-callgrind-")
    proc = subprocess.Popen(
        [
            *("valgrind", "--tool=callgrind", "--dump-instr=no", "--compress-strings=no"),
            f"--callgrind-out-file={work}/cg.out.%p",
            *(shutil.which("redis-server") or "redis-server", "--port", str(port)),
            *("--save", "", "--appendonly", "no", "--hz", "1", "--dir", work),
            # No slow log: under valgrind a call can pass its 10 ms bound, and whether it
            # does (a copy of its arguments, counted) depends on the box's load.
            *("--slowlog-log-slower-than", "-1"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def dump(label: str | None = None) -> int:
        """Instructions since the previous dump (each dump file holds only its interval)."""
        before = set(glob.glob(f"{work}/cg.out.*"))
        subprocess.run(
            ["callgrind_control", "-d", str(proc.pid)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )
        for _ in range(1200):
            for f in set(glob.glob(f"{work}/cg.out.*")) - before:
                if keep and label:
                    shutil.copy(f, f"{keep}/{label}.out")
                with open(f) as lines:
                    for line in lines:
                        if line.startswith(("totals:", "summary:")):
                            return int(line.split()[1])
            time.sleep(0.05)
        raise RuntimeError("callgrind wrote no dump")

    try:
        import redis

        client = redis.Redis(port=port)
        for _ in range(600):
            with contextlib.suppress(redis.ConnectionError):
                client.ping()
                break
            time.sleep(0.1)
        client.close()
        yield f"redis://127.0.0.1:{port}", dump
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(work, ignore_errors=True)


async def callgrind(batch: int, calls: int, dump: Callable[[str | None], int]) -> dict[str, float]:
    """Script -> instructions of redis-server per call (``batch`` jobs per call) of
    enqueue, claim, complete and settle+claim, in a queue holding a few hundred jobs."""
    from typedq.broker.base import Completion, JobMessage

    broker: Any = redis_bench.app.broker
    body = b"\x93\xa4noop\xc4\x10" + b"x" * 16 + b"\x80"
    serial = iter(range(10**9))

    def batch_of() -> list[JobMessage]:
        return [
            JobMessage(id=f"m{next(serial)}", task="noop", queue="mq", payload=body)
            for _ in range(batch)
        ]

    async def phase(label: str, n: int, step: Callable[[], Awaitable[None]]) -> float:
        dump(None)
        for _ in range(n):
            await step()
        return dump(f"{label}-b{batch}") / n

    async def enqueue() -> None:
        await broker.enqueue(batch_of())

    held: list[Any] = []

    async def claim() -> None:
        held.append(await broker.claim(["mq"], batch, worker_id="w", lease=600))

    async def complete() -> None:
        jobs = held.pop()
        await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])

    async def settle_claim() -> None:
        jobs = held.pop()
        items = [Completion(j.message.id, j.token, b"\xc0") for j in jobs]
        _, claimed = await broker.complete_and_claim(items, ["mq"], batch, worker_id="w", lease=600)
        held.append(claimed)

    async def cycle() -> None:
        # The end-to-end shape at C=16 (a worker that keeps up): ``batch`` jobs enqueued
        # in one call, then the worker's settle+claim of 16 slots, which comes up short
        # (the queue is drained) and completes the jobs of the previous cycle.
        await enqueue()
        jobs = held.pop()
        items = [Completion(j.message.id, j.token, b"\xc0") for j in jobs]
        _, claimed = await broker.complete_and_claim(items, ["mq"], 16, worker_id="w", lease=600)
        held.append(claimed)

    out: dict[str, float] = {}
    # Warm: jobs for every claim below, one call of each script (first-call costs).
    for _ in range(calls + 2):
        await enqueue()
    await claim()
    await complete()
    out["enqueue"] = await phase("enqueue", calls, enqueue)
    half = max(1, calls // 2)
    out["claim"] = await phase("claim", half, claim)
    out["complete"] = await phase("complete", half, complete)
    await claim()
    out["settle+claim"] = await phase("settle_claim", half, settle_claim)
    # Drain what is left, then cycles (enqueue + a short settle+claim) on the empty queue.
    while held[-1]:
        await settle_claim()
    await cycle()
    out["cycle (drained)"] = await phase("cycle", half, cycle)
    return out


async def callgrind_handoff(batch: int, calls: int, dump: Callable[[str | None], int]) -> float:
    """Instructions of redis-server per enqueue call of ``batch`` jobs that a worker
    waiting for a direct hand-off (registered for ``batch`` jobs) takes, all of them
    (the path of an idle worker's next jobs, issue 31). Only the enqueue is
    counted, not the worker's registration, nor its end."""
    from typedq.broker.base import JobMessage

    broker: Any = redis_bench.app.broker
    body = b"\x93\xa4noop\xc4\x10" + b"x" * 16 + b"\x80"
    total = 0
    for r in range(calls + 2):  # (the first two warm up)
        assert await broker.claim(["hq"], batch, worker_id="w", lease=600) == []
        jobs, reg = await broker._register(None, ("hq",), batch, worker_id="w", lease=600)
        assert reg is not None
        assert jobs == []
        messages = [
            JobMessage(id=f"h{r}-{i}", task="noop", queue="hq", payload=body) for i in range(batch)
        ]
        dump(None)
        await broker.enqueue(messages)
        n = dump(f"handoff-b{batch}" if r == calls + 1 else None)
        if r >= 2:
            total += n
        handed = await broker._end(reg, worker_id="w", lease=600, recover=True)
        assert len(handed) == batch, "every job handed to the waiting worker"
    return total / calls


async def main_callgrind(batches: list[int], calls: int, keep: str | None = None) -> None:
    with callgrind_server(keep) as (url, dump):
        redis_bench.app.use_broker(url)
        for b in batches:
            async with fresh(url):
                res = await callgrind(b, calls, dump)
            async with fresh(url):
                res["enqueue (handed off)"] = await callgrind_handoff(b, max(1, calls // 4), dump)
            line = ", ".join(f"{k} {v / 1e3:.1f}k ({v / b / 1e3:.1f}k/job)" for k, v in res.items())
            print(f"batch {b:<3} instructions per call: {line}", flush=True)


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
    parser.add_argument(
        "--callgrind", action="store_true", help="instructions per call, redis under valgrind"
    )
    parser.add_argument("--calls", type=int, default=200, help="--callgrind: calls per script")
    parser.add_argument(
        "--keep", metavar="DIR", help="--callgrind: keep each phase's dump in DIR (annotate)"
    )
    parser.add_argument(
        "--batch", default="1,16", help="--micro/--callgrind: jobs per call (default 1,16)"
    )
    parser.add_argument(
        "--completed-max",
        type=int,
        metavar="N",
        help="--callgrind: completed jobs kept (default: the bench app's 1,000,000)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="--micro: rounds (default 3)")
    args = parser.parse_args()
    if args.completed_max is not None:
        redis_bench.app = App(
            "bench", lease=30.0, retention=Retention(completed_max=args.completed_max)
        )
    if args.callgrind:
        anyio.run(main_callgrind, [int(b) for b in args.batch.split(",")], args.calls, args.keep)
    elif args.micro:
        anyio.run(main_micro, [int(b) for b in args.batch.split(",")], args.rounds)
    else:
        anyio.run(main, [int(c) for c in args.concurrency.split(",")], args.jobs)
