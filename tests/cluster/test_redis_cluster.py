"""Redis Cluster (``redis+cluster://``) on a real local cluster: 3 primaries, 3 replicas,
started once per session (tests/conftest.py ``redis_cluster``). The contract suite runs on
it too (the ``cluster-asyncio`` broker parameter); these tests cover what is particular to
a cluster: queues spread over the shards, scripts routed by their declared key, and
exactly-once across worker processes."""

from __future__ import annotations

import time

import anyio
import pytest
import redis.asyncio as aioredis
from anyio.abc import TaskStatus
from redis.crc import key_slot

from tests import redis_app
from tests.redis_harness import (
    RedisCluster,
    RedisProcess,
    failover_slot,
    function_flush,
    kill_pubsub_clients,
    replica_of,
    shard_subscribers,
    slot_owner,
    subscribers,
)
from tests.redis_support import broker_at, message
from tests.support import In, spawn_worker, stop_workers
from typedq import App, ConfigError, Debounce
from typedq.broker.base import BrokerSettings, Completion, FinishOutcome, JobState
from typedq.broker.redis import RedisBroker
from typedq.broker.redis.codec import text
from typedq.broker.redis.health import check_slots
from typedq.broker.redis.keys import Keys
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.cluster, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.fixture
def url(redis_cluster: RedisCluster) -> str:
    """The session Redis Cluster's URL, flushed: this file's own (conftest's ``redis_url``
    is the standalone server)."""
    redis_cluster.flushall()
    return redis_cluster.url


async def keys_per_primary(cluster: RedisCluster) -> dict[int, set[str]]:
    """Every key on each primary (by port), read from the primary itself."""
    found: dict[int, set[str]] = {}
    for port in cluster.primary_ports():
        client = aioredis.Redis(port=port)
        try:
            found[port] = {k.decode() async for k in client.scan_iter("*")}
        finally:
            await client.aclose()
    return found


async def test_the_keys_of_8_queues_spread_over_every_primary(
    url: str, redis_cluster: RedisCluster
) -> None:
    queues = [f"q{i}" for i in range(8)]
    async with broker_at(url, "spread") as broker:
        await broker.enqueue([message(f"j{i}", queue=q) for i, q in enumerate(queues)])
        jobs = await broker.claim(queues, 8, worker_id="w", lease=30)
        assert sorted(j.message.id for j in jobs) == [f"j{i}" for i in range(8)]
        done = await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])
        assert len(done) == 8
        k = broker.keys
        stats = await broker.queue_stats(queues)
        assert [s.counts[JobState.COMPLETED] for s in stats] == [1] * 8
    on = await keys_per_primary(redis_cluster)
    assert len(on) == 3
    holders: dict[str, int] = {}
    for port, names in on.items():
        for q in queues:
            mine = {n for n in names if n.startswith(k.queue_prefix(q).rstrip(":"))}
            if mine:
                # All of a queue's keys on one primary: the one owning its slot.
                assert q not in holders
                holders[q] = port
                assert k.job(q, f"j{queues.index(q)}") in mine
                assert {key_slot(n.encode()) for n in mine} == {key_slot(k.counts(q).encode())}
    assert sorted(holders) == queues
    assert set(holders.values()) == set(on)  # every primary holds some queue
    # The app-wide keys (registries, epoch) are on the app's own slot.
    assert any(k.epoch in names and k.queues in names for names in on.values())


async def test_a_partitioned_queue_spreads_its_jobs_over_every_primary(
    url: str, redis_cluster: RedisCluster
) -> None:
    app = App("parted", broker=url)

    @app.task(queue="emails", partitions=8)
    async def send(x: In) -> None:
        return None

    async with app:
        jobs = await send.enqueue_many(In(i) for i in range(64))
    by_partition = {j.queue for j in jobs}
    assert by_partition == set(app.queues)  # 64 ids reach all 8 partitions
    on = await keys_per_primary(redis_cluster)
    keys = Keys("parted")
    # A waiting job is an entry of its partition's list, its id in that partition's index.
    holders = {
        port
        for port, names in on.items()
        for job in jobs
        if keys.index(send.queue_for(job.id), job.id) in names
    }
    assert holders == set(on)  # every primary holds some of the queue's jobs
    found = sum(
        keys.index(send.queue_for(j.id), j.id) in names for j in jobs for names in on.values()
    )
    assert found == 64  # each job once, on the primary of its partition's slot


