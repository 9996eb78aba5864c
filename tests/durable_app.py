"""The app that worker processes of the durable-run crash tests run (``python -m typedq
worker tests.durable_app:app``).

``pipeline`` is a durable run of five steps (``add``), with an optional ``do`` block, a
``run.sleep`` and a ``run.wait_for(go)`` before the fourth step (the run's input says
which). Every step and ``do`` execution is counted in the ledger (``$TYPEDQ_TEST_LEDGER``,
see tests/ledger.py): ``runs`` counts executions per step job id, ``started`` lists
``<job id> <pid>``, ``do`` counts the ``do`` block's executions per run id. So a test
counts from outside how often each step really ran, across SIGKILLed workers.

**Holds** put a worker where a test wants to SIGKILL it. A worker process started with
``TYPEDQ_TEST_HOLD=point,point...`` stops at each named point whose ledger key
``arm:<point>`` exists: it pushes ``<point> <pid>`` onto the ledger list ``held`` and then
waits until ``release:<point>`` exists (or until it is killed). The points:

- ``step:K``: inside step K's handler (its job is running);
- ``after:K``: in the run's function right after step K returned, i.e. in the turn that
  read step K's outcome and has not appended it to the log yet;
- ``enqueued:K``: in the turn, after step K's job is stored and before the append that
  records the step as scheduled (the path of steps stored before their append: see the
  hook below);
- ``do``: inside the ``do`` block (the value is not recorded yet);
- ``woke``: in the run's function right after ``run.sleep`` returned (the turn its
  timer started);
- ``gathered``: right after ``run.gather`` of steps 3 and 4 returned;
- ``signal``: in the run's function right before ``run.wait_for(go)`` (passed again in
  a later turn only by a replay from the top: a worker that has the run paused in the
  wait goes on from there);
- ``signalled``: right after ``run.wait_for(go)`` returned;
- ``handoff``: on Redis Cluster, after a step's completion wrote the run's hand-off to
  the outbox of the step's queue and before the worker applies it on the run's slot.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import msgspec

from tests.ledger import ledger
from typedq import App, JobContext, Run, Signal

__all__ = ["STEPS", "Go", "Outcome", "Plan", "StepIn", "StepOut", "app", "expected", "go"]

app = App(
    "durcrash",
    lease=float(os.environ.get("TYPEDQ_TEST_LEASE", "1.0")),
    max_stalls=int(os.environ.get("TYPEDQ_TEST_MAX_STALLS", "10")),
)

#: The number of steps of a run.
STEPS = 5

#: The queue of the runs' turns (steps go to the default queue), so a test can start a
#: worker that runs only turns, or only steps.
TURNS = "turns"

#: The hold points of this process (see the module doc).
HOLDS = frozenset(p for p in os.environ.get("TYPEDQ_TEST_HOLD", "").split(",") if p)


class Plan(msgspec.Struct, frozen=True):
    """A run's input: where it starts, and what it does between steps 2 and 3."""

    n: int
    do: bool = False  # a `do` block before step 2
    sleep: float = 0.0  # a run.sleep of this many seconds before step 3 (0: none)
    wait: bool = False  # a run.wait_for(go) before step 3
    gather: bool = False  # steps 3 and 4 at once (run.gather), on the same value


class StepIn(msgspec.Struct, frozen=True):
    """A step's input: the value so far and the step's index."""

    n: int
    k: int


class StepOut(msgspec.Struct, frozen=True):
    """A step's output."""

    n: int


class Go(msgspec.Struct, frozen=True):
    """The ``go`` signal's payload."""

    bump: int


class Outcome(msgspec.Struct, frozen=True):
    """A run's result."""

    n: int


go = Signal("go", Go)

#: The ``do`` block's value.
SALT = 1_000


def _step(n: int, k: int) -> int:
    # Not commutative: steps applied out of order, skipped or twice give another value.
    return n * 3 + k + 1


