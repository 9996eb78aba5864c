"""A large flow's end in bounded steps on Redis (issue 31: no script over ~5 ms).

Cancelling (or failing) a flow of 100,000 members was one script that ended every
member (~1 s). Now the first script marks the flow ended in O(1) and ends its first
chunk (steps first, then members); the rest follow a chunk per script, driven by the
caller through the outbox before its call returns, and by the reaper pass when the
caller died between two chunks (``flow_end`` in ``lua/common/flow_settle.lua``). What a
user sees must not change: after ``cancel`` returns no member of the flow runs again and
the flow is final; between two chunks a claim ends a member it pops instead of starting
it, and a member's settlement neither fans in nor hands off.
"""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from tests.fanout_app import N, fanout_app
from tests.redis_harness import RedisCluster, RedisProcess, flushall
from tests.redis_support import raw_redis, server_url
from typedq import App, JobState
from typedq.broker.base import Completion, JobMessage
from typedq.broker.flow import FlowSpec
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.flows import Handoff, unwrap
from typedq.broker.redis.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Members: many chunks of the end's 100 jobs per script (flow_ops.END_CHUNK), and past
#: one staging chunk (the fan-out is stored staged).
SIZE = 2000


async def _left(broker: RedisBroker, flow: str) -> list[tuple[str, JobState]]:
    """The flow's jobs still waiting or scheduled (runnable some day)."""
    ids = [f"{flow}.m{i}" for i in range(SIZE)] + [flow]
    jobs = await broker.get(ids)
    return [
        (i, j.state)
        for i, j in zip(ids, jobs, strict=True)
        if j is not None and j.state in (JobState.WAITING, JobState.SCHEDULED)
    ]


