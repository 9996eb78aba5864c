"""Celery adapter (runs in bench/.venvs/celery; Redis broker and Redis result backend).

Celery's producer API is synchronous: each ``enqueue`` is ``task.delay(...)`` run in a thread
pool as large as the number of producers (32 producers = 32 threads each awaiting one
``delay`` at a time); ``broker_pool_limit`` is raised to 64 so producers do not queue for a
connection. Celery has no bulk publish for independent tasks: the bulk workload runs the 100
``delay`` calls of a batch in one thread (labelled so). Worker: ``celery worker --pool threads
--concurrency C`` (the no-op handler is I/O-bound, and a prefork pool of 64 processes on a
2-core box would measure the box) with ``--without-gossip --without-mingle
--without-heartbeat``; default prefetch multiplier (4) and JSON.

Workflows use Celery's canvas: ``chain(link.s(payload), link.s(), ...)`` (each link receives
the previous link's return value) and ``chord([member.s(...) ...], callback.s(...))``, whose
Redis result backend counts finished members with an atomic INCR and lets the worker that
finishes the last member send the callback, which receives the members' results as a list.
"""

from __future__ import annotations

import asyncio
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

from celery import Celery, chain, chord

from . import common

app = Celery("bench", broker=common.REDIS_URL, backend=common.REDIS_URL)
app.conf.update(broker_pool_limit=64, worker_hijack_root_logger=False, result_expires=3600)


@app.task(name="noop")
def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


@app.task(name="link")
def link(payload: dict[str, Any]) -> dict[str, Any]:
    common.link_done(payload["k"], payload["links"], payload["t"])
    return {**payload, "k": payload["k"] + 1}


@app.task(name="member")
def member(payload: dict[str, Any]) -> dict[str, Any]:
    return {"flow": payload["flow"], "m": payload["m"], "finished": common.member_finished()}


@app.task(name="fanin_callback")
def fanin_callback(results: list[dict[str, Any]], t: float) -> None:
    common.callback_started(t, [r["finished"] for r in results])


FLOW_API = {
    "chain": "celery.chain(link.s(payload), link.s(), ...).apply_async()",
    "fanin": "celery.chord([member.s(..) x members], callback.s(t=..)).apply_async() "
    "(Redis backend: atomic INCR chord counter)",
}


class CeleryAdapter:
    name = "celery"
    version = version("celery")
    bulk_api = "loop of delay in one thread (no bulk API)"
    notes = "Redis broker + backend; worker: --pool threads -c C; producers: 1 thread each"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=32)

    async def connect(self) -> None:
        pass

    async def close(self) -> None:
        self.pool.shutdown()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, noop.delay, payload)

    def _batch(self, payloads: list[Any]) -> None:
        for p in payloads:
            noop.delay(p)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._batch, payloads)

    def _chain(self, i: int, t: float, links: int) -> None:
        first = {"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE}
        chain(link.s(first), *(link.s() for _ in range(links - 1))).apply_async()

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._chain, i, t, links)

    def _fanin(self, i: int, t: float, members: int) -> None:
        header = [
            member.s({"flow": i, "m": m, "t": t, "note": common.NOTE}) for m in range(members)
        ]
        chord(header, fanin_callback.s(t=t)).apply_async()

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._fanin, i, t, members)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "celery")
        return [
            cli,
            "-A",
            "bench.adapters.celery:app",
            "worker",
            "--pool",
            "threads",
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(CeleryAdapter())