def expected(plan: Plan, bump: int = 0) -> Outcome:
    """The result a run of ``plan`` must end with (``bump``: the ``go`` signal's)."""
    n = plan.n
    for k in range(STEPS):
        if k == 2 and plan.do:
            n += SALT
        if k == 3 and plan.wait:
            n += bump
        if k == 3 and plan.gather:
            return Outcome(n=_step(n, 3) + _step(n, 4))
        n = _step(n, k)
    return Outcome(n=n)


async def hold(point: str) -> None:
    """Stop here if this process holds at ``point`` and the test armed it (module doc)."""
    if point not in HOLDS:
        return
    book = ledger()
    if not await book.exists(f"arm:{point}"):
        return
    await book.rpush("held", f"{point} {os.getpid()}")
    while not await book.exists(f"release:{point}"):  # noqa: ASYNC110 -- the test's key
        await anyio.sleep(0.01)


@app.task
async def add(inp: StepIn, ctx: JobContext) -> StepOut:
    """Step ``k`` of a run: counted in the ledger, then ``n * 3 + k + 1``."""
    # Both or neither (MULTI): a worker killed between the two would count a run that
    # the test cannot trace to its process.
    async with ledger().pipeline(transaction=True) as book:
        book.hincrby("runs", ctx.job_id, 1)
        book.rpush("started", f"{ctx.job_id} {os.getpid()}")
        await book.execute()
    await hold(f"step:{inp.k}")
    return StepOut(n=_step(inp.n, inp.k))


@app.durable(queue=TURNS)
async def pipeline(run: Run, plan: Plan) -> Outcome:
    """Five steps, each on the previous one's value; see :class:`Plan` for the rest."""
    n = plan.n
    for k in range(STEPS):
        if k == 2 and plan.do:

            async def salt() -> int:
                await ledger().hincrby("do", run.run_id, 1)
                await hold("do")
                return SALT

            n += await run.do("salt", salt)
        if k == 3 and plan.sleep:
            await run.sleep(plan.sleep)
            await hold("woke")
        if k == 3 and plan.wait:
            await hold("signal")
            n += (await run.wait_for(go)).bump
            await hold("signalled")
        if k == 3 and plan.gather:
            a, b = await run.gather(
                run.step(add, StepIn(n=n, k=3)), run.step(add, StepIn(n=n, k=4))
            )
            await hold("gathered")
            return Outcome(n=a.n + b.n)
        n = (await run.step(add, StepIn(n=n, k=k))).n
        await hold(f"after:{k}")
    return Outcome(n=n)


if any(p.startswith("enqueued:") for p in HOLDS):
    # Only in a process told to hold there: the turn's step jobs are stored before its
    # append, and it stops there (the window where a step exists that the log does not
    # name). A broker stores the steps of an append with it where it can (RedisBroker:
    # the steps of the run's slot, one script) and before it otherwise (steps on another
    # slot or with controls, the embedded broker): this forces the second path.
    from typedq.broker.redis import RedisBroker

    _append_runs = RedisBroker.append_runs

    async def _enqueue_then_hold(self: RedisBroker, appends: Any) -> Any:
        for item in appends:
            if item.steps:
                await self.enqueue(list(item.steps))
                for step in item.steps:
                    await hold(f"enqueued:{add.input.decode(step.payload).k}")
        return await _append_runs(self, appends)

    hook: Any = _enqueue_then_hold
    RedisBroker.append_runs = hook  # type: ignore[method-assign]

if "handoff" in HOLDS:
    # Only in a process told to hold there: on Redis Cluster, after a step's completion
    # script wrote the run's hand-off to its queue's outbox and before this process applies
    # it on the run's slot (flow_apply).
    from typedq.broker.redis import RedisBroker

    _deliver = RedisBroker._deliver

    async def _hold_then_deliver(self: RedisBroker, handoffs: Any) -> None:
        await hold("handoff")
        await _deliver(self, handoffs)

    deliver: Any = _hold_then_deliver
    RedisBroker._deliver = deliver  # type: ignore[method-assign]
