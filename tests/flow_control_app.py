"""The app of tests/process/test_flow_control_processes.py, and its producer process.

``python -m tests.flow_control_app BROKER_URL BARRIER_URL NAME N`` enqueues ``N``
versions of one document to the debounced task ``render``, a few milliseconds apart,
once every producer has said it is ready (a counter in the barrier's Redis db), and
prints each returned job id and whether it was created, one per line.
"""

from __future__ import annotations

import sys
import time

import anyio
import msgspec
import redis

from typedq import App, Debounce

app = App("flowcontrol")

#: Seconds of quiet before the collapsed job runs: longer than the producers' bursts.
WAIT = 3.0


class Edit(msgspec.Struct, frozen=True):
    doc: str
    version: str


@app.task(queue="render", debounce=Debounce(key=lambda e: e.doc, wait=WAIT, max_wait=60.0))
async def render(edit: Edit) -> Edit:
    """Return the edit it ran with (the test checks it is one producer's last)."""
    return edit


async def produce(broker_url: str, name: str, n: int) -> None:
    app.use_broker(broker_url)
    async with app:
        for i in range(n):
            job = await render.enqueue(Edit("doc-1", f"{name}-{i}"))
            print(job.id, int(job.created), flush=True)
            await anyio.sleep(0.01)


def main() -> None:
    broker_url, barrier_url, name, n = sys.argv[1:5]
    barrier = redis.Redis.from_url(barrier_url)
    barrier.incr("ready")
    deadline = time.monotonic() + 30
    while int(barrier.get("ready") or 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    anyio.run(produce, broker_url, name, int(n))


if __name__ == "__main__":
    main()