async def test_complete_and_claim_over_several_queues_is_one_call_per_queue(url: str) -> None:
    """A multi-queue worker's settle on Cluster: each queue's completions and its share of
    the claim go in one script on that queue's slot, all sent at once; the calls together
    never take more jobs than asked for, and a queue that ran short leaves its share to
    the others (a second round)."""
    queues = ["a", "b", "c", "d"]
    async with broker_at(url, "multi") as broker:
        await broker.enqueue([message(f"{q}{i}", queue=q) for q in queues for i in range(3)])
        await broker.enqueue([message(f"x{i}", queue="a") for i in range(6)])
        held = await broker.claim(queues, 4, worker_id="w", lease=30)
        assert sorted(j.message.queue for j in held) == queues  # a share of 1 each
        done = [Completion(j.message.id, j.token, b"\xc0") for j in held]
        outcomes, jobs = await broker.complete_and_claim(
            done, queues, 8, worker_id="w", lease=30, claim_id="c" * 32
        )
        assert outcomes == [FinishOutcome.OK] * 4
        assert len(jobs) == 8
        assert {j.message.id for j in jobs}.isdisjoint({j.message.id for j in held})
        # Only queue a has jobs left (6): b, c and d run short in the first round and a
        # gives the rest in the second.
        rest = await broker.claim(queues, 8, worker_id="w", lease=30)
        stats = await broker.queue_stats(queues)
        assert sorted(j.message.id for j in rest) == [f"x{i}" for i in range(6)]
        assert sum(s.counts[JobState.ACTIVE] for s in stats) == 14
        assert sum(s.counts[JobState.COMPLETED] for s in stats) == 4
        assert sum(s.counts[JobState.WAITING] for s in stats) == 0
        # A re-sent settle (same claim id) claims nothing more: it answers its jobs again.
        again, jobs_again = await broker.complete_and_claim(
            done, queues, 8, worker_id="w", lease=30, claim_id="c" * 32
        )
        assert again == [FinishOutcome.ALREADY_FINISHED] * 4
        assert sorted(j.message.id for j in jobs_again) == sorted(j.message.id for j in jobs)
        assert sum(s.counts[JobState.ACTIVE] for s in await broker.queue_stats(queues)) == 14


async def test_the_startup_check_names_keys_off_the_queue_slot() -> None:
    keys = Keys("app")
    assert check_slots(keys, ["q0", "emails"]) is None

    class Broken(Keys):
        __slots__ = ()

        def stale(self, queue: str) -> str:
            return f"typedq:{{app}}:{queue}:z"  # forgot the queue's tag

    problem = check_slots(Broken("app"), ["q0"])
    assert problem is not None
    assert "typedq:{app}:q0:z" in problem
    assert "one Redis Cluster slot" in problem

    class AppWideChannel(Keys):
        __slots__ = ()

        def queue_channel(self, queue: str, kind: str) -> str:
            return f"{self.prefix}ev:{kind}"  # a script on q0 could not SPUBLISH there

    problem = check_slots(AppWideChannel("app"), ["q0", "emails"])
    assert problem is not None
    assert "typedq:{app}:ev:w (slot" in problem
    assert "typedq:{app}:ev:x (slot" in problem
    assert "\n" not in problem


async def test_a_bad_cluster_url_is_one_clear_line() -> None:
    app = App("badurl", broker="redis+cluster://127.0.0.1:notaport")
    with pytest.raises(ConfigError, match=r"bad Redis Cluster URL .* is not host:port"):
        async with app:
            pass


def queues_off_the_first_node(cluster: RedisCluster, keys: Keys) -> tuple[str, str]:
    """Two queues whose slots are served by one primary, not the URL's first node (the one
    plain pub/sub would have used)."""
    first = cluster.nodes[0].port
    by_owner: dict[int, list[str]] = {}
    for i in range(100):
        queue = f"q{i}"
        owner = slot_owner(cluster, key_slot(keys.counts(queue).encode()))
        if owner != first:
            found = by_owner.setdefault(owner, [])
            found.append(queue)
            if len(found) == 2:
                return found[0], found[1]
    raise AssertionError("no primary but the first serves two of the queues tried")


