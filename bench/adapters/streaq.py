"""streaQ adapter (runs in bench/.venvs/streaq).

Producer: ``await task.enqueue(...)`` inside ``async with worker`` (streaQ's documented way);
bulk: ``Worker.enqueue_many`` (one pipeline). Worker: the ``streaq run`` CLI with
``concurrency=C``; streaQ's defaults otherwise (pickle, prefetch = C, results kept).

Workflows: a chain is ``link.enqueue(payload).then(link)...`` awaited once (streaQ enqueues the
whole pipeline in one transaction; a finished task triggers its dependent, which reads the
previous result as its argument). streaQ has no fan-in primitive that hands results over; its
native fan-in is task dependencies: the members go out with ``Worker.enqueue_many`` and the
callback with ``callback.enqueue(...).start(after=[member ids])`` (a dependency counter in its
Lua scripts queues it when the last member finishes). The callback then reads the members'
results with ``Worker.result_by_id``, one after the other, after recording its start time
(``result_by_id`` opens a pub/sub subscription each time; gathering the 10 reads deadlocked at
C = 16: 160 subscriptions exhaust coredis' default pool of 64 connections).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
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


@worker.task
async def link(payload: dict[str, Any]) -> dict[str, Any]:
    common.link_done(payload["k"], payload["links"], payload["t"])
    return {**payload, "k": payload["k"] + 1}


@worker.task
async def member(payload: dict[str, Any]) -> dict[str, Any]:
    return {"flow": payload["flow"], "m": payload["m"], "finished": common.member_finished()}


@worker.task
async def callback(t: float, member_ids: list[str]) -> None:
    started = time.time()
    results = [await worker.result_by_id(i) for i in member_ids]
    common.callback_started(t, [r.result["finished"] for r in results], started)


FLOW_API = {
    "chain": "link.enqueue(payload).then(link) x 9, awaited (one transaction)",
    "fanin": "no fan-in primitive: members via Worker.enqueue_many, then "
    "callback.enqueue(..).start(after=member ids) (task dependencies); the callback reads "
    "results with Worker.result_by_id (sequentially)",
}


class StreaqAdapter:
    name = "streaq"
    version = version("streaq")
    bulk_api = "Worker.enqueue_many"
    notes = "worker: `streaq run`, concurrency=C; defaults otherwise"
    flow_api = FLOW_API

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

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        task = link.enqueue({"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE})
        for _ in range(links - 1):
            task = task.then(link)
        await task

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        tasks = [
            member.enqueue({"flow": i, "m": m, "t": t, "note": common.NOTE}) for m in range(members)
        ]
        await worker.enqueue_many(tasks)
        ids = [task.id for task in tasks]
        await callback.enqueue(t, ids).start(after=ids)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        os.environ["BENCH_C"] = str(concurrency)
        cli = os.path.join(os.path.dirname(sys.executable), "streaq")
        return [cli, "run", "bench.adapters.streaq:worker"]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(StreaqAdapter())
