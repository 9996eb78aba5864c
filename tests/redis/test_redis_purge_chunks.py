"""A purge that ends large flows, in bounded scripts on Redis (issue 31: no script over
~5 ms).

A purge deleted 1000 entries per script and ended every flow its deletions reached in
the same script (a 100,000-member fan-out whose held callback it deleted: one script of
seconds). Now each purge.lua call passes PURGE_CHUNK entries, the jobs of the flows its
deletions end included, and a flow's end goes on in steps (outbox entries that carry the
purge: each deletes the flow's jobs in the purged states, as the purge would, and the
purge counts them); the purge drives them to the end before it returns, and the reaper
pass finishes them when the purge's caller died between two calls. What a user sees must
not change (the contract tests of purge run on every broker).
"""

from __future__ import annotations

import anyio
import msgspec
import pytest
from redis.crc import key_slot

from tests.fanout_app import N, fanout_app
from tests.redis_harness import RedisCluster
from tests.redis_support import raw_redis, server_url
from typedq import App, FailureReason, Fair, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.flows import Handoff, unwrap
from typedq.broker.redis.inspection import PURGE_CHUNK
from typedq.broker.redis.keys import Keys
from typedq.job import decode_failure

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Members: many purge calls and many steps of the flow's end (100 jobs each).
SIZE = 2000
#: Jobs of flow_ops.END_CHUNK (lua/common/flow_settle.lua): what one step of an end takes.
END_CHUNK = 100


def _members(flow: str) -> list[str]:
    return [f"{flow}.m{i}" for i in range(SIZE)]


async def _states(broker: RedisBroker, ids: list[str]) -> list[JobState | None]:
    return [r.state if r else None for r in await broker.get(ids, queue="default")]


async def _purge_call(broker: RedisBroker, letter: str, letters: str) -> tuple[int, list[Handoff]]:
    """One purge.lua call of state ``letter`` (of a purge of ``letters``): what it
    deleted, and the outbox entries it wrote (left unapplied: its caller dies here)."""
    k = broker.keys
    handoffs: list[Handoff] = []
    reply = await broker._eval_one(
        "purge", [k.active("default")], [k.prefix, "default", letter, PURGE_CHUNK, 0, letters]
    )
    n, _ = unwrap(reply, handoffs)
    return int(n), handoffs


async def _counts_match(broker: RedisBroker, ids: list[str]) -> None:
    """The queue's counts are those of the jobs that exist (``ids``: every job it had)."""
    states = await _states(broker, ids)
    counts = await broker.counts("default")
    for state in JobState:
        assert counts[state] == states.count(state), (state, counts)


async def raw_zcard_outbox(url: str, broker: RedisBroker) -> int:
    async with raw_redis(url) as raw:
        return int(await raw.zcard(broker.keys.outbox("default")))


