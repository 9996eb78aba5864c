"""The longest script a large fan-out runs on Redis Cluster (issue 31).

Run: ``.venv/bin/python bench/cluster_fanout_scripts.py [--sizes 1000,10000,100000]``.

Spawns a local Redis Cluster of 3 primaries (no replicas; the test suite's spawner,
``tests/redis_harness.py``), logs every command of 200 µs or more on each primary
(``slowlog-log-slower-than 200``), and per size N enqueues, through the public API (no
worker), ``task.map(N inputs).then(callback)`` in two layouts:

- ``same``: members and callback on one queue (one slot): staged, as on one Redis;
- ``across``: members on one queue, the callback on a queue of another primary (a flow
  across slots: its members are stored by ``flow_part`` a chunk per call, and started
  by one ``flow_apply`` per chunk, from the root's hand-offs; before issue 31's change,
  one ``flow_part`` per queue and one ``flow_apply`` of every member).

Then it cancels the flow (its end: bounded steps on each slot). For each: the longest
command on any primary (SLOWLOG, reset before each run) and which script, the script
calls, their summed time and its mean per call (``INFO commandstats`` of FCALL over the
primaries), the median of the scripts SLOWLOG logged (200 µs or more) and of each
script apart, and wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import msgspec
import redis.asyncio as aioredis
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_harness import RedisCluster, slot_owner  # the suite's spawner
from typedq import App
from typedq.broker.redis.keys import Keys
from typedq.broker.redis.scripts import library
from typedq.errors import BrokerError

_APP = "cfanbench"
#: The scripts of the library (SLOWLOG names them by their function's name).
_SCRIPTS = set(library().functions)


class Item(msgspec.Struct, frozen=True):
    n: int
    name: str


class Done(msgspec.Struct, frozen=True):
    n: int


def two_queues(cluster: RedisCluster) -> tuple[str, str]:
    """Two queue names of the app on two different primaries."""
    owners: dict[int, str] = {}
    for i in range(200):
        q = f"c{i}"
        owners.setdefault(slot_owner(cluster, key_slot(Keys(_APP).seq(q).encode())), q)
        if len(owners) == 2:
            a, b = owners.values()
            return a, b
    raise RuntimeError("no two queues on two primaries")


def name_of(args: list[Any]) -> str:
    words = [a.decode() if isinstance(a, bytes) else str(a) for a in args[:2]]
    if words and words[0].upper() == "FCALL" and len(words) > 1:
        return words[1].split("_", 2)[-1]
    return words[0].lower() if words else "?"


async def measure(clients: list[aioredis.Redis], label: str, run: Any) -> str:
    for c in clients:
        await c.slowlog_reset()
        await c.config_resetstat()
    start = time.perf_counter()
    try:
        await run()
    except BrokerError as exc:
        # One script that outlasts the client's wait: it still runs (SLOWLOG gets it).
        print(f"    ({label}: the call failed: {exc})", flush=True)
        for c in clients:
            for _ in range(6000):
                try:
                    await c.ping()
                    break
                except aioredis.ResponseError:
                    await anyio.sleep(0.1)
    wall = time.perf_counter() - start
    timed: list[tuple[int, str]] = []
    calls = usec = 0
    for c in clients:
        entries = await c.execute_command("SLOWLOG", "GET", -1)  # type: ignore[no-untyped-call]
        timed += [(int(e[2]), name_of(e[3])) for e in entries]
        stats = (await c.info("commandstats")).get("cmdstat_fcall", {"calls": 0, "usec": 0})
        calls += int(stats["calls"])
        usec += int(stats["usec"])
    longest, name = max(timed, default=(0, "-"))
    over = sum(us > 5000 for us, _ in timed)
    mean = usec / calls / 1000 if calls else 0.0
    # (The median of the scripts SLOWLOG logged, 200 µs or more: on a loaded box a few
    # scripts wait for a CPU mid-run, which the longest shows and the median does not.)
    # (Redis 7 logs the slow commands a script calls too: only the scripts count here.)
    logged = sorted(us for us, script in timed if script in _SCRIPTS)
    median = logged[len(logged) // 2] / 1000 if logged else 0.0
    by_name: dict[str, list[int]] = {}
    for us, script in timed:
        by_name.setdefault(script, []).append(us)
    kinds = "  ".join(
        f"{script} {len(v)}x median {sorted(v)[len(v) // 2] / 1000:.2f} max {max(v) / 1000:.2f}"
        for script, v in sorted(by_name.items(), key=lambda kv: -len(kv[1]))
    )
    return (
        f"{label:<26} longest {longest / 1000:8.2f} ms ({name}, {over} over 5 ms)  "
        f"median {median:6.2f} ms  scripts {calls:>5}  sum {usec / 1000:8.2f} ms  "
        f"mean {mean:6.2f} ms  wall {wall * 1000:8.1f} ms\n    logged: {kinds}"
    )


async def main(cluster: RedisCluster, sizes: list[int]) -> None:
    qa, qb = two_queues(cluster)
    clients = [aioredis.Redis(port=p) for p in cluster.primary_ports()]
    for c in clients:
        await c.config_set("slowlog-max-len", 100_000)
        await c.config_set("slowlog-log-slower-than", 200)
    app = App(_APP, broker=cluster.url, lease=30.0)

    @app.task(queue=qa)
    async def work(item: Item) -> Done:
        return Done(item.n)  # pragma: no cover

    @app.task(queue=qa)
    async def gather_same(items: list[Done]) -> Done:
        return Done(len(items))  # pragma: no cover

    @app.task(queue=qb)
    async def gather_across(items: list[Done]) -> Done:
        return Done(len(items))  # pragma: no cover

    async with app:
        for n in sizes:
            for layout, cb in (("same", gather_same), ("across", gather_across)):
                fan = work.map([Item(i, f"item-{i:07d}") for i in range(n)]).then(cb)
                jobs: list[Any] = []

                async def enqueue(fan: Any = fan, jobs: list[Any] = jobs) -> None:
                    jobs.append(await fan.enqueue())

                print(await measure(clients, f"fan-out {layout} {n:,}", enqueue), flush=True)

                async def cancel(jobs: list[Any] = jobs) -> None:
                    if jobs:
                        await jobs[0].cancel()

                print(await measure(clients, f"cancel {layout} {n:,}", cancel), flush=True)
                for c in clients:
                    await c.flushall(asynchronous=True)
    for c in clients:
        await c.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    opts = parser.parse_args()
    # (A long node timeout: a primary busy in one long script must not be failed.)
    spawned = RedisCluster(primaries=3, replicas=0, node_timeout_ms=60_000)
    spawned.start()
    try:
        anyio.run(main, spawned, [int(s) for s in opts.sizes.split(",") if s])
    finally:
        spawned.stop()
