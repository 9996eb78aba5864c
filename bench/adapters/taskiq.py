"""taskiq adapter (runs in bench/.venvs/taskiq, with taskiq-redis).

Broker: ``RedisStreamBroker`` (taskiq-redis's broker with acknowledgements) with
``RedisAsyncResultBackend`` (results expire after 1 h, as its README recommends setting an
expiry). Producer: ``await task.kiq(...)``; taskiq has no bulk kick, so the bulk workload
gathers 100 concurrent ``kiq`` calls (labelled so). Worker: ``taskiq worker --workers 1
--max-async-tasks C`` (one process, like every other system here).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from . import common

broker = RedisStreamBroker(url=common.REDIS_URL, queue_name="bench").with_result_backend(
    RedisAsyncResultBackend(redis_url=common.REDIS_URL, result_ex_time=3600)
)


@broker.task(task_name="noop")
async def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


class TaskiqAdapter:
    name = "taskiq"
    version = f"{version('taskiq')} + taskiq-redis {version('taskiq-redis')}"
    bulk_api = "gather of kiq (no bulk API)"
    notes = "RedisStreamBroker + RedisAsyncResultBackend; worker: --workers 1 --max-async-tasks C"

    async def connect(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await noop.kiq(payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.gather(*(noop.kiq(p) for p in payloads))

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "taskiq")
        return [
            cli,
            "worker",
            "bench.adapters.taskiq:broker",
            "--workers",
            "1",
            "--max-async-tasks",
            str(concurrency),
            "--log-level",
            "WARNING",
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(TaskiqAdapter())