async def confirmed(broker: RedisBroker, channels: list[str], times: int) -> None:
    """Until the broker's listener has read ``times`` confirmations of each subscription
    (the first, then one per re-subscription): none is left to wake a waiter later."""
    notes = broker._notes
    with anyio.fail_after(30):
        while any(notes.confirmed.get(c, 0) < times for c in channels):  # noqa: ASYNC110
            await anyio.sleep(0.01)


async def subscribed_on_shard(cluster: RedisCluster, channel: str) -> None:
    """Until exactly one client is subscribed to the sharded ``channel`` in the whole
    cluster (Redis accepts it only on a node of the shard serving its slot: the primary,
    or a replica, which gets the shard's messages too)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        live = [n.port for n in cluster.nodes if n.proc is not None]
        if sum(shard_subscribers(port, channel) for port in live) == 1:
            return
        await anyio.sleep(0.02)
    raise AssertionError(f"not one subscriber to {channel} in the cluster")


async def woken_with_no_poll(
    cluster: RedisCluster,
    worker: RedisBroker,
    producer: RedisBroker,
    queue: str,
    job_id: str,
    *,
    times: int = 1,
) -> None:
    """The worker waits for work on ``queue`` with an hour's poll fallback; the producer
    enqueues ``job_id`` there; only the wake-up can end the wait. Then the job's producer
    waits (an hour, no polling either) for it to finish and is woken when the worker
    completes it, and a cancel request reaches the worker as soon as it is made.

    :param times: the subscriptions were confirmed this many times already (2: once
        re-made)
    """
    keys = worker.keys
    work, cancel = keys.queue_channel(queue, "w"), keys.queue_channel(queue, "x")
    # Subscribed (the first wait may return at once: a new subscription counts as a
    # wake-up), every confirmation read, and a claim finds nothing: the next wait lasts
    # until a notice.
    await worker.wait_for_jobs([queue], 0.01)
    assert await worker.claim([queue], 1, worker_id="w", lease=30) == []
    await confirmed(worker, [work, cancel], times)
    if times > 1:
        await confirmed(producer, [keys.queue_channel(queue, "d")], times)
    for channel in (work, cancel):
        await subscribed_on_shard(cluster, channel)
    assert await worker.claim([queue], 1, worker_id="w", lease=30) == []
    woke = anyio.Event()

    async def wait_for_work() -> None:
        await worker.wait_for_jobs([queue], 3600)
        woke.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(wait_for_work)
        await anyio.sleep(0.2)
        assert not woke.is_set()  # nothing to wake it yet
        await producer.enqueue([message(job_id, queue=queue), message(job_id + "-b", queue=queue)])
        with anyio.fail_after(30):
            await woke.wait()
    jobs = await worker.claim([queue], 2, worker_id="w", lease=30)
    assert sorted(j.message.id for j in jobs) == [job_id, job_id + "-b"]

    async def finished(*, task_status: TaskStatus[None]) -> None:
        record = await producer.wait_finished(job_id, 3600, queue=queue, task_status=task_status)
        assert record is not None
        assert record.state is JobState.COMPLETED

    async def cancel_requested(*, task_status: TaskStatus[None]) -> None:
        await worker.wait_cancel_requests(3600, task_status=task_status)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(finished)
            await tg.start(cancel_requested)
            await producer.cancel(job_id + "-b", queue=queue)
            await worker.complete([Completion(jobs[0].message.id, jobs[0].token, b"\xc0")])
    assert await worker.cancel_requests([job_id + "-b"]) == [job_id + "-b"]


async def test_a_worker_on_another_shard_is_woken_by_sharded_pubsub(
    url: str, redis_cluster: RedisCluster
) -> None:
    """Wake-ups travel on the queue's own shard (SPUBLISH/SSUBSCRIBE), not as a
    cluster-wide PUBLISH through the first node."""
    keys = Keys("wake")
    queue, other = queues_off_the_first_node(redis_cluster, keys)
    async with broker_at(url, "wake") as worker, broker_at(url, "wake") as producer:
        await woken_with_no_poll(redis_cluster, worker, producer, queue, "j1")
        for node in redis_cluster.nodes:
            # No plain subscription anywhere: the app-wide channels are for standalone Redis.
            assert subscribers(node.port, keys.work_channel) == 0
            assert subscribers(node.port, keys.done_channel) == 0
        # A second queue on that node: its one connection holds channels of two slots.
        await worker.wait_for_jobs([other], 0.01)
        await confirmed(worker, [keys.queue_channel(other, "w")], 1)
        # The node drops the pub/sub connections: the listener connects and subscribes
        # every channel again, slot by slot.
        owner = slot_owner(redis_cluster, key_slot(keys.counts(queue).encode()))
        kill_pubsub_clients(owner)
        assert shard_subscribers(owner, keys.queue_channel(queue, "w")) == 0
        await confirmed(worker, [keys.queue_channel(other, "w")], 2)
        await subscribed_on_shard(redis_cluster, keys.queue_channel(other, "w"))
        await woken_with_no_poll(redis_cluster, worker, producer, queue, "j2", times=2)


@pytest.mark.slow
async def test_wake_ups_survive_a_failover_of_the_queue_shard(
    url: str, redis_cluster: RedisCluster
) -> None:
    keys = Keys("wakefo")
    queue, _ = queues_off_the_first_node(redis_cluster, keys)
    slot = key_slot(keys.counts(queue).encode())
    async with (
        broker_at(url, "wakefo", deadline=120) as worker,
        broker_at(url, "wakefo", deadline=120) as producer,
    ):
        await woken_with_no_poll(redis_cluster, worker, producer, queue, "j1")
        old, new = await anyio.to_thread.run_sync(failover_slot, redis_cluster, slot)
        assert old != new
        assert slot_owner(redis_cluster, slot) == new
        # The listeners follow the slot to its new primary by themselves (nothing else
        # was sent to the cluster since the failover).
        await woken_with_no_poll(redis_cluster, worker, producer, queue, "j2", times=2)


async def test_functions_flushed_on_a_primary_mid_run_still_run(
    url: str, redis_cluster: RedisCluster
) -> None:
    """The function library is loaded on every primary at connect (and reaches the
    replicas); a node that lost it (FUNCTION FLUSH, a restart) answers "Function not
    found", the library is loaded again and only the calls that failed are re-sent."""
    queues = [f"q{i}" for i in range(8)]
    async with broker_at(url, "flushed") as broker:
        keys = broker.keys
        name = broker._library.name
        for port in redis_cluster.primary_ports():
            assert await _library_loaded(port, name)
        await broker.enqueue([message(f"a{i}", queue=q) for i, q in enumerate(queues)])
        owner = slot_owner(redis_cluster, key_slot(keys.counts("q0").encode()))
        # Replicas have it by replication, and lose it with their primary.
        replica = replica_of(redis_cluster, owner)
        await _wait_library(replica, name, loaded=True)
        function_flush(owner)
        assert not await _library_loaded(owner, name)
        await _wait_library(replica, name, loaded=False)
        # One call on one queue, then several slots in one pipeline.
        (job,) = await broker.claim(["q0"], 1, worker_id="w", lease=30)
        assert job.message.id == "a0"
        assert await _library_loaded(owner, name)
        function_flush(owner)
        served: dict[int, int] = {}  # primary -> calls of the claim it serves (one per queue)
        for q in queues[1:]:
            port = slot_owner(redis_cluster, key_slot(keys.counts(q).encode()))
            served[port] = served.get(port, 0) + 1
        for port in redis_cluster.primary_ports():
            await _fcalls(port, reset=True)
        jobs = await broker.claim(queues[1:], 7, worker_id="w", lease=30)
        assert sorted(j.message.id for j in jobs) == [f"a{i}" for i in range(1, 8)]
        # Only the calls that met "Function not found" were sent again.
        for port in redis_cluster.primary_ports():
            n = served.get(port, 0)
            assert await _fcalls(port) == ((2 * n, n) if port == owner else (n, 0))
        for port in redis_cluster.primary_ports():
            function_flush(port)
        jobs.append(job)
        done = await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in jobs])
        assert done == [FinishOutcome.OK] * 8
        stats = await broker.queue_stats(queues)
        assert [s.counts[JobState.COMPLETED] for s in stats] == [1] * 8
        assert [s.counts[JobState.ACTIVE] for s in stats] == [0] * 8
        for port in redis_cluster.primary_ports():
            assert await _library_loaded(port, name)
        await _wait_library(replica, name, loaded=True)
        # FCALL is routed by its keys on the client, as EVALSHA is: redis-py alone would
        # ask a node for them first (COMMAND GETKEYS) on every call.
        assert await _getkeys_calls(redis_cluster) == 0  # since the reset above


