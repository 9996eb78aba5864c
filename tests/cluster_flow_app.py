"""The app a worker process of tests/cluster/test_cluster_flows.py runs (``python -m typedq worker``):
a chain's three steps on the queues named by ``$TYPEDQ_TEST_XQUEUES`` (three queues of
different cluster shards).

With ``$TYPEDQ_TEST_STALL_HANDOFF`` set, the process stops right after a settle that wrote
hand-offs to other slots, before applying any (it records them in the ledger,
``$TYPEDQ_TEST_LEDGER``, and hangs): the window between the settle and its apply, held
open for the test to SIGKILL the worker in.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.flows import Handoff

QUEUES = os.environ.get("TYPEDQ_TEST_XQUEUES", "x0 x1 x2").split()

app = App("xflow", lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "30")))


class Num(msgspec.Struct, frozen=True):
    """A number through the chain."""

    n: int


@app.task(queue=QUEUES[0])
async def parse(x: Num) -> Num:
    """Step 0."""
    await ledger().hincrby("runs", "parse", 1)
    return Num(x.n + 1)


@app.task(queue=QUEUES[1])
async def enrich(x: Num) -> Num:
    """Step 1."""
    await ledger().hincrby("runs", "enrich", 1)
    return Num(x.n * 10)


@app.task(queue=QUEUES[2])
async def store(x: Num) -> Num:
    """Step 2, the flow's own job."""
    await ledger().hincrby("runs", "store", 1)
    return Num(x.n + 3)


_deliver = RedisBroker._deliver


async def _stall(self: RedisBroker, handoffs: Sequence[Handoff]) -> int:
    """Record the hand-offs a settle wrote (entry ids, '<step id>|r') and never apply
    them; deliver any other (a flow's start, which this process's reaper pass may find
    before the producer applied it, on a loaded box) as usual."""
    settled = [h for h in handoffs if h.entry.endswith("|r")]
    if not settled:
        return await _deliver(self, handoffs)
    await ledger().rpush("stalled", *(f"{h.home} {h.entry} {h.target}" for h in settled))
    await anyio.sleep_forever()
    return 0  # not reached: sleep_forever only ends by cancellation


if os.environ.get("TYPEDQ_TEST_STALL_HANDOFF"):
    RedisBroker._deliver = _stall  # type: ignore[method-assign]
