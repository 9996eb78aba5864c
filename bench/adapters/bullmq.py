"""BullMQ (Python) adapter (runs in bench/.venvs/bullmq).

Producer: ``Queue.add``; bulk: ``Queue.addBulk`` (one pipeline of addJob scripts). Worker:
BullMQ's Python package has no CLI, so ``python -m bench.adapters.bullmq worker C`` runs a
``bullmq.Worker(concurrency=C)`` until SIGTERM, as its docs show. BullMQ's defaults otherwise
(completed jobs are kept: ``removeOnComplete`` is off unless set).

Workflows use ``FlowProducer.add`` (one atomic MULTI/EXEC per flow). BullMQ's flows are
parent/children trees where a parent runs once all its children completed, and reads their
return values with ``Job.getChildrenValues()`` (one more round trip); BullMQ has no separate
chain primitive, so a chain of 10 is the documented nesting: the first link is the deepest
child, each next link is the parent of the previous one and takes the payload from its child's
return value. A fan-in is one parent (the callback) with 10 children (the members). All in one
queue, processed by the same ``Worker``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from importlib.metadata import version
from typing import Any

from bullmq import FlowProducer, Queue, Worker

from . import common

QUEUE = "bench"


async def process(job: Any, token: str) -> Any:
    if job.name == "link":
        if job.data.get("leaf"):
            payload = job.data
        else:  # the previous link is this job's only child
            payload = next(iter((await job.getChildrenValues()).values()))
        common.link_done(payload["k"], payload["links"], payload["t"])
        return {**payload, "k": payload["k"] + 1}
    if job.name == "member":
        return {"flow": job.data["flow"], "m": job.data["m"], "finished": common.member_finished()}
    if job.name == "callback":
        started = time.time()
        values = await job.getChildrenValues()
        common.callback_started(job.data["t"], [v["finished"] for v in values.values()], started)
        return None
    common.hit(job.data["customer_id"], job.data["t"])
    return None


async def run_worker(concurrency: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(QUEUE, process, {"connection": common.REDIS_URL, "concurrency": concurrency})
    await stop.wait()
    await worker.close()


FLOW_API = {
    "chain": "FlowProducer.add: a 10-deep parent/children tree (first link deepest); each link "
    "reads the previous one's result with Job.getChildrenValues()",
    "fanin": "FlowProducer.add: a parent (callback) with 10 children (members); the callback "
    "reads the members' results with Job.getChildrenValues()",
}


class BullmqAdapter:
    name = "bullmq"
    version = version("bullmq")
    bulk_api = "Queue.addBulk"
    notes = "Python client; worker: bullmq.Worker(concurrency=C) in its own process"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.queue: Queue | None = None
        self.flows: FlowProducer | None = None

    async def connect(self) -> None:
        self.queue = Queue(QUEUE, {"connection": common.REDIS_URL})
        self.flows = FlowProducer({"connection": common.REDIS_URL})

    async def close(self) -> None:
        if self.queue is not None:
            await self.queue.close()
        if self.flows is not None:
            await self.flows.close()

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        assert self.flows is not None
        first = {"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE, "leaf": True}
        node: dict[str, Any] = {"name": "link", "queueName": QUEUE, "data": first}
        for _ in range(links - 1):
            node = {"name": "link", "queueName": QUEUE, "data": {"flow": i}, "children": [node]}
        await self.flows.add(node)

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        assert self.flows is not None
        children = [
            {
                "name": "member",
                "queueName": QUEUE,
                "data": {"flow": i, "m": m, "t": t, "note": common.NOTE},
            }
            for m in range(members)
        ]
        data = {"flow": i, "t": t}
        await self.flows.add(
            {"name": "callback", "queueName": QUEUE, "data": data, "children": children}
        )

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