async def _fcalls(port: int, *, reset: bool = False) -> tuple[int, int]:
    """FCALL (calls, calls that failed) the node on ``port`` served since its last reset."""
    client = aioredis.Redis(port=port)
    try:
        if reset:
            await client.config_resetstat()
        stats = await client.info("commandstats")
    finally:
        await client.aclose()
    fcall = stats.get("cmdstat_fcall", {})
    return int(fcall.get("calls", 0)), int(fcall.get("rejected_calls", 0)) + int(
        fcall.get("failed_calls", 0)
    )


async def _getkeys_calls(cluster: RedisCluster) -> int:
    """``COMMAND GETKEYS`` calls the cluster's nodes served so far."""
    total = 0
    for port in cluster.primary_ports():
        client = aioredis.Redis(port=port)
        try:
            stats = await client.info("commandstats")
        finally:
            await client.aclose()
        total += int(stats.get("cmdstat_command|getkeys", {}).get("calls", 0))
    return total


async def _library_loaded(port: int, name: str) -> bool:
    client = aioredis.Redis(port=port)
    try:
        return bool(await client.function_list(library=name))
    finally:
        await client.aclose()


async def _wait_library(port: int, name: str, *, loaded: bool) -> None:
    """Until the node on ``port`` has (or has not) the library: replication is async."""
    with anyio.fail_after(10):
        while await _library_loaded(port, name) != loaded:  # noqa: ASYNC110 (another node)
            await anyio.sleep(0.01)


