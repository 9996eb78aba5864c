"""Dramatiq adapter (runs in bench/.venvs/dramatiq, ``dramatiq[redis]`` with hiredis).

Broker: ``RedisBroker`` (one Lua script per enqueue, ack and fetch) with Dramatiq's default
middleware. No result backend: the harness times the handler's own finish (``common.hit``),
as for every system, and Dramatiq's ``Results`` middleware is opt-in (off by default).

Dramatiq's producer API is synchronous: each ``enqueue`` is ``actor.send(...)`` run in a thread
pool as large as the number of producers (32 producers = 32 threads each awaiting one ``send`` at
a time), as for Celery. Dramatiq has no bulk enqueue (``group(...).run()`` sends its messages
one by one), so the bulk workload runs the 100 ``send`` calls of a batch in one thread (labelled
so). Worker: ``dramatiq bench.adapters.dramatiq:broker --processes 1 --threads C``: the CLI's
main process forks one worker process running C worker threads (the CPU meter counts the whole
tree); default prefetch (2 C messages) and JSON. An idle Redis consumer backs off
exponentially, up to ``dramatiq_worker_timeout`` (1 s by default), before it polls again.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from . import common

QUEUE = "bench"

# What `dramatiq bench.adapters.dramatiq:broker` runs.
broker = RedisBroker(url=common.REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", queue_name=QUEUE)
def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


class DramatiqAdapter:
    name = "dramatiq"
    version = version("dramatiq")
    bulk_api = "loop of send in one thread (no bulk API)"
    notes = (
        "RedisBroker, default middleware, no result backend; worker: --processes 1 --threads C;"
        " producers: 1 thread each"
    )

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=32)

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        self.pool.shutdown()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, noop.send, payload)

    def _batch(self, payloads: list[Any]) -> None:
        for p in payloads:
            noop.send(p)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._batch, payloads)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "dramatiq")
        return [
            cli,
            "bench.adapters.dramatiq:broker",
            "--processes",
            "1",
            "--threads",
            str(concurrency),
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(DramatiqAdapter())
