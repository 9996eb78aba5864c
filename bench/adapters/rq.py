"""RQ adapter (runs in bench/.venvs/rq, with hiredis).

RQ's producer API is synchronous: each ``enqueue`` is ``Queue.enqueue(...)`` (one MULTI/EXEC
pipeline per job) run in a thread pool as large as the number of producers (32 producers = 32
threads each awaiting one ``enqueue`` at a time), as for Celery. Bulk: ``Queue.enqueue_many``
of 100 ``Queue.prepare_data`` (one pipeline per batch). The job's function is given by its
import path, ``bench.adapters.rq.noop``, since the producer runs this module as ``__main__``.
RQ's defaults otherwise: pickle, results kept 500 s.

Worker: ``rq worker --worker-class rq.worker.SimpleWorker --quiet bench``. RQ runs **one job at
a time per worker process by design** (the default ``Worker`` forks a work horse per job;
``SimpleWorker`` runs it in the worker process itself, which is the fair comparison for a no-op
handler). RQ scales by running more worker processes (``rq worker-pool -n N``, or N ``rq
worker`` commands); the bench runs one worker process per system, so for RQ the concurrency C
is ignored: every RQ figure is one job at a time, whatever C the row says.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

from redis import Redis
from rq import Queue

from . import common

QUEUE = "bench"
NOOP = "bench.adapters.rq.noop"  # what the worker imports: the producer's module is __main__


def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


class RqAdapter:
    name = "rq"
    version = version("rq")
    bulk_api = "Queue.enqueue_many (one pipeline)"
    notes = (
        "worker: `rq worker --worker-class rq.worker.SimpleWorker`, one job at a time (C is "
        "ignored: RQ scales by worker processes); producers: 1 thread each"
    )

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=32)
        self.queue = Queue(QUEUE, connection=Redis.from_url(common.REDIS_URL))

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        self.pool.shutdown()
        self.queue.connection.close()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    def _enqueue(self, payload: Any) -> None:
        self.queue.enqueue(NOOP, payload)

    async def enqueue(self, payload: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._enqueue, payload)

    def _batch(self, payloads: list[Any]) -> None:
        self.queue.enqueue_many([Queue.prepare_data(NOOP, args=(p,)) for p in payloads])

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._batch, payloads)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "rq")
        return [
            cli,
            "worker",
            "--worker-class",
            "rq.worker.SimpleWorker",
            "--url",
            common.REDIS_URL,
            "--quiet",
            QUEUE,
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(RqAdapter())