async def test_connect_refuses_queue_keys_off_the_queue_slot(url: str) -> None:
    """The startup check reads the queue registry and names each key of a known queue
    that would not map to the queue's one slot."""
    async with broker_at(url, "slots") as broker:
        await broker.enqueue([message("a", queue="emails")])

    class Broken(Keys):
        __slots__ = ()

        def gates(self, queue: str) -> str:
            return f"typedq:{{slots}}:{queue}:G"  # forgot the queue's tag

    broker = RedisBroker(url, BrokerSettings(namespace="slots"))
    broker.keys = Broken("slots")
    with pytest.raises(ConfigError) as caught:
        await broker.connect()
    assert "typedq:{slots}:emails:G" in str(caught.value)
    assert "one Redis Cluster slot" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not broker._notes.is_open  # closed again


@pytest.mark.slow
async def test_two_worker_processes_run_10000_jobs_exactly_once(
    url: str, redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    total = 10_000
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_LEASE": "30",
    }
    procs = [
        spawn_worker("tests.redis_app:app", url, concurrency=16, grace=2, env=env) for _ in range(2)
    ]
    try:
        redis_app.app.use_broker(url)
        async with redis_app.app:
            jobs = await redis_app.work.enqueue_many([redis_app.Work(n=i) for i in range(total)])
            broker = redis_app.app.broker
            deadline = time.monotonic() + 240
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total:
                assert time.monotonic() < deadline, "the workers did not finish in 240 s"
                await anyio.sleep(0.2)
            counts = await broker.counts(DEFAULT_QUEUE)
    finally:
        stop_workers(procs)
        redis_app.app.use_broker("memory://")
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert len(runs) == total
    assert set(runs) == {j.id for j in jobs}
    assert set(runs.values()) == {1}  # exactly once: no job ran twice
    assert counts[JobState.COMPLETED] == total
    # Both processes took part.
    starters = {text(line).split()[1] for line in await ledger.lrange("started", 0, -1)}
    assert len(starters) == 2


