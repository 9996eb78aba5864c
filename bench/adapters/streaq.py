"""streaQ adapter (runs in bench/.venvs/streaq).

Producer: ``await task.enqueue(...)`` inside ``async with worker`` (streaQ's documented way);
bulk: ``Worker.enqueue_many`` (one pipeline). Worker: the ``streaq run`` CLI with
``concurrency=C``; streaQ's defaults otherwise (pickle, prefetch = C, results kept).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from streaq import Worker

from . import common

worker: Worker[Any] = Worker(
    redis_url=common.REDIS_URL,
    queue_name="bench",
    concurrency=int(os.environ.get("BENCH_C", "16")),
)


@worker.task
async def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


class StreaqAdapter:
    name = "streaq"
    version = version("streaq")
    bulk_api = "Worker.enqueue_many"
    notes = "worker: `streaq run`, concurrency=C; defaults otherwise"

    async def connect(self) -> None:
        await worker.__aenter__()

    async def close(self) -> None:
        await worker.__aexit__(None, None, None)

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await noop.enqueue(payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await worker.enqueue_many([noop.enqueue(p) for p in payloads])

    def worker_argv(self, concurrency: int) -> list[str] | None:
        os.environ["BENCH_C"] = str(concurrency)
        cli = os.path.join(os.path.dirname(sys.executable), "streaq")
        return [cli, "run", "bench.adapters.streaq:worker"]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(StreaqAdapter())
