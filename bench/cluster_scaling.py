"""Redis CPU per job, one Redis against a 3-primary Redis Cluster (issue 14).

Run: ``.venv/bin/python bench/cluster_scaling.py [--jobs N] [--queues Q]``.

Spawns a standalone redis-server, then a local Redis Cluster of 3 primaries (no replicas:
they would only add CPU), both without persistence (the test suite's spawner,
``tests/redis_harness.py``). On each: enqueues N ~100-byte jobs spread over Q queues and
drains them with one in-process worker (C=16) serving every queue, and reads each
primary's ``used_cpu_sys + used_cpu_user`` (``INFO cpu``) before and after. It reports
throughput, Redis CPU per 1,000 jobs in total and on each primary, and how the jobs'
Redis work spread over the primaries.

On a 2-core machine the worker and producer (Python) are the bottleneck, not Redis, so
jobs/s here does not show the cluster's gain. The projection it prints is labelled as
such: the throughput at which the busiest Redis process would saturate its one core
(1,000 ms of CPU per second), from the measured CPU per job on it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import anyio
import msgspec
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.redis_harness import RedisCluster, RedisProcess  # the suite's spawner
from typedq import App, JobState, Retention


class Payload(msgspec.Struct):
    user_id: int
    email: str
    tags: list[str]
    note: str


def payload(n: int) -> Payload:
    return Payload(n, f"user{n:07d}@example.com", ["a", "b"], "x" * 40)


def cpu_seconds(ports: list[int]) -> dict[int, float]:
    out = {}
    for port in ports:
        info = redis.Redis(port=port).info("cpu")
        out[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


async def run(url: str, ports: list[int], jobs: int, queues: int) -> dict[str, float]:
    app = App("scale", broker=url, retention=Retention(completed_max=jobs))
    tasks = []
    for q in range(queues):

        async def noop(p: Payload) -> None:
            return None

        noop.__name__ = noop.__qualname__ = f"noop{q}"
        tasks.append(app.task(queue=f"q{q}")(noop))
    async with app:
        per = jobs // queues
        start_cpu = cpu_seconds(ports)
        start = time.perf_counter()
        for t in tasks:
            for i in range(0, per, 1000):
                await t.enqueue_many([payload(n) for n in range(i, min(per, i + 1000))])
        async with app.worker(concurrency=16):
            while True:
                done = 0
                for q in range(queues):
                    done += (await app.broker.counts(f"q{q}"))[JobState.COMPLETED]
                if done >= per * queues:
                    break
                await anyio.sleep(0.05)
        elapsed = time.perf_counter() - start
        end_cpu = cpu_seconds(ports)
    total = per * queues
    used = {p: (end_cpu[p] - start_cpu[p]) * 1000 for p in ports}
    result = {"jobs": total, "jobs_per_s": total / elapsed}
    result["cpu_ms_per_1000_total"] = sum(used.values()) / total * 1000
    for i, p in enumerate(ports):
        result[f"cpu_ms_per_1000_primary{i}"] = used[p] / total * 1000
    busiest = max(used.values()) / total  # ms of Redis CPU per job on the busiest primary
    result["projected_jobs_per_s_redis_bound"] = 1000 / busiest if busiest else 0.0
    return result


def show(label: str, r: dict[str, float]) -> None:
    print(f"{label}: {r['jobs']:,.0f} jobs, {r['jobs_per_s']:,.0f} jobs/s (Python-bound here)")
    print(f"  Redis CPU per 1,000 jobs: {r['cpu_ms_per_1000_total']:.1f} ms in total")
    for key, value in r.items():
        if key.startswith("cpu_ms_per_1000_primary"):
            print(f"    {key.removeprefix('cpu_ms_per_1000_')}: {value:.1f} ms")
    print(
        "  PROJECTION (not measured): the busiest Redis core saturates at "
        f"{r['projected_jobs_per_s_redis_bound']:,.0f} jobs/s"
    )


async def main(jobs: int, queues: int) -> None:
    single = RedisProcess()
    single.start()
    try:
        show("1 Redis", await run(single.url, [single.port], jobs, queues))
    finally:
        single.stop()
    cluster = RedisCluster(primaries=3, replicas=0)
    cluster.start()
    try:
        ports = cluster.primary_ports()
        show("Redis Cluster, 3 primaries", await run(cluster.url, ports, jobs, queues))
    finally:
        cluster.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40_000)
    parser.add_argument("--queues", type=int, default=8)
    args = parser.parse_args()
    anyio.run(main, args.jobs, args.queues)