@pytest.mark.slow
async def test_a_primary_fails_over_mid_run_and_nothing_is_lost(
    url: str, redis_cluster: RedisCluster, redis_server: RedisProcess, ledger: aioredis.Redis
) -> None:
    """``CLUSTER FAILOVER`` of the primary holding the queue while 2 worker processes run
    its jobs: every job completes, and none runs twice except by an expired lease (a
    manual failover loses no write, so here: none at all)."""
    total = 3000
    env = {
        "TYPEDQ_TEST_LEDGER": f"redis://127.0.0.1:{redis_server.port}/1",
        "TYPEDQ_TEST_LEASE": "30",
    }
    procs = [
        spawn_worker("tests.redis_app:app", url, concurrency=8, grace=2, env=env) for _ in range(2)
    ]
    try:
        redis_app.app.use_broker(url)
        async with redis_app.app:
            broker = redis_app.app.broker
            assert isinstance(broker, RedisBroker)
            jobs = await redis_app.work.enqueue_many(
                [redis_app.Work(n=i, sleep=0.002) for i in range(total)]
            )
            deadline = time.monotonic() + 240
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total // 4:
                assert time.monotonic() < deadline
                await anyio.sleep(0.05)
            slot = key_slot(broker.keys.counts(DEFAULT_QUEUE).encode())
            old, new = await anyio.to_thread.run_sync(failover_slot, redis_cluster, slot)
            assert old != new
            while (await broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] < total:
                assert time.monotonic() < deadline, "the workers did not finish in 240 s"
                await anyio.sleep(0.2)
            counts = await broker.counts(DEFAULT_QUEUE)
            assert await broker.check_epoch()  # no loss of data reported
    finally:
        stop_workers(procs)
        redis_app.app.use_broker("memory://")
    runs = {text(k): int(v) for k, v in (await ledger.hgetall("runs")).items()}
    assert set(runs) == {j.id for j in jobs}
    assert set(runs.values()) == {1}
    assert counts[JobState.COMPLETED] == total
    assert counts[JobState.FAILED] == 0


async def test_a_claim_over_queues_of_several_slots_takes_as_many_jobs_as_asked(url: str) -> None:
    """A claim over queues on several slots counts each slot's jobs by the claim answer's
    fields per job: a queue that gave its full share and one that ran short leave the
    rest to a second round, and the claim takes exactly what was asked for."""
    async with broker_at(url, "count") as broker:
        await broker.enqueue([message(f"a{i}", queue="a") for i in range(20)])
        await broker.enqueue([message(f"b{i}", queue="b") for i in range(2)])
        held = await broker.claim(["a", "b"], 16, worker_id="w", lease=30)
        assert len(held) == 16
        assert sorted(j.message.id for j in held if j.message.queue == "b") == ["b0", "b1"]
        assert len({j.message.id for j in held}) == 16


async def test_unique_and_debounce_markers_live_in_the_task_queues_slot(
    url: str, redis_cluster: RedisCluster
) -> None:
    app = App("marks", broker=url)

    @app.task(queue="orders", key=lambda m: str(m.n), unique_for=60)
    async def charge(m: In) -> None:
        pass

    @app.task(queue="edits", debounce=Debounce(key=lambda m: str(m.n), wait=30))
    async def render(m: In) -> None:
        pass

    with anyio.fail_after(20):
        async with app:
            held = await charge.enqueue(In(7))
            assert not (await charge.enqueue(In(7))).created
            await render.enqueue(In(3))
    keys = Keys("marks")
    expected = {
        keys.unique("orders", "charge|7"): keys.queue_prefix("orders"),
        keys.unique_job("orders", held.id): keys.queue_prefix("orders"),
        keys.debounce("edits", "render|3"): keys.queue_prefix("edits"),
    }
    found = set().union(*(await keys_per_primary(redis_cluster)).values())
    for marker, prefix in expected.items():
        assert marker in found
        assert key_slot(marker.encode()) == key_slot(prefix.encode())
