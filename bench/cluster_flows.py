"""The cost of a flow's hand-off across cluster slots against one within a slot (issue 14).

Run: ``.venv/bin/python bench/cluster_flows.py [--chains N] [--runs R]``.

Spawns a local Redis Cluster of 3 primaries (no replicas; the test suite's spawner,
``tests/redis_harness.py``) and runs N chains of 3 steps, each driven through the broker
API alone (no worker runtime): enqueue the flow, then per step claim it on its queue and
complete it (the completion hands off to the next step). Two layouts, interleaved run by
run (A B A B ...):

- ``same``: the three steps on one queue (one slot): today's one-script hand-off.
- ``across``: the three steps on queues of three different primaries: each hand-off is
  written to the settling slot's outbox and applied on the next step's slot by a second
  call, then deleted from the outbox by a third.

Per chain: the client's round trips (awaited calls: a pipeline over several nodes is one),
the script calls Redis ran and the Redis CPU they took (``INFO commandstats`` of
``fcall``, or ``evalsha`` and ``eval``, summed over the primaries), and wall time.
Medians over the runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from redis.crc import key_slot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_harness import RedisCluster, _command, slot_owner  # the suite's spawner
from typedq.broker.base import BrokerSettings, Completion, JobMessage
from typedq.broker.flow import FlowSpec
from typedq.broker.redis import RedisBroker


def script_stats(cluster: RedisCluster) -> tuple[int, int]:
    """(calls, µs) of script calls (FCALL; EVALSHA and EVAL before), summed over the primaries."""
    calls = usec = 0
    for port in cluster.primary_ports():
        for line in _command(port, "INFO", "commandstats").decode().splitlines():
            name, _, fields = line.partition(":")
            if name in ("cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval"):
                stats = dict(f.split("=") for f in fields.split(","))
                calls += int(stats["calls"])
                usec += int(stats["usec"])
    return calls, usec


def queues_per_shard(cluster: RedisCluster, app: str) -> list[str]:
    """Three queue names of ``app`` on three different primaries."""
    found: dict[int, str] = {}
    for i in range(200):
        q = f"s{i}"
        slot = key_slot(f"tq:{{{app}:{q}}}:o".encode())
        found.setdefault(slot_owner(cluster, slot), q)
        if len(found) == 3:
            return list(found.values())
    raise RuntimeError("no three queues on three primaries")


class Counting(RedisBroker):
    """A RedisBroker that counts its round trips (each awaited script call or pipeline)."""

    trips = 0

    async def _eval_one(self, name: str, keys: Any, args: Any) -> Any:
        self.trips += 1
        return await super()._eval_one(name, keys, args)

    async def _eval_pipelined(self, calls: Any) -> list[Any]:
        self.trips += 1  # (a NOSCRIPT re-send inside counts once more: rare once warm)
        return await super()._eval_pipelined(calls)


async def run_chains(broker: Counting, queues: list[str], chains: int, tag: str) -> float:
    """Run ``chains`` chains of 3 steps on ``queues`` (step k on queues[k]); wall seconds."""
    started = time.perf_counter()
    for c in range(chains):
        flow = f"{tag}{c}"
        steps = tuple(
            JobMessage(
                id=flow if k == 2 else f"{flow}.{k}",
                task="t",
                queue=q,
                payload=b"\x91\x01" if k == 0 else b"",
            )
            for k, q in enumerate(queues)
        )
        (outcome,) = await broker.enqueue_flows([FlowSpec(id=flow, steps=steps)])
        assert not isinstance(outcome, Exception), outcome
        for q in queues:
            (job,) = await broker.claim([q], 1, worker_id="bench", lease=30)
            await broker.complete([Completion(job.message.id, job.token, b"\x91\x02")])
    return time.perf_counter() - started


async def measure(url: str, cluster: RedisCluster, chains: int, runs: int) -> None:
    broker = Counting(url, BrokerSettings(namespace="xbench"))
    await broker.connect()
    try:
        across = queues_per_shard(cluster, "xbench")
        same = [across[0]] * 3
        layouts = {"same": same, "across": across}
        await run_chains(broker, same, 20, "warm-s")  # scripts cached, connections made
        await run_chains(broker, across, 20, "warm-a")
        results: dict[str, list[tuple[float, float, float, float]]] = {k: [] for k in layouts}
        for r in range(runs):
            for name, queues in layouts.items():
                broker.trips = 0
                calls0, usec0 = script_stats(cluster)
                wall = await run_chains(broker, queues, chains, f"{name}{r}-")
                calls1, usec1 = script_stats(cluster)
                results[name].append(
                    (
                        broker.trips / chains,
                        (calls1 - calls0) / chains,
                        (usec1 - usec0) / chains,
                        wall / chains * 1e3,
                    )
                )
        print(f"{chains} chains of 3 steps per run, {runs} runs interleaved; medians per chain")
        print(
            f"{'layout':8} {'round trips':>12} {'script calls':>13} {'Redis µs':>9} {'wall ms':>8}"
        )
        for name, rows in results.items():
            med = [statistics.median(col) for col in zip(*rows, strict=True)]
            print(f"{name:8} {med[0]:12.1f} {med[1]:13.1f} {med[2]:9.0f} {med[3]:8.2f}")
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cluster = RedisCluster(primaries=3, replicas=0)
    cluster.start()
    try:
        anyio.run(measure, cluster.url, cluster, args.chains, args.runs)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
