"""SAQ adapter (runs in bench/.venvs/saq).

Producer: ``Queue.enqueue`` (one Lua script per job). SAQ has no bulk enqueue (``Queue.map``
enqueues with a gather and then waits for results), so the bulk workload gathers 100
concurrent ``enqueue`` calls (labelled so). Worker: the ``saq`` CLI with ``concurrency=C``;
SAQ's defaults otherwise (JSON, job info kept 600 s, BLMOVE per job).
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from saq import Queue

from . import common


async def noop(ctx: dict[str, Any], *, payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


# What `saq bench.adapters.saq.settings` runs.
settings = {
    "queue": Queue.from_url(common.REDIS_URL, name="bench"),
    "functions": [noop],
    "concurrency": int(os.environ.get("BENCH_C", "10")),
}


FLOW_API = {
    "chain": "n/a: SAQ has no chain, dependency or callback primitive in 0.26.4",
    "fanin": "n/a: SAQ's Queue.map enqueues and then awaits every result in the caller (the "
    "producer), with no broker-side fan-in or callback",
}


class SaqAdapter:
    name = "saq"
    version = version("saq")
    bulk_api = "gather of enqueue (no bulk API)"
    notes = "worker: `saq settings`, concurrency=C; defaults otherwise"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.queue: Queue | None = None

    async def connect(self) -> None:
        self.queue = Queue.from_url(common.REDIS_URL, name="bench")
        await self.queue.connect()

    async def close(self) -> None:
        if self.queue is not None:
            await self.queue.disconnect()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        assert self.queue is not None
        await self.queue.enqueue("noop", payload=payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.gather(*(self.enqueue(p) for p in payloads))

    def worker_argv(self, concurrency: int) -> list[str] | None:
        os.environ["BENCH_C"] = str(concurrency)
        cli = os.path.join(os.path.dirname(sys.executable), "saq")
        return [cli, "bench.adapters.saq.settings", "--quiet"]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(SaqAdapter())
