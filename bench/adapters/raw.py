"""The raw floor (runs in the project venv: redis-py with hiredis, typedq's own client).

Not a task queue: what Redis and one Python client cost with no queue semantics at all, so the
table shows how close each system comes to the floor. Producer: one ``LPUSH`` of the JSON
payload per job; bulk: one ``LPUSH`` of 100 values. Worker: C coroutines, each on its own
connection, looping ``BRPOP`` -> decode -> no-op handler. No ids, no status, no leases, no
retries, no results: a job is lost if the worker dies holding it. The ratios against it say
what typedq's guarantees cost.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from importlib.metadata import version
from typing import Any

import redis.asyncio as aioredis

from . import common

QUEUE = "bench:raw"


def _handle(raw: bytes | str) -> None:
    payload = json.loads(raw)
    common.hit(payload["customer_id"], payload["t"])


async def _worker(concurrency: int, stop: asyncio.Event) -> None:
    client = aioredis.Redis.from_url(common.REDIS_URL, max_connections=concurrency + 1)

    async def loop() -> None:
        while not stop.is_set():
            reply = await client.brpop([QUEUE], timeout=1)
            if reply is not None:
                _handle(reply[1])

    tasks = [asyncio.ensure_future(loop()) for _ in range(concurrency)]
    await stop.wait()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.aclose()


def worker_main() -> None:
    """``python -m bench.adapters.raw worker C``: the BRPOP loop until SIGTERM."""

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        await _worker(int(sys.argv[2]), stop)

    asyncio.run(run())


FLOW_API = {
    "chain": "n/a: the raw floor has no workflows",
    "fanin": "n/a: the raw floor has no workflows",
}


class RawAdapter:
    name = "raw"
    version = f"redis-py {version('redis')}"
    bulk_api = "one LPUSH of the batch"
    notes = "the floor: LPUSH / BRPOP of JSON, no queue semantics (not a peer)"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.client: aioredis.Redis | None = None

    async def connect(self) -> None:
        # A blocking pool: the open-loop workload may have more sends outstanding than
        # connections when Redis falls behind; they wait for a connection, as a real producer's
        # would, instead of failing with "Too many connections".
        pool = aioredis.BlockingConnectionPool.from_url(
            common.REDIS_URL, max_connections=64, timeout=None
        )
        self.client = aioredis.Redis(connection_pool=pool)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()

    def make(self, i: int, t: float) -> bytes:
        return json.dumps(common.payload_dict(i, t), separators=(",", ":")).encode()

    async def enqueue(self, payload: Any) -> None:
        assert self.client is not None
        await self.client.lpush(QUEUE, payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        assert self.client is not None
        await self.client.lpush(QUEUE, *payloads)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        return [sys.executable, "-m", "bench.adapters.raw", "worker", str(concurrency)]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        await _worker(concurrency, stop)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main()
    else:
        common.main(RawAdapter())
