"""typedq adapter: runs in the project venv (typedq installed editable).

Producer: ``await noop.enqueue(Payload(...))`` (concurrent calls are auto-batched) and
``await noop.enqueue_many(batch)``. Worker: the ``typedq worker`` CLI in its own process, or,
for ``memory://`` (the embedded broker cannot be shared between processes), ``app.worker()`` in
the producer's process.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import msgspec

import typedq
from typedq import App

from . import common

BROKER_URL = os.environ.get("BENCH_TYPEDQ_BROKER") or common.REDIS_URL


class Payload(msgspec.Struct):
    customer_id: int
    invoice_id: int
    t: float
    note: str


app = App("bench", broker=BROKER_URL)


@app.task
async def noop(payload: Payload) -> None:
    common.hit(payload.customer_id, payload.t)


class TypedqAdapter:
    name = "typedq"
    version = typedq.__version__
    bulk_api = "Task.enqueue_many"
    notes = "msgspec Struct payload; worker: `typedq worker --concurrency C`; default retention"

    def __init__(self) -> None:
        self.in_process = BROKER_URL.startswith("memory://")
        if self.in_process:
            self.name = "typedq-memory"
            self.notes = "embedded memory:// broker, worker in the producer's process (not Redis)"

    async def connect(self) -> None:
        await app.__aenter__()

    async def close(self) -> None:
        await app.__aexit__(None, None, None)

    def make(self, i: int, t: float) -> Payload:
        return Payload(customer_id=i, invoice_id=1_000_000 + i, t=t, note=common.NOTE)

    async def enqueue(self, payload: Any) -> None:
        await noop.enqueue(payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await noop.enqueue_many(payloads)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        if self.in_process:
            return None
        return [
            sys.executable,
            "-m",
            "typedq",
            "--log-level",
            "WARNING",
            "worker",
            "bench.adapters.typedq:app",
            "--concurrency",
            str(concurrency),
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        async with app.worker(concurrency=concurrency):
            await stop.wait()


if __name__ == "__main__":
    common.main(TypedqAdapter())
