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

Workflows use Dramatiq's composition API. Chain: ``pipeline([link.message(payload),
link.message(), ...]).run()``: the ``Pipelines`` middleware (a default) enqueues the next link
from the worker with the previous link's return value as its last argument. Fan-in:
``group([member.message(..) x 10]).add_completion_callback(callback.message(..)).run()``, which
needs the ``GroupCallbacks`` middleware (a Redis barrier counts finished members; the worker
that finishes the last one enqueues the callback) and, for the callback to read the members'
results, ``Results`` with its Redis backend and ``store_results=True`` on the member actor. Both
middleware are added only for the workflow workloads (:func:`use_flow_middleware`), so the
other workloads run Dramatiq's defaults. The callback gets no results from the group: it is
given its members' message ids and reads each result with ``RedisBackend.get_result``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware.group_callbacks import GroupCallbacks
from dramatiq.rate_limits.backends import RedisBackend as RedisRateLimiterBackend
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend as RedisResultBackend

from . import common

QUEUE = "bench"

# What `dramatiq bench.adapters.dramatiq:broker` runs.
broker = RedisBroker(url=common.REDIS_URL)
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name="noop", queue_name=QUEUE)
def noop(payload: dict[str, Any]) -> None:
    common.hit(payload["customer_id"], payload["t"])


# -- workflows (the chain and fanin workloads only) ----------------------------------------------

results = RedisResultBackend(url=common.REDIS_URL)
flow_actors: dict[str, Any] = {}


def link(payload: dict[str, Any]) -> dict[str, Any] | None:
    common.link_done(payload["k"], payload["links"], payload["t"])
    if payload["k"] >= payload["links"] - 1:
        return None  # the last link: nothing to pipe on (and no result to store)
    return {**payload, "k": payload["k"] + 1}


def member(payload: dict[str, Any]) -> dict[str, Any]:
    return {"flow": payload["flow"], "m": payload["m"], "finished": common.member_finished()}


def callback(t: float, member_ids: list[str]) -> None:
    started = time.time()
    finishes = []
    for message_id in member_ids:
        message = dramatiq.Message(
            queue_name=QUEUE,
            actor_name="member",
            args=(),
            kwargs={},
            options={},
            message_id=message_id,
        )
        finishes.append(results.get_result(message)["finished"])
    common.callback_started(t, finishes, started)


def use_flow_middleware() -> None:
    """Add GroupCallbacks and Results to the broker and declare the workflow actors (once).

    ``after_*`` hooks run in reverse order of the middleware list: Results, added last, stores
    the last member's result before GroupCallbacks enqueues the callback that reads it.
    """
    if flow_actors:
        return
    broker.add_middleware(GroupCallbacks(RedisRateLimiterBackend(url=common.REDIS_URL)))
    broker.add_middleware(Results(backend=results))
    flow_actors["link"] = dramatiq.actor(link, actor_name="link", queue_name=QUEUE)
    flow_actors["member"] = dramatiq.actor(
        member, actor_name="member", queue_name=QUEUE, store_results=True
    )
    flow_actors["callback"] = dramatiq.actor(callback, actor_name="callback", queue_name=QUEUE)


if os.environ.get("BENCH_FLOWS"):  # the worker of a workflow run (the driver sets it)
    use_flow_middleware()


FLOW_API = {
    "chain": "dramatiq.pipeline([link.message(payload), link.message() x 9]).run() (Pipelines)",
    "fanin": "dramatiq.group([member.message(..) x 10]).add_completion_callback(callback.message"
    "(t, member ids)).run() (GroupCallbacks: Redis barrier; the callback reads the 10 results "
    "from the Results middleware's Redis backend)",
}


class DramatiqAdapter:
    name = "dramatiq"
    version = version("dramatiq")
    bulk_api = "loop of send in one thread (no bulk API)"
    notes = (
        "RedisBroker, default middleware, no result backend; worker: --processes 1 --threads C;"
        " producers: 1 thread each"
    )
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
        await asyncio.get_running_loop().run_in_executor(self.pool, noop.send, payload)

    def _batch(self, payloads: list[Any]) -> None:
        for p in payloads:
            noop.send(p)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._batch, payloads)

    def _chain(self, i: int, t: float, links: int) -> None:
        use_flow_middleware()
        actor = flow_actors["link"]
        first = {"flow": i, "k": 0, "links": links, "t": t, "note": common.NOTE}
        steps = [actor.message(first), *(actor.message() for _ in range(links - 1))]
        dramatiq.pipeline(steps).run()

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._chain, i, t, links)

    def _fanin(self, i: int, t: float, members: int) -> None:
        use_flow_middleware()
        messages = [
            flow_actors["member"].message({"flow": i, "m": m, "t": t, "note": common.NOTE})
            for m in range(members)
        ]
        done = flow_actors["callback"].message(t, [m.message_id for m in messages])
        fan_out = dramatiq.group(messages)
        fan_out.add_completion_callback(done)  # returns None: not chainable
        fan_out.run()

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        await asyncio.get_running_loop().run_in_executor(self.pool, self._fanin, i, t, members)

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