async def _keys_of(url: str, flow: str) -> list[bytes]:
    """Every key of a single Redis that names ``flow`` (jobs, record, outbox entries)."""
    async with raw_redis(url) as raw:
        return [key async for key in raw.scan_iter(match=f"*{flow}*", count=1000)]


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_purging_a_large_fan_outs_callback_fails_every_member_before_it_returns(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = server_url(request, backend)
    app, double, add = fanout_app("purgecb", url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        running = await broker.claim(["default"], 3, worker_id="w", lease=30)
        active = {c.message.id for c in running}
        assert await broker.purge("default", [JobState.SCHEDULED]) == 1
        ids = _members("big")
        records = await broker.get(ids, queue="default")
        for i, r in zip(ids, records, strict=True):
            assert r is not None
            if i in active:
                assert r.state is JobState.ACTIVE
            else:
                assert r.state is JobState.FAILED, (i, r.state)
                assert decode_failure(r.error, i).reason is FailureReason.FLOW_BROKEN
        assert sorted(await broker.cancel_requests(sorted(active))) == sorted(active)
        assert await broker.claim(["default"], 10, worker_id="late", lease=30) == []
        await _counts_match(broker, [*ids, "big"])
        if backend == "redis":
            async with raw_redis(url) as raw:
                assert not await raw.exists(broker.keys.flow("default", "big"))
                assert await raw.zcard(broker.keys.outbox("default")) == 0


async def test_one_purge_call_passes_a_bounded_number_of_jobs(redis_url: str) -> None:
    """The call that deletes the callback marks the flow ended and ends at most one
    chunk of it; the next step's entry carries the purge (queue and states)."""
    app, double, add = fanout_app("purgeone", redis_url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        n, handoffs = await _purge_call(broker, "s", "s")
        assert n == 1
        (step,) = handoffs
        record = msgspec.msgpack.decode(step.record)
        assert (record[0], record[1], record[5:]) == ("Z", "big", ["default", "s"])
        states = await _states(broker, _members("big"))
        failed = states.count(JobState.FAILED)
        assert 0 < failed <= END_CHUNK
        assert states.count(JobState.WAITING) == SIZE - failed
        # A purge of waiting jobs spends PURGE_CHUNK per call: the failed members' stale
        # entries 1 each, then a member of the ended flow 3 (its link and its flow's
        # record read).
        n, _ = await _purge_call(broker, "w", "w")
        assert n == -(-(PURGE_CHUNK - failed) // 3)
        assert (await _states(broker, _members("big"))).count(None) == n


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_purging_every_state_of_a_large_flow_deletes_each_job_once(
    request: pytest.FixtureRequest, backend: str
) -> None:
    url = server_url(request, backend)
    app, double, add = fanout_app("purgeall", url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        await broker.claim(["default"], 3, worker_id="w", lease=30)
        assert await broker.purge("default", list(JobState)) == SIZE + 1
        assert sum((await broker.counts("default")).values()) == 0
        assert await broker.get([*_members("big"), "big"]) == [None] * (SIZE + 1)
        if backend == "redis":
            assert await _keys_of(url, "big") == []


async def test_a_purge_its_caller_left_leaves_its_flows_ended_then_finished(
    redis_url: str,
) -> None:
    """The purge's caller died after the call that deleted the callback (and the flow's
    active members): the flow is ended at once (a claim starts none of it), counts
    match the jobs, and the reaper pass finishes the end as the purge would have: the
    flow's waiting members are in a purged state, so they are deleted, not failed."""
    app, double, add = fanout_app("purgecrash", redis_url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        await broker.claim(["default"], 3, worker_id="w", lease=30)
        letters = "asw"
        _, left = await _purge_call(broker, "a", letters)
        assert left == []  # (three members deleted: the flow waits for the others)
        n, left = await _purge_call(broker, "s", letters)
        assert n > 1  # the callback and the first chunk's waiting members
        assert [h.target for h in left] == ["default"]
        ids = [*_members("big"), "big"]
        await _counts_match(broker, ids)
        waiting = (await _states(broker, ids)).count(JobState.WAITING)
        assert 0 < waiting < SIZE - 3
        # (A claim between two steps ends the members it pops with the flow, failed:
        # ~100 at most, as after any flow's end.)
        assert await broker.claim(["default"], 10, worker_id="late", lease=30) == []
        now = dict(zip(ids, await _states(broker, ids), strict=True))
        ended = {i for i, s in now.items() if s is JobState.FAILED}
        assert 0 < len(ended) <= END_CHUNK + 10
        assert {s for s in now.values()} == {None, JobState.FAILED, JobState.WAITING}
        broker.handoff_age = 0.0
        await broker.recover_stalled()
        after = dict(zip(ids, await _states(broker, ids), strict=True))
        assert {i for i, s in after.items() if s is not None} == ended
        assert {after[i] for i in ended} == {JobState.FAILED}
        await _counts_match(broker, ids)
        assert await raw_zcard_outbox(redis_url, broker) == 0


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_a_job_enqueued_during_a_purge_survives_whole_or_is_purged_whole(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """Plain jobs and small flows enqueued while a purge of every state passes a large
    queue in many calls: each job is either there, waiting (or held) and claimable, or
    gone; each flow whole or gone; the counts are the jobs that are there; the purge
    answers every job it deleted."""
    url = server_url(request, backend)
    app, double, add = fanout_app("purgerace", url)
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await double.enqueue_many([N(i) for i in range(10 * PURGE_CHUNK)])
        await double.map(N(i) for i in range(SIZE)).then(add).enqueue(job_id="big")
        plain: list[str] = []
        flows: list[str] = []
        purged = 0

        async def purge() -> None:
            nonlocal purged
            purged = await broker.purge("default", list(JobState))

        async def enqueue() -> None:
            for i in range(60):
                job = await double.enqueue(N(i), job_id=f"late{i}")
                plain.append(job.id)
                flow = await double.map(N(j) for j in range(3)).then(add).enqueue(job_id=f"lf{i}")
                flows.append(flow.id)

        async with anyio.create_task_group() as tg:
            tg.start_soon(purge)
            tg.start_soon(enqueue)
        flow_jobs = {f: [f, *(f"{f}.m{j}" for j in range(3))] for f in flows}
        everything = [*plain, *(i for ids in flow_jobs.values() for i in ids)]
        states = dict(zip(everything, await _states(broker, everything), strict=True))
        for i in plain:
            assert states[i] in (None, JobState.WAITING)
        for f, ids in flow_jobs.items():
            got = [states[i] for i in ids]
            assert got in ([None] * 4, [JobState.SCHEDULED, *[JobState.WAITING] * 3]), (f, got)
        survivors = {i for i, s in states.items() if s is not None}
        assert purged == 10 * PURGE_CHUNK + SIZE + 1 + len(everything) - len(survivors)
        await _counts_match(broker, everything)
        claimed = await broker.claim(["default"], len(survivors) + 10, worker_id="w", lease=30)
        assert sorted(c.message.id for c in claimed) == sorted(
            i for i in survivors if states[i] is JobState.WAITING
        )


class Tenant(msgspec.Struct, frozen=True):
    tenant: str
    n: int


async def test_a_fair_fan_out_in_its_keys_lanes_is_purged_whole_across_calls(
    redis_url: str,
) -> None:
    """Members of a fair task wait in their keys' lanes: a call whose budget runs out
    inside a lane puts the rest back (and the key's marker at the head); every member,
    the held callback and the plain jobs between them go once, and nothing of the
    queue is left."""
    app = App("purgefair", broker=redis_url)

    @app.task(fair=Fair(key=lambda t: t.tenant))
    async def member(t: Tenant) -> N:
        return N(t.n)  # pragma: no cover

    @app.task
    async def add(xs: list[N]) -> N:
        return N(len(xs))  # pragma: no cover

    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        inputs = [Tenant(f"t{i % 3}", i) for i in range(SIZE)]
        await member.map(inputs).then(add).enqueue(job_id="fanf")
        await member.enqueue_many([Tenant("t0", i) for i in range(PURGE_CHUNK)])
        total = SIZE + 1 + PURGE_CHUNK
        assert await broker.purge("default", [JobState.WAITING, JobState.SCHEDULED]) == total
        assert sum((await broker.counts("default")).values()) == 0
        assert await broker.claim(["default"], 10, worker_id="w", lease=30) == []
        assert await _keys_of(redis_url, "fanf") == []


def _two_slots(app: str) -> tuple[str, str]:
    """Two queue names of ``app`` on different cluster slots."""
    keys = Keys(app)
    slot = key_slot(keys.seq("xa").encode())
    for i in range(100):
        other = f"xb{i}"
        if key_slot(keys.seq(other).encode()) != slot:
            return "xa", other
    raise AssertionError("no second slot found")  # pragma: no cover


@pytest.mark.cluster
async def test_purging_either_queue_of_a_large_flow_across_slots(
    redis_cluster: RedisCluster,
) -> None:
    """Members on one slot, the held callback on another. Purging the callback's queue
    ends the flow at its root, which ends the members on their slot (a hand-off, then a
    step per chunk there) before the purge returns: count 1, every member failed.
    Purging the members' queue of a second such flow deletes them all (each settles at
    the root through the outbox): count SIZE, and the flow fails."""
    redis_cluster.flushall()
    qa, qb = _two_slots("purgex")
    app = App("purgex", broker=redis_cluster.url)

    @app.task(queue=qa)
    async def member(x: N) -> N:
        return x  # pragma: no cover

    @app.task(queue=qb)
    async def gather(xs: list[N]) -> N:
        return N(len(xs))  # pragma: no cover

    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await member.map(N(i) for i in range(SIZE)).then(gather).enqueue(job_id="xf")
        assert await broker.purge(qb, [JobState.SCHEDULED]) == 1
        states = [r.state if r else None for r in await broker.get(_members("xf"), queue=qa)]
        assert states == [JobState.FAILED] * SIZE
        assert (await broker.counts(qa))[JobState.WAITING] == 0

        await member.map(N(i) for i in range(SIZE)).then(gather).enqueue(job_id="xg")
        assert await broker.purge(qa, [JobState.WAITING]) == SIZE
        assert await broker.get(_members("xg"), queue=qa) == [None] * SIZE
        (own,) = await broker.get(["xg"], queue=qb)
        assert own is not None
        assert own.state is JobState.FAILED
