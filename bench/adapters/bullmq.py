"""BullMQ (Python) adapter (runs in bench/.venvs/bullmq).

Producer: ``Queue.add``; bulk: ``Queue.addBulk`` (one pipeline of addJob scripts). Worker:
BullMQ's Python package has no CLI, so ``python -m bench.adapters.bullmq worker C`` runs a
``bullmq.Worker(concurrency=C)`` until SIGTERM, as its docs show. BullMQ's defaults otherwise
(completed jobs are kept: ``removeOnComplete`` is off unless set).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from importlib.metadata import version
from typing import Any

from bullmq import Queue, Worker

from . import common

QUEUE = "bench"


async def process(job: Any, token: str) -> None:
    common.hit(job.data["customer_id"], job.data["t"])


async def run_worker(concurrency: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(QUEUE, process, {"connection": common.REDIS_URL, "concurrency": concurrency})
    await stop.wait()
    await worker.close()


class BullmqAdapter:
    name = "bullmq"
    version = version("bullmq")
    bulk_api = "Queue.addBulk"
    notes = "Python client; worker: bullmq.Worker(concurrency=C) in its own process"

    def __init__(self) -> None:
        self.queue: Queue | None = None

    async def connect(self) -> None:
        self.queue = Queue(QUEUE, {"connection": common.REDIS_URL})

    async def close(self) -> None:
        if self.queue is not None:
            await self.queue.close()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        assert self.queue is not None
        await self.queue.add("noop", payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        assert self.queue is not None
        await self.queue.addBulk([{"name": "noop", "data": p} for p in payloads])

    def worker_argv(self, concurrency: int) -> list[str] | None:
        return [sys.executable, "-m", "bench.adapters.bullmq", "worker", str(concurrency)]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        asyncio.run(run_worker(int(sys.argv[2])))
    else:
        common.main(BullmqAdapter())
