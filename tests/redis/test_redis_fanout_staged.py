"""Large fan-outs on Redis, stored in bounded steps (typedq/broker/redis/staging.py,
issue 31): their members are staged a chunk per script, the flow is stored, then its
members are released a chunk per script.

The contract suite (tests/contract/test_workflows.py) holds for staged fan-outs too (it
passes with STAGE_MEMBERS patched to 2); these look at the steps themselves: a staged
fan-out completes with its callback once, members that were only staged are never
claimable and expire, a release its client left is finished by the reaper or by a
re-sent enqueue, and a re-sent fan-out is stored once.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.redis_support import raw_redis, server_url
from tests.support import TEST_DEADLINE
from typedq import App, Failed, FailureReason, JobFailed, JobState, Ok
from typedq.broker.base import ClaimedJob, Completion
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import encode_body
from typedq.broker.redis.flows import flow_args
from typedq.broker.redis.keys import Keys
from typedq.broker.redis.staging import STAGE_MEMBERS, STAGE_TTL, chunks

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Members per staging chunk in these tests (the default is STAGE_MEMBERS).
SMALL = 4


class N(msgspec.Struct, frozen=True):
    n: int


class Total(msgspec.Struct, frozen=True):
    total: int


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage a fan-out of more than SMALL members, SMALL per chunk."""
    monkeypatch.setattr("typedq.broker.redis.flows.STAGE_MEMBERS", SMALL)
    monkeypatch.setattr("typedq.broker.redis.staging.STAGE_MEMBERS", SMALL)


def _app(name: str, url: str) -> tuple[App, Any, Any, list[int]]:
    """An app with a member task ``double`` and a fan-in callback ``add`` that notes each
    of its runs in the returned list."""
    app = App(name, broker=url)
    runs: list[int] = []

    @app.task
    async def double(x: N) -> N:
        return N(x.n * 2)

    @app.task
    async def add(xs: list[N]) -> Total:
        runs.append(len(xs))
        return Total(sum(x.n for x in xs))

    return app, double, add, runs


async def _staged_keys(raw: Any, keys: Keys, queue: str) -> list[bytes]:
    """The staging hashes of ``queue`` (``Q fg:<flow>``) and its releasing zset, if any."""
    found = [k async for k in raw.scan_iter(keys.staged(queue, "*"))]
    if await raw.exists(keys.releasing(queue)):
        found.append(keys.releasing(queue).encode())
    return found


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_a_fan_out_past_one_chunk_completes_with_its_callback_once(
    request: pytest.FixtureRequest, backend: str, small_chunks: None
) -> None:
    url = server_url(request, backend)
    app, double, add, runs = _app("stagedone", url)
    keys = Keys("stagedone")
    size = 5 * SMALL + 3  # six chunks, the last one short
    calls: list[str] = []
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        send = broker._eval_pipelined

        async def spy(batch: Any) -> list[Any]:
            calls.extend(name for name, _, _ in batch)
            return await send(batch)

        broker._eval_pipelined = spy  # type: ignore[method-assign,assignment]
        job = await double.map(N(i) for i in range(size)).then(add).enqueue()
        assert calls == ["flow_stage"] * 6 + ["flow_enqueue"] + ["flow_open"] * 6
        counts = await broker.counts("default")
        assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (size, 1)
        if backend == "redis":
            async with raw_redis(url) as raw:
                assert await _staged_keys(raw, keys, "default") == []
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=4):
                assert await job.result(timeout=20) == Total(sum(2 * i for i in range(size)))
    assert runs == [size]  # the callback ran once, with every member's result


async def test_a_staged_fan_out_keeps_input_order(redis_server: RedisProcess) -> None:
    """Past the default chunk: members are claimed, and fanned in, in input order."""
    flushall(redis_server.port)
    app, double, _, _ = _app("stageorder", redis_server.url)
    size = 2 * STAGE_MEMBERS + 17
    async with app:
        broker = app.broker
        job = await double.map(N(i) for i in range(size)).enqueue(job_id="big")
        claimed: list[ClaimedJob] = []
        while len(claimed) < size:
            got = await broker.claim(["default"], 200, worker_id="w", lease=30)
            assert got
            claimed += got
        assert [c.message.id for c in claimed] == [f"big.m{i}" for i in range(size)]
        done = [
            Completion(c.message.id, c.token, double.output.encode(N(i * 2)))
            for i, c in enumerate(claimed)
        ]
        for start in range(0, size, 100):
            await broker.complete(done[start : start + 100][::-1])
        assert await job.result(timeout=10) == [N(i * 2) for i in range(size)]


