"""Large fan-outs across slots on a real local Redis Cluster (issue 31): their members
are stored by ``flow_part`` a bounded chunk per script, and started by one outbox entry
('A') per chunk, each applied by a ``flow_apply`` of its own. The chunk size is the
staging path's (``typedq.broker.redis.staging.STAGE_MEMBERS``), made small here so a
few hundred members take many chunks.

See typedq/broker/redis/flows.py (``part_chunks``) and ``flow_ops.start_range`` in
typedq/broker/redis/lua/common/flow_handoffs.lua.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec
import pytest

from tests.cluster.test_cluster_flows import held, one_queue_per_shard, outbox_sizes, plain
from tests.redis_harness import RedisCluster
from tests.redis_support import broker_at
from tests.support import In, Out
from typedq import App, JobState, QueueFull
from typedq.broker.base import Completion
from typedq.broker.flow import FlowSpec
from typedq.broker.redis import RedisBroker, staging
from typedq.broker.redis.codec import text
from typedq.broker.redis.flows import Handoff
from typedq.errors import ConfigError

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.asyncio_only]

DEADLINE = 120.0
CHUNK = 40


@pytest.fixture
def url(redis_cluster: RedisCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session Redis Cluster's URL, flushed; chunks of CHUNK members."""
    monkeypatch.setattr(staging, "STAGE_MEMBERS", CHUNK)
    redis_cluster.flushall()
    return redis_cluster.url


class Spy:
    """The scripts a broker sends (name, arguments), through ``_eval_many``."""

    def __init__(self, broker: RedisBroker) -> None:
        self.calls: list[tuple[str, Sequence[Any]]] = []
        real = broker._eval_many

        async def spy(calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]]) -> list[Any]:
            self.calls += [(name, args) for name, _, args in calls]
            return await real(calls)

        broker._eval_many = spy  # type: ignore[method-assign]

    def parts(self) -> list[int]:
        """How many members each ``flow_part`` call stored (its argument n)."""
        return [int(args[7]) for name, args in self.calls if name == "flow_part"]

    def starts(self) -> list[list[Any]]:
        """The 'A' records of each ``flow_apply`` call that carried any."""
        out = []
        for name, args in self.calls:
            if name != "flow_apply":
                continue
            records = [msgspec.msgpack.decode(r) for r in args[2:]]
            found = [r for r in records if r[0] == "A"]
            if found:
                out.append(found)
        return out


def spread_spec(flow_id: str, qs: Sequence[str], n: int) -> FlowSpec:
    """A fan-out of ``n`` members, member i on ``qs[0]`` (even i) or on ``qs[2]`` (odd i:
    the root's queue), into a callback on ``qs[1]``, then the flow's own job on ``qs[2]``."""
    members = tuple(
        msgspec.structs.replace(
            plain(f"{flow_id}.m{i}", qs[0] if i % 2 == 0 else qs[2], b"\x91" + bytes([i % 100])),
            task="m",
        )
        for i in range(n)
    )
    steps = (held(f"{flow_id}.0", qs[1], "cb"), held(flow_id, qs[2], "end"))
    return FlowSpec(id=flow_id, steps=steps, members=members, fan_out=True)


async def states(broker: RedisBroker, qs: Sequence[str]) -> list[tuple[int, int]]:
    """(waiting, scheduled) per queue."""
    out = []
    for q in qs:
        c = await broker.counts(q)
        out.append((c[JobState.WAITING], c[JobState.SCHEDULED]))
    return out


async def totals(broker: RedisBroker, qs: Sequence[str]) -> list[int]:
    return [sum((await broker.counts(q)).values()) for q in qs]


# -- a large fan-out completes, every member run once -----------------------------------


