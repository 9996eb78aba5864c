"""typedq adapter: runs in the project venv (typedq installed editable).

Producer: ``await noop.enqueue(Payload(...))`` (concurrent calls are auto-batched) and
``await noop.enqueue_many(batch)``. Worker: the ``typedq worker`` CLI in its own process, or,
for ``memory://`` (the embedded broker cannot be shared between processes), ``app.worker()`` in
the producer's process.

Workflows use typedq's typed flow API: a chain is ``link.then(link)...`` (built once, a
``Chain[Link, Link]``) enqueued with ``await chain.enqueue(Link(...))``; a fan-in is
``await member.map(members).then(fanin_callback).enqueue()``, whose callback takes
``list[Done]``. Both are stored in one broker call per flow (concurrent flow enqueues are
auto-batched); the hand-off to the next step and the fan-in counter run inside the broker's
completion script.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import msgspec

import typedq
from typedq import App, Chain

from . import common

BROKER_URL = os.environ.get("BENCH_TYPEDQ_BROKER") or common.REDIS_URL


class Payload(msgspec.Struct):
    customer_id: int
    invoice_id: int
    t: float
    note: str


# The PostgreSQL claim-under-history row (bench/pg_peers.py) keeps its 1,000,000 finished
# jobs: the default count bound (10,000 completed) would delete them as the drain finishes.
KEEP = int(os.environ.get("BENCH_TYPEDQ_KEEP", "0"))
app = App(
    "bench",
    broker=BROKER_URL,
    retention=typedq.Retention(completed_max=KEEP) if KEEP else None,
)


@app.task
async def noop(payload: Payload) -> None:
    common.hit(payload.customer_id, payload.t)


class Link(msgspec.Struct):
    flow: int
    k: int
    links: int
    t: float
    note: str


class Member(msgspec.Struct):
    flow: int
    m: int
    t: float
    note: str


class Done(msgspec.Struct):
    flow: int
    m: int
    t: float
    finished: float


@app.task
async def link(payload: Link) -> Link:
    common.link_done(payload.k, payload.links, payload.t)
    return Link(payload.flow, payload.k + 1, payload.links, payload.t, payload.note)


@app.task
async def member(payload: Member) -> Done:
    return Done(payload.flow, payload.m, payload.t, common.member_finished())


@app.task
async def fanin_callback(done: list[Done]) -> None:
    common.callback_started(done[0].t if done else 0.0, [d.finished for d in done])


_CHAINS: dict[int, Chain[Link, Link]] = {}


def chain_of(links: int) -> Chain[Link, Link]:
    """``link.then(link)...``: a chain of ``links`` links (built once per length)."""
    if links not in _CHAINS:
        chain = link.then(link)
        for _ in range(links - 2):
            chain = chain.then(link)
        _CHAINS[links] = chain
    return _CHAINS[links]


FLOW_API = {
    "chain": "link.then(link)... (Chain[Link, Link]), await chain.enqueue(Link(...))",
    "fanin": "await member.map(items).then(fanin_callback).enqueue() (callback: list[Done])",
}


class TypedqAdapter:
    name = "typedq"
    version = typedq.__version__
    bulk_api = "Task.enqueue_many"
    notes = "msgspec Struct payload; worker: `typedq worker --concurrency C`; default retention"
    flow_api = FLOW_API

    def __init__(self) -> None:
        self.in_process = BROKER_URL.startswith("memory://")
        if self.in_process:
            self.name = "typedq-memory"
            self.notes = "embedded memory:// broker, worker in the producer's process (not Redis)"

    async def connect(self) -> None:
        await app.__aenter__()

    async def close(self) -> None:
        await app.__aexit__(None, None, None)

    def make(self, i: int, t: float) -> Payload:
        return Payload(customer_id=i, invoice_id=1_000_000 + i, t=t, note=common.NOTE)

    async def enqueue(self, payload: Any) -> None:
        await noop.enqueue(payload)

    async def enqueue_batch(self, payloads: list[Any]) -> None:
        await noop.enqueue_many(payloads)

    async def fill_history(self, n: int) -> str:
        """``n`` completed jobs of the noop task written with one INSERT ... SELECT
        generate_series into the broker's own tables (PostgreSQL only), as a queue that has
        run them would hold them, its per-state count of finished jobs included."""
        import asyncpg  # the postgres extra; the Redis runs never get here

        conn = await asyncpg.connect(common.PG_URL)
        try:
            await conn.execute(
                """
                INSERT INTO typedq.jobs (ns, id, queue, message, state, seq, attempt,
                    enqueued_at, started_at, finished_at, token, done_token, worker_id)
                SELECT $1, 'h' || g, $2, $3, 3, nextval('typedq.job_seq'), 1,
                    e - 2 + g * 1e-6, e - 1 + g * 1e-6, e - 1 + g * 1e-6, 't', 't', 'w'
                FROM generate_series(1, $4::bigint) g,
                    (SELECT extract(epoch FROM now())::float8 - 3600 AS e) x
                """,
                app.name,
                noop.queue,
                msgspec.msgpack.encode(self.make(0, 0.0)),
                n,
            )
            await conn.execute(
                """INSERT INTO typedq.finished AS f (ns, state, n) VALUES ($1, 3, $2)
                ON CONFLICT (ns, state) DO UPDATE SET n = f.n + $2""",
                app.name,
                n,
            )
        finally:
            await conn.close()
        return (
            f"INSERT ... SELECT generate_series: {n:,} rows of typedq.jobs in state completed "
            f"(+ typedq.finished count), app kept them: Retention(completed_max={KEEP:,})"
        )

    async def enqueue_chain(self, i: int, t: float, links: int) -> None:
        await chain_of(links).enqueue(Link(i, 0, links, t, common.NOTE))

    async def enqueue_fanin(self, i: int, t: float, members: int) -> None:
        items = [Member(i, m, t, common.NOTE) for m in range(members)]
        await member.map(items).then(fanin_callback).enqueue()

    def worker_argv(self, concurrency: int) -> list[str] | None:
        if self.in_process:
            return None
        return [
            sys.executable,
            "-m",
            "typedq",
            "--log-level",
            "WARNING",
            "worker",
            "bench.adapters.typedq:app",
            "--concurrency",
            str(concurrency),
        ]

    async def run_worker_in_process(self, concurrency: int, stop: asyncio.Event) -> None:
        async with app.worker(concurrency=concurrency):
            await stop.wait()


if __name__ == "__main__":
    common.main(TypedqAdapter())