async def _stage(broker: RedisBroker, spec: Any, upto: int | None = None) -> None:
    """Send the staging chunks of fan-out ``spec`` (the first ``upto`` of them: a client
    that stopped there)."""
    queue, root = spec.members[0].queue, spec.steps[-1].queue
    bodies = [encode_body(m) for m in spec.members]
    ranges = chunks([len(b) for b in bodies])[:upto]
    seq = [broker.keys.seq(queue)]
    ttl = round(STAGE_TTL * 1000)
    await broker._eval_pipelined(
        [
            ("flow_stage", seq, [broker.keys.prefix, queue, spec.id, root, ttl, a, *bodies[a:b]])
            for a, b in ranges
        ]
    )


async def _store(broker: RedisBroker, spec: Any) -> Any:
    """Send the store step of staged fan-out ``spec`` alone (no release after it)."""
    args, _ = flow_args(spec, staged=True)
    return await broker._eval_pipelined([broker._flow_call([spec], args)])


async def test_a_fan_out_staged_but_not_stored_is_never_claimable_and_expires(
    redis_server: RedisProcess, small_chunks: None
) -> None:
    """A client that stops between staging chunks leaves only the staging hash: no job
    to claim, count or get, no flow; it expires; enqueueing the flow again stores it."""
    flushall(redis_server.port)
    app, double, add, runs = _app("stagecrash", redis_server.url)
    keys = Keys("stagecrash")
    size = 3 * SMALL
    fan = double.map(N(i) for i in range(size)).then(add)
    spec = fan.spec(job_id="crash")
    async with app, raw_redis(redis_server.url) as raw:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await _stage(broker, spec, upto=2)  # two of three chunks, then the client died
        staged = keys.staged("default", "crash")
        assert await raw.hlen(staged) == 2 * SMALL
        assert 0 < await raw.pttl(staged) <= STAGE_TTL * 1000
        assert await broker.claim(["default"], 100, worker_id="w", lease=30) == []
        counts = await broker.counts("default")
        assert sum(counts.values()) == 0
        ids = ["crash", *(f"crash.m{i}" for i in range(size))]
        assert await broker.get(ids, queue="default") == [None] * len(ids)
        assert await broker.flow_state("crash", queue="default") is None
        # Sent again in full (same id): stored once, and nothing staged is left.
        job = await fan.enqueue(job_id="crash")
        assert job.created
        assert await _staged_keys(raw, keys, "default") == []
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=4):
                assert await job.result(timeout=20) == Total(sum(2 * i for i in range(size)))
    assert runs == [size]


async def test_a_release_its_client_left_is_finished_by_the_reaper(
    redis_server: RedisProcess, small_chunks: None
) -> None:
    """Stored but not released (the client died before its release calls): the flow
    waits for its staged members; the reaper releases them once the release made no
    step for a while (here: its last step's time set back), and the callback runs once."""
    flushall(redis_server.port)
    app, double, add, runs = _app("stagereap", redis_server.url)
    keys = Keys("stagereap")
    size = 2 * SMALL + 1
    spec = double.map(N(i) for i in range(size)).then(add).spec(job_id="reap")
    async with app, raw_redis(redis_server.url) as raw:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await _stage(broker, spec)
        assert await _store(broker, spec) == [[1]]
        state = await broker.flow_state("reap", queue="default")
        assert state is not None
        assert (state.members, state.pending) == (size, size)
        assert await broker.claim(["default"], 100, worker_id="w", lease=30) == []
        releasing = keys.releasing("default")
        assert await raw.zcard(releasing) == 1
        await broker.recover_stalled()  # a step was made just now: not due yet
        counts = await broker.counts("default")
        assert counts[JobState.WAITING] == 0
        await raw.zadd(releasing, {"default|reap": 0})  # its last step, long ago
        await broker.recover_stalled()
        counts = await broker.counts("default")
        assert counts[JobState.WAITING] == size  # (200 per pass: all of them)
        assert await _staged_keys(raw, keys, "default") == []
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=4):
                assert await add.job("reap").result(timeout=20) == Total(
                    sum(2 * i for i in range(size))
                )
    assert runs == [size]