async def test_a_large_fan_out_across_slots_runs_each_member_once_in_bounded_scripts(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xbig", "b")
    app = App("xbig", broker=url)
    runs: Counter[int] = Counter()
    got: list[list[Out]] = []

    @app.task(queue=qs[0])
    async def square(x: In) -> Out:
        runs[x.n] += 1
        return Out(x.n * x.n)

    @app.task(queue=qs[1])
    async def total(outs: list[Out]) -> Out:
        got.append(outs)
        return Out(sum(o.n for o in outs))

    n = 1200
    with anyio.fail_after(DEADLINE):
        async with app:
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            spy = Spy(broker)
            job = await square.map(In(i) for i in range(n)).then(total).enqueue(job_id="big")
            # Stored a chunk per flow_part, started a chunk per flow_apply: all waiting.
            assert spy.parts() == [CHUNK] * (n // CHUNK)
            starts = spy.starts()
            assert len(starts) == n // CHUNK
            assert all(len(s) == 1 and s[0][4] - s[0][3] == CHUNK for s in starts)
            assert sorted(s[0][3] for s in starts) == list(range(0, n, CHUNK))
            assert await states(broker, qs[:2]) == [(n, 0), (0, 1)]
            # The same flow again: exists, nothing stored.
            again = await square.map(In(i) for i in range(n)).then(total).enqueue(job_id="big")
            assert again.id == "big"
            assert await states(broker, qs[:2]) == [(n, 0), (0, 1)]
            async with app.worker(concurrency=16):
                assert await job.result(timeout=DEADLINE) == Out(sum(i * i for i in range(n)))
            assert runs == Counter(range(n))  # each member ran once
            assert got == [[Out(i * i) for i in range(n)]]  # one fan-in, in input order
            assert await outbox_sizes(broker, qs) == [0, 0, 0]


# -- a crash between chunks: the reaper finishes the start ------------------------------


async def test_a_start_stopped_between_chunks_is_finished_by_the_reaper(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xhalf", "h")
    n = 300  # 150 members on qs[0], 150 on the root's queue qs[2]
    async with broker_at(url, "xhalf", deadline=DEADLINE) as broker:
        kept: list[Handoff] = []
        deliver = broker._deliver

        async def stalled(handoffs: Sequence[Handoff]) -> int:
            kept.extend(handoffs)
            return 0

        broker._deliver = stalled  # type: ignore[method-assign]
        (outcome,) = await broker.enqueue_flows([spread_spec("hf", qs, n)])
        assert not isinstance(outcome, Exception)
        assert outcome.created
        # Stored, none started: every member held (and the steps).
        assert await states(broker, qs) == [(0, 150), (0, 1), (0, 151)]
        chunks = [h for h in kept if h.entry.split("|")[1] == "A"]
        assert len(chunks) == 2 * -(-150 // CHUNK)
        assert {h.home for h in kept} == {qs[2]}  # all in the root's outbox
        # One chunk applied (the writer then stops): its members wait, the rest are held.
        first = next(h for h in chunks if h.target == qs[0])
        reply = await broker._eval(
            "flow_apply", [broker.keys.seq(qs[0])], [broker.keys.prefix, qs[0], first.record]
        )
        assert reply == [1]
        assert await states(broker, qs) == [(CHUNK, 150 - CHUNK), (0, 1), (0, 151)]
        assert await outbox_sizes(broker, qs) == [0, 0, len(kept)]
        # The reaper pass: too young entries are left to their writer ...
        broker._deliver = deliver  # type: ignore[method-assign]
        broker.handoff_age = 3600
        await broker.recover_stalled()
        assert await states(broker, qs) == [(CHUNK, 150 - CHUNK), (0, 1), (0, 151)]
        # ... old ones are applied: the first chunk's again (no change), the others.
        broker.handoff_age = 0
        await broker.recover_stalled()
        assert await states(broker, qs) == [(150, 0), (0, 1), (150, 1)]
        assert await outbox_sizes(broker, qs) == [0, 0, 0]
        # Every member runs once; the callback gets their results in order.
        claimed: Counter[str] = Counter()
        for q in (qs[0], qs[2]):
            while jobs := await broker.claim([q], 100, worker_id="w", lease=30):
                claimed.update(j.message.id for j in jobs)
                done = [Completion(j.message.id, j.token, j.message.payload) for j in jobs]
                await broker.complete(done)
        assert claimed == Counter(f"hf.m{i}" for i in range(n))
        (cb,) = await broker.claim([qs[1]], 1, worker_id="w", lease=30)
        assert cb.message.id == "hf.0"
        expected = msgspec.msgpack.encode([[i % 100] for i in range(n)])
        assert cb.message.payload == expected


# -- applying a start chunk twice ---------------------------------------------------------


async def test_applying_a_start_chunk_twice_changes_nothing(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xtwo", "t")
    async with broker_at(url, "xtwo", deadline=DEADLINE) as broker:
        kept: list[Handoff] = []
        deliver = broker._deliver

        async def keep(handoffs: Sequence[Handoff]) -> int:
            kept.extend(handoffs)
            return 0

        broker._deliver = keep  # type: ignore[method-assign]
        (outcome,) = await broker.enqueue_flows([spread_spec("tw", qs, 200)])
        assert not isinstance(outcome, Exception)
        chunk = next(h for h in kept if h.entry.split("|")[1] == "A" and h.target == qs[2])
        args = [broker.keys.prefix, qs[2], chunk.record]
        raw: Any = broker._conn()
        waiting = broker.keys.waiting(qs[2], 0)
        assert await broker._eval("flow_apply", [broker.keys.seq(qs[2])], args) == [1]
        counts = await broker.counts(qs[2])
        assert counts[JobState.WAITING] == CHUNK
        listed = await raw.lrange(waiting, 0, -1)
        assert len(listed) == CHUNK
        assert await broker._eval("flow_apply", [broker.keys.seq(qs[2])], args) == [0]
        assert await broker.counts(qs[2]) == counts
        assert await raw.lrange(waiting, 0, -1) == listed
        # The rest, delivered: each chunk once more included, no member twice.
        await deliver(kept)
        assert await states(broker, qs) == [(100, 0), (0, 1), (100, 1)]
        assert await raw.llen(waiting) == 100
        assert await outbox_sizes(broker, qs) == [0, 0, 0]


# -- a refused flow leaves nothing ------------------------------------------------------


async def test_a_flow_refused_in_a_later_chunk_leaves_nothing(
    url: str, redis_cluster: RedisCluster
) -> None:
    qs = one_queue_per_shard(redis_cluster, "xno", "n")
    async with broker_at(url, "xno", max_queue_length=100) as broker:
        raw: Any = broker._conn()
        # qs[0] takes 100 members before it is full: its third chunk (80-119) is refused.
        (outcome,) = await broker.enqueue_flows([spread_spec("full", qs, 300)])
        assert isinstance(outcome, QueueFull)
        assert await totals(broker, qs) == [0, 0, 0]
        assert not await raw.exists(broker.keys.flow(qs[2], "full"))
        # A member's id taken in a later chunk, on a member queue and on the root's.
        for taken, q in (("tk.m130", qs[0]), ("tk2.m131", qs[2])):
            await broker.enqueue([plain(taken, q)])
            flow_id = taken.split(".")[0]
            (outcome,) = await broker.enqueue_flows([spread_spec(flow_id, qs, 200)])
            assert isinstance(outcome, ConfigError)
            assert f"{taken!r} of flow {flow_id!r} is taken" in str(outcome)
            assert not await raw.exists(broker.keys.flow(qs[2], flow_id))
        assert await totals(broker, qs) == [1, 0, 1]  # the two plain jobs only
        records = await broker.get([f"tk.m{i}" for i in range(0, 200, 2) if i != 130], queue=qs[0])
        assert [r is not None for r in records].count(True) == 0
        assert await outbox_sizes(broker, qs) == [0, 0, 0]


async def test_a_chunk_of_sparse_members_spans_a_bounded_range_of_indexes(
    url: str, redis_cluster: RedisCluster
) -> None:
    """Members of one queue few and far between (every 50th on the root's queue): a
    chunk's start reads each index of its range, so a range spans at most 4 chunks'
    worth of indexes."""
    qs = one_queue_per_shard(redis_cluster, "xsparse", "s")
    n = 300
    spec = spread_spec("sp", qs, n)
    members = tuple(
        msgspec.structs.replace(m, queue=qs[2] if i % 50 == 0 else qs[0])
        for i, m in enumerate(spec.members)
    )
    spec = FlowSpec(id="sp", steps=spec.steps, members=members, fan_out=True)
    async with broker_at(url, "xsparse", deadline=DEADLINE) as broker:
        spy = Spy(broker)
        (outcome,) = await broker.enqueue_flows([spec])
        assert not isinstance(outcome, Exception)
        assert all(len(call) == 1 for call in spy.starts())
        ranges = [
            (text(args[1]), *msgspec.msgpack.decode(args[2])[3:5])
            for name, args in spy.calls
            if name == "flow_apply" and msgspec.msgpack.decode(args[2])[0] == "A"
        ]
        assert all(stop - start <= 4 * CHUNK for _, start, stop in ranges)
        assert sorted(r[1:] for r in ranges if r[0] == qs[2]) == [(0, 151), (200, 251)]
        assert await states(broker, qs) == [(n - 6, 0), (0, 1), (6, 1)]
        assert await outbox_sizes(broker, qs) == [0, 0, 0]


async def test_enqueueing_an_ended_fan_out_again_drops_what_its_parts_stored(
    url: str, redis_cluster: RedisCluster
) -> None:
    """The same fan-out again after it completed and its members were removed (as
    retention would). Its own job is there, so the client answers "existed" without
    sending a part; and when it looked before that job was stored (a race, made here by
    hand), the parts store the members again (held, pending) and the root's part, which
    finds the flow ended, drops them a chunk per entry: never left held."""
    qs = one_queue_per_shard(redis_cluster, "xend", "e")
    n = 100
    members = tuple(
        msgspec.structs.replace(plain(f"en.m{i}", qs[0], b"\x91\x01"), task="m") for i in range(n)
    )
    spec = FlowSpec(id="en", steps=(held("en", qs[1], "cb"),), members=members, fan_out=True)
    async with broker_at(url, "xend", deadline=DEADLINE) as broker:
        assert not isinstance((await broker.enqueue_flows([spec]))[0], Exception)
        while jobs := await broker.claim([qs[0]], 100, worker_id="w", lease=30):
            await broker.complete([Completion(j.message.id, j.token, b"\x01") for j in jobs])
        (cb,) = await broker.claim([qs[1]], 1, worker_id="w", lease=30)
        await broker.complete([Completion(cb.message.id, cb.token, b"\x02")])
        ids = [m.id for m in members]
        assert await broker.remove(ids, queue=qs[0]) == [True] * n
        (again,) = await broker.enqueue_flows([spec])
        assert not isinstance(again, Exception)
        assert not again.created
        assert await totals(broker, qs) == [0, 1, 0]
        spy = Spy(broker)

        async def none(specs: Sequence[FlowSpec]) -> set[str]:
            return set()

        broker._flows_stored = none  # type: ignore[method-assign]
        (again,) = await broker.enqueue_flows([spec])
        assert not isinstance(again, Exception)
        assert not again.created
        assert spy.parts() == [CHUNK, CHUNK, n - 2 * CHUNK]  # stored again, then dropped
        drops = [r for call in spy.starts() for r in call if r[5:] == ["d"]]
        # The root's entries (delivered with its reply), then the client's own drops of
        # what its parts stored (which find nothing left): a chunk per script.
        assert [r[3:5] for r in drops] == [[0, 40], [40, 80], [80, 100]] * 2
        assert await totals(broker, qs) == [0, 1, 0]
        assert await broker.get(ids, queue=qs[0]) == [None] * n
        assert await outbox_sizes(broker, qs) == [0, 0, 0]
