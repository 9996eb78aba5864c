"""The longest Redis script a large fan-out or bulk enqueue runs (issue 31).

Run: ``.venv/bin/python bench/fanout_scripts.py [--sizes 1000,10000,100000] [--bulk 100000]
[--ends 1000,10000,100000]``.

A Lua script blocks Redis while it runs: every other client of that server waits. This
spawns its own redis-server (``bench/redis_server.py``), logs every command of 200 µs or
more (``slowlog-log-slower-than 200``: Redis 7 logs the commands a script calls too, and
logging every one of those would slow the script it measures), and through the public
API alone (no worker) builds:

- per size N: ``task.map(N inputs).then(callback).enqueue()`` (a fan-out and its fan-in);
- ``task.enqueue_many(M payloads)`` (a bulk enqueue, chunked by the client's batch_size);
- with ``--drain D``: a fan-out of D members run to its end by an in-process worker (the
  scripts of claiming and completing, and the fan-in: the last member's completion
  gathers every result into the callback's payload);
- with ``--ends`` sizes N: the end of a fan-out of N waiting members (3 of them
  claimed, running), once by ``cancel`` of the flow's own job (every member cancelled
  with the flow) and once by removing its own job (the flow fails: flow_broken); the
  enqueue is not measured, the end is (its call, all of its chunks);
- with ``--purges`` sizes N: ``purge`` of a queue (the enqueue is not measured, the
  purge is): N plain waiting jobs (purge ``waiting``); a fan-out of N waiting members
  (3 claimed) whose held callback a purge of ``scheduled`` deletes (the flow fails:
  every member ends, flow_broken); and the same fan-out purged in every state (its
  members are deleted, not ended).

For each: the longest command Redis ran (SLOWLOG, reset before each run: Redis's own
execution time, not the round trips, and which script), the script calls and their summed
time (``INFO commandstats`` of FCALL, reset before each run), and the wall time of the
enqueue call as the client saw it. The numbers
are Redis CPU on this box: compare runs of one box, not across boxes.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import redis.asyncio as aioredis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.redis_server import redis_server
from typedq import App, JobState
from typedq.errors import BrokerError

app = App("fanbench", lease=30.0)

_LOG_LEN = 100_000
# The benchmark's redis-server runs without persistence on purpose: drop that warning.
logging.getLogger("typedq.broker.redis").addFilter(
    lambda record: "without persistence" not in record.getMessage()
)


class Item(msgspec.Struct, frozen=True):
    """About 60 bytes encoded: a small payload."""

    n: int
    name: str
    note: str


class Done(msgspec.Struct, frozen=True):
    n: int


class Summary(msgspec.Struct, frozen=True):
    total: int


@app.task
async def work(item: Item) -> Done:
    """The fan-out's member (never run here: only the enqueue is measured)."""
    return Done(item.n)


@app.task
async def gather(items: list[Done]) -> Summary:
    """The fan-in callback."""
    return Summary(len(items))


@app.task(queue="drain")
async def run_one(item: Item) -> Done:
    """The member of the fan-out run to its end (on its own queue: no backlog)."""
    return Done(item.n)


@app.task(queue="drain")
async def run_gather(items: list[Done]) -> Summary:
    """Its fan-in callback."""
    return Summary(len(items))


def item(i: int) -> Item:
    return Item(i, f"item-{i:07d}", "x" * 30)


def command_name(args: list[Any]) -> str:
    """A logged command's name: FCALL's function (the script), else the command."""
    words = [a.decode() if isinstance(a, bytes) else str(a) for a in args[:2]]
    if words and words[0].upper() == "FCALL" and len(words) > 1:
        return words[1]
    return words[0].lower() if words else "?"


async def measure(client: aioredis.Redis, label: str, run: Any) -> str:
    """Run ``run()`` with SLOWLOG logging every command; one line of figures."""
    await client.slowlog_reset()
    await client.config_resetstat()
    start = time.perf_counter()
    await run()
    wall = time.perf_counter() - start
    entries = await client.execute_command("SLOWLOG", "GET", -1)  # type: ignore[no-untyped-call]
    stats = await client.info("commandstats")
    # Each entry: [id, when, µs, args, ...].
    timed = [(int(e[2]), command_name(e[3])) for e in entries]
    longest, name = max(timed, default=(0, "-"))
    fcall = stats.get("cmdstat_fcall", {"calls": 0, "usec": 0})
    over = sum(us > 5000 for us, _ in timed)
    by_name: dict[str, list[int]] = {}
    for us, n in timed:
        by_name.setdefault(n.split("_", 2)[-1], []).append(us)
    per = "; ".join(
        f"{n} x{len(v)} median {sorted(v)[len(v) // 2] / 1000:.2f} min {min(v) / 1000:.2f} "
        f"max {max(v) / 1000:.2f} ms"
        for n, v in sorted(by_name.items())
    )
    return (
        f"{label:<28} longest {longest / 1000:8.2f} ms ({name.split('_', 2)[-1]}, "
        f"{over} over 5 ms)  "
        f"scripts {int(fcall['calls']):>5}  sum {int(fcall['usec']) / 1000:8.2f} ms  "
        f"wall {wall * 1000:8.1f} ms\n    (over 200 µs: {per or 'none'})"
    )


