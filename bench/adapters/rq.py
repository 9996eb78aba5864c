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

Workflows use RQ's job dependencies (``depends_on``): a dependent job is enqueued by the worker
that finishes its last dependency. RQ hands no result to a dependent job, so each reads its
dependencies' return values itself (``get_current_job().fetch_dependencies()`` and
``Job.return_value()``, one more round trip each, like BullMQ's ``getChildrenValues``). Chain:
link k+1 is enqueued with ``depends_on=`` link k, one ``enqueue`` call per link (RQ has no call
that enqueues a dependent chain at once). Fan-in: the 10 members with one ``enqueue_many``, then
the callback with ``depends_on=`` the 10 member jobs: two calls per fan-out.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

from redis import Redis
from rq import Queue, get_current_job

from . import common

QUEUE = "bench"
# Function paths the worker imports (the producer runs this module as __main__).
NOOP = "bench.adapters.rq.noop"
LINK = "bench.adapters.rq.link"
MEMBER = "bench.adapters.rq.member"
CALLBACK = "bench.adapters.rq.callback"


def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


def _dependency_results() -> list[Any]:
    """The return values of the running job's dependencies (RQ passes none to the job)."""
    job = get_current_job()
    assert job is not None
    return [dep.return_value() for dep in job.fetch_dependencies()]


def link(first: dict[str, Any] | None = None) -> dict[str, Any]:
    """Link 0 gets the chain's payload; a later link reads its predecessor's return value."""
    payload = first if first is not None else _dependency_results()[0]
    common.link_done(payload["k"], payload["links"], payload["t"])
    return {**payload, "k": payload["k"] + 1}


def member(payload: dict[str, Any]) -> dict[str, Any]:
    return {"flow": payload["flow"], "m": payload["m"], "finished": common.member_finished()}


def callback(t: float) -> None:
    started = time.time()
    finishes = [r["finished"] for r in _dependency_results()]
    common.callback_started(t, finishes, started)


FLOW_API = {
    "chain": "Queue.enqueue(link, depends_on=previous link) x 10; each link reads its "
    "predecessor's result (fetch_dependencies + return_value)",
    "fanin": "Queue.enqueue_many(members), then Queue.enqueue(callback, depends_on=members); the "
    "callback reads the 10 results (fetch_dependencies + return_value)",
}


class RqAdapter:
    name = "rq"
    version = version("rq")
    bulk_api = "Queue.enqueue_many (one pipeline)"
    notes = (
        "worker: `rq worker --worker-class rq.worker.SimpleWorker`, one job at a time (C is "
        "ignored: RQ scales by worker processes); producers: 1 thread each"
    )
    flow_api = FLOW_API

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

    def _chain(self, i: int, t: float, links: int) -> None:
        first = {"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE}
        job = self.queue.enqueue(LINK, first)
        for _ in range(links - 1):
            job = self.queue.enqueue(LINK, depends_on=job)

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._chain, i, t, links)

    def _fanin(self, i: int, t: float, members: int) -> None:
        jobs = self.queue.enqueue_many(
            [
                Queue.prepare_data(MEMBER, args=({"flow": i, "m": m, "t": t, "note": common.NOTE},))
                for m in range(members)
            ]
        )
        self.queue.enqueue(CALLBACK, t, depends_on=jobs)

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._fanin, i, t, members)

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