async def _assert_ended(
    broker: RedisBroker,
    flow: str,
    active: set[str],
    completed: frozenset[str] = frozenset(),
    *,
    queue: str = "default",
) -> None:
    """Every member of ``flow`` is cancelled but the ``active`` ones (asked to cancel)
    and the ``completed`` ones, the flow answers ended, and a claim finds none of it."""
    assert await _left(broker, flow) == []
    ids = [f"{flow}.m{i}" for i in range(SIZE)]
    for i, j in zip(ids, await broker.get(ids), strict=True):
        assert j is not None
        if i in active:
            assert j.state is JobState.ACTIVE
        elif i in completed:
            assert j.state is JobState.COMPLETED
        else:
            assert j.state is JobState.CANCELLED, (i, j.state)
    state = await broker.flow_state(flow)
    assert state is not None
    assert state.pending == -1
    assert await broker.claim([queue], 100, worker_id="late", lease=30) == []
    counts = await broker.counts(queue)
    assert counts[JobState.WAITING] == 0
    own = 1 if queue == "default" else 0  # (the flow's own job: on this queue or not)
    assert counts[JobState.CANCELLED] == SIZE + own - len(active) - len(completed)


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_cancelling_a_large_flow_ends_every_member_before_it_returns(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = server_url(request, backend)
    app, double, add = fanout_app("flowend", url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        running = await broker.claim(["default"], 3, worker_id="w", lease=30)
        active = {c.message.id for c in running}
        assert active == {"big.m0", "big.m1", "big.m2"}
        assert (await broker.cancel("big")).value == "cancelled"
        await _assert_ended(broker, "big", active)
        # The running members were asked to cancel; their completion changes nothing.
        assert sorted(await broker.cancel_requests(sorted(active))) == sorted(active)
        await broker.complete(
            [Completion(c.message.id, c.token, double.output.encode(N(0))) for c in running]
        )
        assert await _left(broker, "big") == []
        if backend == "redis":
            async with raw_redis(url) as raw:
                assert not await raw.exists(broker.keys.flow("default", "big"))
                assert await raw.zcard(broker.keys.outbox("default")) == 0


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_a_flow_end_its_caller_left_after_one_chunk_is_honoured_then_finished(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """The cancel's own script only (its caller died before the next chunk): the flow
    is final at once (its own job, and a claim ends the members it pops instead of
    starting them; a member's completion does not fan in); the reaper pass ends the
    rest."""
    url = server_url(request, backend)
    app, double, add = fanout_app("flowendcrash", url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        running = await broker.claim(["default"], 1, worker_id="w", lease=30)
        assert [c.message.id for c in running] == ["big.m0"]
        ttl, cap = broker._retention(completed=False)
        k = broker.keys
        handoffs: list[Handoff] = []
        reply = unwrap(
            await broker._eval_one(
                "cancel", [k.request("default", "crash")], [k.prefix, "default", ttl, cap, "big"]
            ),
            handoffs,
        )
        assert reply == b"cancelled"
        assert [h.record for h in handoffs] != []  # the next chunk, left to the outbox
        # Between two chunks: the flow is final, and nothing of it starts.
        (job,) = await broker.get(["big"])
        assert job is not None
        assert job.state is JobState.CANCELLED
        state = await broker.flow_state("big")
        assert state is not None
        assert state.pending == -1
        left = await _left(broker, "big")
        assert 0 < len(left) < SIZE  # the first chunk ended, the rest not yet
        assert await broker.claim(["default"], 50, worker_id="late", lease=30) == []
        await broker.complete([Completion("big.m0", running[0].token, double.output.encode(N(0)))])
        # The reaper pass hands the outbox entry back (its writer is gone) and the
        # broker delivers it, chunk after chunk, to the end.
        broker.handoff_age = 0.0
        await broker.recover_stalled()
        await _assert_ended(broker, "big", set(), frozenset({"big.m0"}))
        (job,) = await broker.get(["big"])
        assert job is not None
        assert job.state is JobState.CANCELLED
        if backend == "redis":
            async with raw_redis(url) as raw:
                assert not await raw.exists(k.flow("default", "big"))


def _two_slots(app: str) -> tuple[str, str]:
    """Two queue names of ``app`` on different cluster slots."""
    keys = Keys(app)
    first = "xa"
    slot = key_slot(keys.seq(first).encode())
    for i in range(100):
        other = f"xb{i}"
        if key_slot(keys.seq(other).encode()) != slot:
            return first, other
    raise AssertionError("no second slot found")


@pytest.mark.cluster
async def test_a_flow_across_slots_ends_on_each_slot_in_bounded_steps(
    redis_cluster: RedisCluster,
) -> None:
    """Members on another slot than the flow's root: the root's end sends that slot one
    entry, whose apply marks the flow ended there (its claims honour it) and ends a
    chunk; the rest follow through that slot's outbox (here: the reaper's)."""
    redis_cluster.flushall()
    qa, qb = _two_slots("flowendx")
    app = App("flowendx", broker=redis_cluster.url)

    @app.task(queue=qa)
    async def member(x: N) -> N:
        return x

    @app.task(queue=qb)
    async def gather(xs: list[N]) -> N:
        return N(len(xs))

    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        k = broker.keys
        await member.map(N(i) for i in range(SIZE)).then(gather).enqueue(job_id="big")
        running = await broker.claim([qa], 1, worker_id="w", lease=30)
        assert [c.message.id for c in running] == ["big.m0"]
        ttl, cap = broker._retention(completed=False)
        handoffs: list[Handoff] = []
        reply = unwrap(
            await broker._eval_one(
                "cancel", [k.request(qb, "crash")], [k.prefix, qb, ttl, cap, "big"]
            ),
            handoffs,
        )
        assert reply == b"cancelled"
        (end,) = [h for h in handoffs if h.target == qa]
        # The entry applied alone: its next chunk is left in qa's outbox.
        more: list[Handoff] = []
        unwrap(await broker._eval_one("flow_apply", [k.seq(qa)], [k.prefix, qa, end.record]), more)
        assert [h.target for h in more] == [qa]
        left = await _left(broker, "big")
        assert 0 < len(left) < SIZE
        assert await broker.claim([qa], 50, worker_id="late", lease=30) == []
        # (It ended the members it popped, ~100 at most: a claim stays short.)
        assert len(left) - 110 <= len(await _left(broker, "big")) < len(left)
        broker.handoff_age = 0.0
        await broker.recover_stalled()
        await _assert_ended(broker, "big", {"big.m0"}, queue=qa)
        assert await broker.cancel_requests(["big.m0"]) == ["big.m0"]

        # The whole end through the client, before cancel returns.
        job = await member.map(N(i) for i in range(SIZE)).then(gather).enqueue(job_id="big2")
        assert await job.cancel()
        assert await _left(broker, "big2") == []


async def test_a_flow_over_several_queues_ends_every_member_across_chunks(
    redis_server: RedisProcess,
) -> None:
    """Members on alternating queues (the record lists each member's queue): each chunk
    reads the list from where the one before stopped, and the end still finds every
    member on its own queue, after a crash between two chunks too."""
    flushall(redis_server.port)
    async with App("flowendmany", broker=redis_server.url) as app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        k = broker.keys
        size = 450  # five chunks of the end (its own job first)
        queues = ["qa", "qb"]
        members = tuple(
            JobMessage(id=f"many.m{i}", task="t", queue=queues[i % 2], payload=b"\xc0")
            for i in range(size)
        )
        own = JobMessage(id="many", task="t", queue="qc", payload=b"")
        spec = FlowSpec(id="many", steps=(own,), members=members, fan_out=True, collector=True)
        assert len(await broker.enqueue_flows([spec])) == 1
        ttl, cap = broker._retention(completed=False)
        handoffs: list[Handoff] = []
        reply = await broker._eval_one(
            "cancel", [k.request("qc", "crash")], [k.prefix, "qc", ttl, cap, "many"]
        )
        assert unwrap(reply, handoffs) == b"cancelled"
        assert handoffs
        ids = [m.id for m in members]
        states = [r.state if r else None for r in await broker.get(ids)]
        assert states.count(JobState.CANCELLED) == 99  # the first chunk: own job + 99
        assert await broker.claim(["qa", "qb"], 10, worker_id="late", lease=30) == []
        broker.handoff_age = 0.0
        await broker.recover_stalled()
        states = [r.state if r else None for r in await broker.get(ids)]
        assert states == [JobState.CANCELLED] * size
        for q in queues:
            assert (await broker.counts(q))[JobState.WAITING] == 0