async def until_idle(client: aioredis.Redis) -> None:
    """Wait until Redis answers again (a long script has ended)."""
    for _ in range(6000):
        try:
            await client.ping()
        except aioredis.ResponseError:
            await anyio.sleep(0.1)
        else:
            return


async def main(sizes: list[int], bulk: int, drain: int, ends: list[int], purges: list[int]) -> None:
    with redis_server() as server:
        app.use_broker(server.url)
        client = aioredis.Redis.from_url(server.url)
        await client.config_set("slowlog-max-len", _LOG_LEN)
        await client.config_set("slowlog-log-slower-than", 200)
        lines = []
        async with app:
            for n in sizes:
                fan = work.map([item(i) for i in range(n)]).then(gather)

                async def fan_out(fan: Any = fan) -> None:
                    await fan.enqueue()

                lines.append(await measure(client, f"fan-out {n:,} + callback", fan_out))
                print(lines[-1], flush=True)
            if bulk:
                payloads = [item(i) for i in range(bulk)]

                async def many() -> None:
                    await work.enqueue_many(payloads)

                lines.append(await measure(client, f"enqueue_many {bulk:,}", many))
                print(lines[-1], flush=True)
            if drain:
                fan = run_one.map([item(i) for i in range(drain)]).then(run_gather)
                job = await fan.enqueue()

                async def run() -> None:
                    async with app.worker(concurrency=64, queues=["drain"]):
                        await job.result(timeout=600)

                lines.append(await measure(client, f"run fan-out {drain:,}", run))
                print(lines[-1], flush=True)
            for n in ends:
                for how in ("cancel", "remove"):
                    fan = work.map([item(i) for i in range(n)]).then(gather)
                    job = await fan.enqueue()
                    await app.broker.claim(["default"], 3, worker_id="bench", lease=600)

                    async def end(job: Any = job, how: str = how, n: int = n) -> None:
                        # One script over every member can outlast the client's wait
                        # (its retry then meets BUSY): the script still ran, and SLOWLOG
                        # has it.
                        try:
                            if how == "cancel":
                                assert await job.cancel()
                            else:
                                assert await app.broker.remove([job.id]) == [True]
                        except BrokerError as exc:
                            print(f"    ({how} {n:,}: the call failed: {exc})", flush=True)
                            await until_idle(client)

                    lines.append(await measure(client, f"{how} fan-out {n:,}", end))
                    print(lines[-1], flush=True)
                    await client.flushall(asynchronous=True)
            for n in purges:
                for how in ("jobs", "flow scheduled", "flow all"):
                    if how == "jobs":
                        await work.enqueue_many([item(i) for i in range(n)])
                        states = [JobState.WAITING]
                    else:
                        fan = work.map([item(i) for i in range(n)]).then(gather)
                        await fan.enqueue()
                        await app.broker.claim(["default"], 3, worker_id="bench", lease=600)
                        states = [JobState.SCHEDULED] if how == "flow scheduled" else list(JobState)

                    async def purge(states: list[JobState] = states, n: int = n) -> None:
                        try:
                            await app.broker.purge("default", states)
                        except BrokerError as exc:
                            print(f"    (purge {n:,}: the call failed: {exc})", flush=True)
                            await until_idle(client)

                    lines.append(await measure(client, f"purge {how} {n:,}", purge))
                    print(lines[-1], flush=True)
                    await client.flushall(asynchronous=True)
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--bulk", type=int, default=100_000)
    parser.add_argument("--drain", type=int, default=0)
    parser.add_argument("--ends", default="", help="fan-out sizes whose end is measured")
    parser.add_argument("--purges", default="", help="sizes whose purge is measured")
    opts = parser.parse_args()
    anyio.run(
        main,
        [int(s) for s in opts.sizes.split(",") if s],
        opts.bulk,
        opts.drain,
        [int(s) for s in opts.ends.split(",") if s],
        [int(s) for s in opts.purges.split(",") if s],
    )