async def test_a_resent_fan_out_is_stored_once_and_finishes_a_left_release(
    redis_server: RedisProcess, small_chunks: None
) -> None:
    """A re-sent enqueue of a staged fan-out (same id) answers created=False and stores
    nothing twice; one whose first copy stopped before its release finishes it."""
    flushall(redis_server.port)
    app, double, add, runs = _app("stageagain", redis_server.url)
    keys = Keys("stageagain")
    size = 3 * SMALL + 2
    fan = double.map(N(i) for i in range(size)).then(add)
    async with app, raw_redis(redis_server.url) as raw:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        # A first copy that stopped after its store step.
        spec = fan.spec(job_id="again")
        await _stage(broker, spec)
        assert await _store(broker, spec) == [[1]]
        job = await fan.enqueue(job_id="again")
        assert not job.created
        counts = await broker.counts("default")
        assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (size, 1)
        assert await _staged_keys(raw, keys, "default") == []
        # Once more, whole: nothing changes.
        again = await fan.enqueue(job_id="again")
        assert not again.created
        assert await broker.counts("default") == counts
        assert await _staged_keys(raw, keys, "default") == []
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=4):
                assert await job.result(timeout=20) == Total(sum(2 * i for i in range(size)))
    assert runs == [size]


async def test_a_fan_out_cancelled_before_its_release_drops_its_staged_members(
    redis_server: RedisProcess, small_chunks: None
) -> None:
    flushall(redis_server.port)
    app, double, add, runs = _app("stagecancel", redis_server.url)
    keys = Keys("stagecancel")
    size = 2 * SMALL + 1
    spec = double.map(N(i) for i in range(size)).then(add).spec(job_id="gone")
    async with app, raw_redis(redis_server.url) as raw:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await _stage(broker, spec)
        assert await _store(broker, spec) == [[1]]
        await broker.cancel("gone", queue="default")
        (own,) = await broker.get(["gone"], queue="default")
        assert own is not None
        assert own.state is JobState.CANCELLED
        left = await broker._eval(
            "flow_open",
            [broker.keys.seq("default")],
            [broker.keys.prefix, "default", "default", "gone", 100],
        )
        assert left == 0
        assert await _staged_keys(raw, keys, "default") == []
        assert await broker.claim(["default"], 100, worker_id="w", lease=30) == []
        ids = [f"gone.m{i}" for i in range(size)]
        assert await broker.get(ids, queue="default") == [None] * size
    assert runs == []


async def test_a_member_id_taken_between_staging_and_release_breaks_the_flow(
    redis_server: RedisProcess, small_chunks: None
) -> None:
    """Staging checks the members' ids; a job that takes one before its release (a
    producer racing the enqueue) keeps it, and that member fails with ``flow_broken``
    (as a member removed before it ran): the fan-in fails once the rest settled."""
    flushall(redis_server.port)
    app, double, add, runs = _app("stagetaken", redis_server.url)
    size = 2 * SMALL + 1
    spec = double.map(N(i) for i in range(size)).then(add).spec(job_id="race")
    async with app:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        await _stage(broker, spec)
        other = await double.enqueue(N(100), job_id="race.m5")
        assert other.created
        assert await _store(broker, spec) == [[1]]
        left = await broker._eval(
            "flow_open",
            [broker.keys.seq("default")],
            [broker.keys.prefix, "default", "default", "race", 100],
        )
        assert left == 0
        counts = await broker.counts("default")
        assert counts[JobState.WAITING] == size  # the other job and size - 1 members
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=4):
                with pytest.raises(JobFailed) as caught:
                    await add.job("race").result(timeout=20)
                assert await other.result(timeout=20) == N(200)
    assert caught.value.record.reason is FailureReason.FLOW_BROKEN
    assert runs == []


async def test_a_fan_in_of_several_blocks_keeps_every_outcome_in_order(
    redis_server: RedisProcess,
) -> None:
    """Past 1000 members the fan-in's elements are joined a block of 1000 at a time as
    each block settles (flow_settle.lua), and the fan-in joins the blocks: a collecting
    callback still gets every member's outcome, in input order, once."""
    flushall(redis_server.port)
    app = App("stageblocks", broker=redis_server.url)
    size = 2 * 1000 + 37
    runs: list[list[Ok[N] | Failed]] = []

    class Odd(Exception):
        pass

    @app.task(retries=0)
    async def check(x: N) -> N:
        if x.n % 7 == 3:
            raise Odd(str(x.n))
        return N(x.n)

    @app.task
    async def report(xs: list[Ok[N] | Failed]) -> Total:
        runs.append(xs)
        return Total(sum(1 for x in xs if isinstance(x, Ok)))

    async with app:
        job = await check.map(N(i) for i in range(size)).collect(report).enqueue()
        with anyio.fail_after(TEST_DEADLINE):
            async with app.worker(concurrency=32):
                total = await job.result(timeout=60)
    assert len(runs) == 1
    (outcomes,) = runs
    assert [isinstance(x, Failed) for x in outcomes] == [i % 7 == 3 for i in range(size)]
    assert [x.value.n for x in outcomes if isinstance(x, Ok)] == [
        i for i in range(size) if i % 7 != 3
    ]
    assert total == Total(sum(1 for i in range(size) if i % 7 != 3))
