"""taskiq adapter (runs in bench/.venvs/taskiq, with taskiq-redis).

Broker: ``RedisStreamBroker`` (taskiq-redis's broker with acknowledgements) with
``RedisAsyncResultBackend`` (results expire after 1 h, as its README recommends setting an
expiry). Producer: ``await task.kiq(...)``; taskiq has no bulk kick, so the bulk workload
gathers 100 concurrent ``kiq`` calls (labelled so). Worker: ``taskiq worker --workers 1
--max-async-tasks C`` (one process, like every other system here).

Workflows use taskiq-pipelines (its ``PipelineMiddleware`` is added to the broker only for the
workflow workloads). Chain: ``Pipeline(broker, link).call_next(link)...`` (the middleware kicks
the next step in the worker after the previous step's result is saved). Fan-in: a pipeline's
first step must be sequential, so it is ``Pipeline(broker, source).map(member).call_next(
callback)``: ``source`` returns the 10 member payloads, the mapper kicks the members plus a
``wait_tasks`` task that polls the result backend every ``check_interval`` (default 0.5 s; set
to 0.01 s here, ``$BENCH_TASKIQ_CHECK_INTERVAL``) until all members are done, and its result (the
list) goes to the callback. ``source`` and ``wait_tasks`` are two extra tasks per fan-out that
are not counted in tasks/s.
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version
from typing import Any

from taskiq_pipelines import Pipeline, PipelineMiddleware
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from . import common

broker = RedisStreamBroker(url=common.REDIS_URL, queue_name="bench").with_result_backend(
    RedisAsyncResultBackend(redis_url=common.REDIS_URL, result_ex_time=3600)
)


if os.environ.get("BENCH_FLOWS"):
    broker.add_middlewares(PipelineMiddleware())
CHECK_INTERVAL = float(os.environ.get("BENCH_TASKIQ_CHECK_INTERVAL", "0.01"))


@broker.task(task_name="noop")
async def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


@broker.task(task_name="link")
async def link(payload: dict[str, Any]) -> dict[str, Any]:
    common.link_done(payload["k"], payload["links"], payload["t"])
    return {**payload, "k": payload["k"] + 1}


@broker.task(task_name="source")
async def source(flow: int, t: float, members: int) -> list[dict[str, Any]]:
    return [{"flow": flow, "m": m, "t": t, "note": common.NOTE} for m in range(members)]


@broker.task(task_name="member")
async def member(payload: dict[str, Any]) -> dict[str, Any]:
    return {"flow": payload["flow"], "m": payload["m"], "finished": common.member_finished()}


@broker.task(task_name="callback")
async def callback(results: list[dict[str, Any]], t: float) -> None:
    common.callback_started(t, [r["finished"] for r in results])


FLOW_API = {
    "chain": "taskiq_pipelines.Pipeline(broker, link).call_next(link) x 9, .kiq(payload)",
    "fanin": f"Pipeline(broker, source).map(member, check_interval={CHECK_INTERVAL})"
    ".call_next(callback): 2 extra tasks per fan-out (source, wait_tasks poller), not counted",
}


class TaskiqAdapter:
    name = "taskiq"
    version = f"{version('taskiq')} + taskiq-redis {version('taskiq-redis')}"
    bulk_api = "gather of kiq (no bulk API)"
    notes = "RedisStreamBroker + RedisAsyncResultBackend; worker: --workers 1 --max-async-tasks C"
    flow_api = FLOW_API

    async def connect(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    def make(self, i: int, t: float) -> dict[str, Any]:
        return common.payload_dict(i, t)

    async def enqueue(self, payload: Any) -> None:
        await noop.kiq(payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.gather(*(noop.kiq(p) for p in payloads))

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        pipe: Pipeline[Any, Any] = Pipeline(broker, link)
        for _ in range(links - 1):
            pipe = pipe.call_next(link)
        await pipe.kiq({"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE})

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        pipe = (
            Pipeline(broker, source)
            .map(member, check_interval=CHECK_INTERVAL)
            .call_next(callback, t=t)
        )
        await pipe.kiq(i, t, members)

    def worker_argv(self, concurrency: int) -> list[str] | None:
        cli = os.path.join(os.path.dirname(sys.executable), "taskiq")
        return [
            cli,
            "worker",
            "bench.adapters.taskiq:broker",
            "--workers",
            "1",
            "--max-async-tasks",
            str(concurrency),
            "--log-level",
            "WARNING",
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        raise NotImplementedError


if __name__ == "__main__":
    common.main(TaskiqAdapter())
