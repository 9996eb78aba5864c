"""DBOS Transact durable workflows for bench/durable.py: runs in bench/.venvs/dbos.

The same workload as durable_typedq.py: ``RUNS`` async workflows of ``STEPS`` async no-op
steps (``@DBOS.step()``), ``CONCURRENCY`` at a time, on the local PostgreSQL. Two ways, as
DBOS's docs offer them: ``DBOS.start_workflow_async`` (``mode: direct``) and a
queue registered with ``worker_concurrency=CONCURRENCY`` and a 50 ms polling interval
(``mode: queue``, ``enqueue_async``). Prints one JSON line.

Usage: ``python -m bench.adapters.durable_dbos '{"database": URL, "runs": 1000, ...}'``
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import sys
import time
from typing import Any

from dbos import DBOS, DBOSConfig, Queue


async def main(params: dict[str, Any]) -> dict[str, Any]:
    runs, steps = int(params["runs"]), int(params["steps"])
    concurrency, mode = int(params["concurrency"]), str(params["mode"])
    config: DBOSConfig = {
        "name": "durbench",
        "system_database_url": str(params["database"]),
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    async def add_one(n: int) -> int:
        return n + 1

    @DBOS.workflow()
    async def pipeline(count: int) -> int:
        value = 0
        for _ in range(count):
            value = await add_one(value)
        return value

    DBOS.launch()
    queue: Queue | None = None
    if mode == "queue":
        # DBOS 3.x registers queues in its system database; it polls each queue (1 s by
        # default): 0.05 s here, the fastest setting that stays quiet on this box.
        queue = await DBOS.register_queue_async(
            "durbench", worker_concurrency=concurrency, polling_interval_sec=0.05
        )
    logging.getLogger("dbos").setLevel(logging.WARNING)
    latencies: list[float] = []
    limiter = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with limiter:
            started = time.perf_counter()
            if queue is not None:
                handle = await queue.enqueue_async(pipeline, steps)
            else:
                handle = await DBOS.start_workflow_async(pipeline, steps)
            assert await handle.get_result() == steps
            latencies.append(time.perf_counter() - started)

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(runs)))
    elapsed = time.perf_counter() - t0
    DBOS.destroy()
    latencies.sort()
    return {
        "system": f"dbos-{mode}",
        "runs": runs,
        "steps": steps,
        "concurrency": concurrency,
        "seconds": elapsed,
        "runs_per_s": runs / elapsed,
        "steps_per_s": runs * steps / elapsed,
        "run_p50_ms": 1000 * statistics.median(latencies),
        "run_p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
