"""arq adapter (runs in bench/.venvs/arq).

Producer: ``ArqRedis.enqueue_job`` (a WATCH/MULTI transaction per job). arq has no bulk
enqueue, so the bulk workload gathers 100 concurrent ``enqueue_job`` calls (labelled so).
Worker: the ``arq`` CLI with ``max_jobs=C`` and ``poll_delay=0.01``: arq's worker polls its
sorted set, reading at most ``queue_read_limit`` (max(5 C, 100)) ids per poll, and with the
default ``poll_delay`` of 0.5 s that caps it near 200 jobs/s (640 at C=64) however fast Redis
is; 0.01 s is the documented knob turned for throughput ($BENCH_ARQ_POLL_DELAY overrides it).
Everything else is arq's default (pickle, results kept 1 h).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from . import common


async def noop(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


class WorkerSettings:
    functions = [noop]  # noqa: RUF012 -- arq's documented settings class shape
    redis_settings = RedisSettings.from_dsn(common.REDIS_URL)
    max_jobs = int(os.environ.get("BENCH_C", "10"))
    poll_delay = float(os.environ.get("BENCH_ARQ_POLL_DELAY", "0.01"))


FLOW_API = {
    "chain": "n/a: arq has no workflow API (no chain, dependency or callback primitive); a chain "
    "would be each handler enqueueing the next job itself, which is not a native flow",
    "fanin": "n/a: arq has no group/chord or job dependencies; a fan-in would need a hand-made "
    "counter, which is not a native flow",
}


class ArqAdapter:
    name = "arq"
    version = version("arq")
    bulk_api = "gather of enqueue_job (no bulk API)"
    notes = f"worker: `arq WorkerSettings`, max_jobs=C, poll_delay={WorkerSettings.poll_delay}"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.pool: ArqRedis | None = None

    async def connect(self) -> None:
        self.pool = await create_pool(RedisSettings.from_dsn(common.REDIS_URL))

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        assert self.pool is not None
        await self.pool.enqueue_job("noop", payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.gather(*(self.enqueue(p) for p in payloads))

    def worker_argv(self, concurrency: int) -> list[str] | None:
        os.environ["BENCH_C"] = str(concurrency)
        arq_cli = os.path.join(os.path.dirname(sys.executable), "arq")
        return [arq_cli, "bench.adapters.arq.WorkerSettings"]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(ArqAdapter())
