"""Wake-up traffic on the Redis Cluster bus (issue 14): pub/sub messages per notice.

Run: ``.venv/bin/python bench/cluster_pubsub.py [--cycles N]``.

Spawns a local Redis Cluster of 3 primaries with 1 replica each (the test suite's spawner,
``tests/redis_harness.py``), then runs N cycles of enqueue, claim and complete of one job
on one queue (2 notices per cycle: work, then finished) and reads, from every node's
``CLUSTER INFO``, how many pub/sub messages it received over the cluster bus: plain
``PUBLISH`` (``cluster_stats_messages_publish_received``, broadcast to every node) and
sharded ``SPUBLISH`` (``..._publishshard_received``, sent only within the queue's shard).
To compare with a version before sharded pub/sub, run this file with that version's
``typedq`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_harness import RedisCluster, _command  # the suite's spawner
from typedq.broker.base import BrokerSettings, Completion, JobMessage
from typedq.broker.redis import RedisBroker


def bus_messages(cluster: RedisCluster) -> tuple[int, int]:
    """(PUBLISH, SPUBLISH) messages received over the cluster bus, summed over the nodes."""
    plain = sharded = 0
    for node in cluster.nodes:
        for line in _command(node.port, "CLUSTER", "INFO").decode().splitlines():
            name, _, value = line.partition(":")
            if name == "cluster_stats_messages_publish_received":
                plain += int(value)
            elif name == "cluster_stats_messages_publishshard_received":
                sharded += int(value)
    return plain, sharded


def wait_replicas_known(cluster: RedisCluster, timeout: float = 30.0) -> None:
    """Until every node's view of the cluster has each replica attached to its primary: a
    primary sends SPUBLISH only to the replicas it knows, and gossip takes a moment after
    the cluster forms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        views = []
        for node in cluster.nodes:
            reply = _command(node.port, "CLUSTER", "NODES").decode()
            lines = [line.split() for line in reply.splitlines()[1:] if line.strip()]
            views.append(sum("slave" in f[2] and f[3] != "-" for f in lines if len(f) > 3))
        if all(v == cluster.primaries * cluster.replicas for v in views):
            return
        time.sleep(0.1)
    raise RuntimeError("the nodes did not learn of every replica")


async def cycles(url: str, n: int) -> None:
    broker = RedisBroker(url, BrokerSettings(namespace="pubsub"))
    await broker.connect()
    try:
        for i in range(n):
            await broker.enqueue([JobMessage(id=f"j{i}", task="t", queue="q1", payload=b"\x90")])
            (job,) = await broker.claim(["q1"], 1, worker_id="w", lease=30)
            await broker.complete([Completion(job.message.id, job.token, b"\xc0")])
    finally:
        await broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    cluster = RedisCluster(primaries=3, replicas=1)
    cluster.start()
    try:
        wait_replicas_known(cluster)
        before = bus_messages(cluster)
        anyio.run(cycles, cluster.url, args.cycles)
        time.sleep(0.5)  # the last messages still on the bus
        after = bus_messages(cluster)
    finally:
        cluster.stop()
    plain, sharded = after[0] - before[0], after[1] - before[1]
    notices = 2 * args.cycles
    print(f"{notices} notices on a 3+3 cluster: cluster-bus messages received over all nodes")
    print(f"  PUBLISH:  {plain:6d} ({plain / notices:.1f} per notice)")
    print(f"  SPUBLISH: {sharded:6d} ({sharded / notices:.1f} per notice)")


if __name__ == "__main__":
    main()
