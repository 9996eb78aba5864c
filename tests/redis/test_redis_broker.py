"""The Redis broker beyond the shared contract: round trips, idempotent re-sends,
fencing, bad bytes in Redis, function library flushes, connection settings, ACLs.

Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import redis.asyncio as aioredis
from anyio.abc import TaskStatus

from tests import redis_support
from tests.redis_harness import RedisProcess, redis_process
from tests.redis_support import Item, message, raw_redis
from typedq import App, BrokerError, BrokerUnavailable, FailureReason, JobFailed, JobState
from typedq.broker.base import (
    BrokerSettings,
    CancelOutcome,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    JobRecord,
    LeaseStatus,
    Release,
    Retention,
    RetryOutcome,
)
from typedq.broker.redis import CONNECT_TIMEOUT, RETRIES, SOCKET_TIMEOUT, RedisBroker
from typedq.broker.redis import health as redis_health
from typedq.broker.redis.codec import encode_body
from typedq.broker.redis.scripts import PARTS, build_library, read_scripts
from typedq.errors import FailureRecord
from typedq.names import new_job_id
from typedq.task import DEFAULT_QUEUE

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@contextlib.asynccontextmanager
async def broker_at(url: str, name: str = "rb", **settings: Any) -> AsyncIterator[RedisBroker]:
    async with redis_support.broker_at(url, name, deadline=30, **settings) as broker:
        yield broker


async def fcall_calls(raw: aioredis.Redis) -> int:
    stats = await raw.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


@contextlib.asynccontextmanager
async def client_commands(url: str) -> AsyncIterator[list[str]]:
    """Names of the commands clients send while the block runs (MONITOR, scripts' own
    commands left out): the real round trips."""
    seen: list[str] = []
    async with raw_redis(url) as raw, raw.monitor() as monitor:
        yield seen
        await raw.echo("typedq-monitor-end")
        while True:
            command = await monitor.next_command()
            if command["command"] == "ECHO typedq-monitor-end":
                break
            if command["client_type"] != "lua":
                seen.append(command["command"].split()[0].upper())


# -- layout ---------------------------------------------------------------------------


async def test_lua_key_names_match_the_keys_module(redis_url: str) -> None:
    # tests/keys.lua answers the names the shared parts (common/*.lua) derive: its own
    # library, built from the installed parts by the broker's builder, loaded for this test.
    parts = read_scripts()
    lib = build_library(
        {
            **{name: parts[name] for name in PARTS},
            "keys.lua": (Path(__file__).parents[1] / "keys.lua").read_text("utf-8"),
        }
    )
    async with broker_at(redis_url, "layout") as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute("FUNCTION", "LOAD", "REPLACE", lib.source)
        try:
            names = await execute(
                "FCALL",
                lib.functions["keys"],
                0,
                *(k.prefix, "q1", "-3", "job-1", "tok1", "c|t1|k:1", "t1", "k:1", "29000000"),
            )
        finally:
            await execute("FUNCTION", "DELETE", lib.name)
        assert [n.decode() for n in names] == [
            k.job("q1", "job-1"),
            k.levels("q1"),
            k.waiting("q1", -3),
            k.scheduled("q1"),
            k.counts("q1"),
            k.stale("q1"),
            k.request("q1", "tok1"),
            k.work_channel,
            k.done_channel,
            k.cancel_channel,
            k.active("q1"),
            k.done("q1", "c"),
            k.done("q1", "f"),
            k.done("q1", "x"),
            k.seq("q1"),
            k.queue_epoch("q1"),
            k.flow("q1", "job-1"),
            k.worker("job-1"),
            k.index("q1", "job-1"),
            k.gates("q1"),
            k.gate("q1", "c|t1|k:1"),
            k.rate("q1", "t1", "k:1"),
            k.slots("q1", "t1", "k:1"),
            k.minute("q1", 29000000),
            k.events("q1"),
            k.events_config("q1"),
            k.queue_channel("q1", "w"),
            k.queue_channel("q1", "d"),
            k.queue_channel("q1", "x"),
            k.outbox("q1"),
            k.handoff("q1", "job-1|m"),
            k.waiter("q1"),
            k.run("q1", "job-1"),
            k.run_log("q1", "job-1"),
            k.run_outcomes("q1", "job-1"),
            k.run_signals("q1", "job-1"),
            k.run_inbox("q1", "job-1", "sig"),
            k.runs_done("q1", "c"),
            k.unique("q1", "t1|k:1"),
            k.unique_job("q1", "job-1"),
            k.debounce("q1", "t1|k:1"),
            k.job_stream("q1", "job-1"),
            k.lane("q1", "t1", "k:1", -3),
            k.lanes("q1"),
            k.lanes_changed("q1"),
            k.staged("q1", "job-1"),
            k.releasing("q1"),
        ]
        # Every key of a queue carries the queue's hash tag, nothing else's.
        assert all(n.decode().startswith("tq:{layout:q1}") for n in names[:7])
        # So do the unique and debounce markers (Redis Cluster: in the queue's slot).
        assert all(n.decode().startswith("tq:{layout:q1}:") for n in names[-3:])
    async with raw_redis(redis_url) as raw:
        async with broker_at(redis_url, "layout") as broker:
            await broker.enqueue([message("a"), message("b", queue="other", priority=2)])
            await broker.enqueue([message("c", queue="other"), message("d")])
            (job,) = await broker.claim(["other"], 1, worker_id="w", lease=30)
            assert await broker.cancel("d") is CancelOutcome.CANCELLED
        keys = {k.decode() async for k in raw.scan_iter("*")}
        # Request records (a minute's TTL): two enqueues, the claim, the cancel.
        requests = {k for k in keys if ":r:" in k}
        assert len(requests) == 4
        assert all(0 < ttl <= 60_000 for ttl in [await raw.pttl(k) for k in requests])
        keys -= requests
        # One hash tag per queue (its cluster slot); the app's few keys under the app's.
        k = broker.keys
        assert keys == {
            k.epoch,
            k.queues,
            k.queue_epoch("q"),
            k.queue_epoch("other"),
            k.seq("q"),
            k.seq("other"),
            k.active("other"),
            k.done("q", "x"),
            k.index("q", "a"),
            k.job("other", "b"),
            k.index("other", "c"),
            k.job("q", "d"),
            k.levels("q"),
            k.waiting("q", 0),
            k.levels("other"),
            k.waiting("other", 0),
            k.counts("q"),
            k.counts("other"),
            k.queues,
        }
        # The queue registry learned both queues from the enqueues (no worker ran).
        assert await raw.smembers(k.queues) == {b"q", b"other"}
        for key in keys - {k.epoch, k.queues}:
            assert key.startswith(("tq:{layout:q}", "tq:{layout:other}"))
        # Waiting jobs are entries of their level list (no key of their own, their ids in
        # the index); the claimed and the cancelled one are hashes.
        assert job.message.id == "b"
        queue_of = {"a": "q", "b": "other", "c": "other", "d": "q"}
        types = {i: await raw.type(k.job(queue_of[i], i)) for i in "abcd"}
        assert types == {"a": b"none", "b": b"hash", "c": b"none", "d": b"hash"}
        assert await raw.hget(k.index("q", "a"), "a") == b"1"
        assert await raw.hget(k.index("other", "c"), "c") == b"2"
        # The cancelled job's entry stays behind as '|' (no stale count): a's is live.
        entries = [e for e in await raw.lrange(k.waiting("q", 0), 0, -1) if isinstance(e, bytes)]
        assert entries[0] == b"|"
        assert entries[1].startswith(b"a|1|")
        epoch = await raw.get(k.epoch)
        assert isinstance(epoch, bytes)
        assert epoch.count(b"-") == 1


def bench_like(job_id: str, **fields: Any) -> JobMessage:
    """The benchmarks' ~100-byte payload (bench/redis_bench.py's) in an envelope."""
    payload = msgspec.msgpack.encode(
        {"user_id": 1, "email": "user0000001@example.com", "tags": ["a", "b"], "note": "x" * 40}
    )
    fields = {"task": "noop", "queue": "q", "fingerprint": "fb1c496797e98824", **fields}
    return JobMessage(id=job_id, payload=payload, **fields)


async def test_a_waiting_job_is_one_list_entry_until_claimed(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        m = bench_like(new_job_id())
        key = broker.keys.job("q", m.id)
        await broker.enqueue([m])
        assert await raw.type(key) == b"none"
        listed = await raw.lrange(broker.keys.waiting("q", 0), 0, -1)
        (entry,) = [e for e in listed if isinstance(e, bytes)]
        # '<id>|<order>|<enqueued_at>|<run_at>|<body>': the list names the queue and the
        # priority; the body does not repeat the id.
        head, body = entry.split(b"||", 1)
        job_id, order, enqueued = head.split(b"|")
        assert (job_id, order) == (m.id.encode(), b"1")
        assert int(enqueued) / 1e6 == pytest.approx(time.time(), abs=60)
        assert m.id.encode() not in body
        assert await raw.hget(broker.keys.index("q", m.id), m.id) == b"1"
        (record,) = await broker.get([m.id])
        assert record is not None
        assert record.message == m
        assert (record.state, record.attempt, record.stalls) == (JobState.WAITING, 0, 0)
        assert record.enqueued_at == pytest.approx(time.time(), abs=60)
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert job.message == m
        assert job.attempt == 1
        assert job.enqueued_at == record.enqueued_at
        assert await raw.type(key) == b"hash"
        (active,) = await broker.get([m.id])
        assert active is not None
        assert active.message == m
        assert (active.state, active.worker_id) == (JobState.ACTIVE, "w")
        assert active.enqueued_at == record.enqueued_at


async def test_every_envelope_field_survives_each_form(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        waiting = bench_like("w1", priority=-2, max_retries=5, timeout=2.5)
        scheduled = bench_like("s1", priority=3, delay=0.2, fingerprint="")
        at = bench_like("e1", eta=time.time() + 3600, max_retries=0, timeout=0.0)
        await broker.enqueue([waiting, scheduled, at])
        records = await broker.get(["w1", "s1", "e1"])
        assert [r.message if r else None for r in records] == [waiting, scheduled, at]
        assert [r.state if r else None for r in records] == [
            JobState.WAITING,
            JobState.SCHEDULED,
            JobState.SCHEDULED,
        ]
        assert records[2] is not None
        assert records[2].run_at == pytest.approx(at.eta, abs=1e-3)
        await anyio.sleep(0.3)
        # The scheduled job string is promoted (a waiting entry now) and claimed first
        # (priority 3).
        jobs = await broker.claim(["q"], 5, worker_id="w", lease=30)
        assert [j.message for j in jobs] == [scheduled, waiting]
        assert {j.message.id: j.message.priority for j in jobs} == {"s1": 3, "w1": -2}


async def test_cancelling_a_job_string_leaves_a_job_hash(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([bench_like("w1"), bench_like("s1", delay=60, priority=4)])
        assert await broker.cancel("w1") == CancelOutcome.CANCELLED
        assert await broker.cancel("s1") == CancelOutcome.CANCELLED
        assert await broker.cancel("s1") == CancelOutcome.ALREADY_FINAL
        for job_id in ("w1", "s1"):
            assert await raw.type(broker.keys.job("q", job_id)) == b"hash"
            (record,) = await broker.get([job_id])
            assert record is not None
            assert record.state is JobState.CANCELLED
            assert record.message == bench_like(
                job_id, **({"delay": 60, "priority": 4} if job_id == "s1" else {})
            )
            assert record.error is not None
        assert await raw.zcard(broker.keys.scheduled("q")) == 0
        counts = await broker.counts("q")
        assert (counts[JobState.WAITING], counts[JobState.SCHEDULED]) == (0, 0)
        assert counts[JobState.CANCELLED] == 2
        # Retried, the cancelled hash is waiting again and runs with its priority.
        assert [o.value for o in await broker.retry(["s1", "w1"])] == ["retried", "retried"]
        jobs = await broker.claim(["q"], 5, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == ["s1", "w1"]


async def test_entries_job_strings_and_job_hashes_wait_in_one_queue(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message(f"j{i}") for i in range(4)])
        (first,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.release([Release("j0", first.token)])  # a hash again at the head
        # A waiting job string with a bare entry, as versions before waiting entries wrote.
        body = encode_body(message("j4"))
        await raw.set(k.job("q", "j4"), b"w|9|1700000000000000|||" + body)
        await raw.lpush(k.waiting("q", 0), "j4")
        await raw.hincrby(k.counts("q"), "w", 1)
        types = [await raw.type(k.job("q", f"j{i}")) for i in range(5)]
        assert types == [b"hash", b"none", b"none", b"none", b"string"]
        waiting = ["j0", "j1", "j2", "j3", "j4"]
        assert await broker.list_jobs("q", JobState.WAITING) == waiting
        records = await broker.get(waiting, queue="q")
        assert [r.message if r else None for r in records] == [message(i) for i in waiting]
        assert [r.state if r else None for r in records] == [JobState.WAITING] * 5
        assert records[4] is not None
        assert records[4].enqueued_at == 1_700_000_000
        removed = await broker.remove(["j0", "j2", "j4"], states=[JobState.WAITING])
        assert removed == [True, True, True]
        assert await broker.list_jobs("q", JobState.WAITING) == ["j1", "j3"]
        assert await broker.purge("q", [JobState.WAITING]) == 2
        assert await broker.get(["j0", "j1", "j2", "j3", "j4"]) == [None] * 5
        assert sum((await broker.counts("q")).values()) == 0
        # Nothing left behind: no index, no list, no stale counts that outlive a claim.
        assert await broker.claim(["q"], 10, worker_id="w", lease=30) == []
        left = {key.decode() async for key in raw.scan_iter("tq:{*")}
        left = {key for key in left if ":r:" not in key}  # request records (60 s)
        # (and the waiter mark the empty claim set: the next work on q is announced)
        assert left == {k.seq("q"), k.queue_epoch("q"), k.counts("q"), k.waiter("q")}


async def test_waiting_entries_are_found_wherever_hand_backs_and_levels_put_them(
    redis_url: str,
) -> None:
    """get, cancel and remove find a waiting entry by its order: by interpolation in a
    list of dense orders, by binary search where other levels' orders leave gaps, by a
    scan where hand-backs (bare ids at the head) stop the search. Every path answers the
    job's own body and time, and the claim order stays FIFO."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        first = [bench_like(f"a{i}", fingerprint=f"fa{i}") for i in range(300)]
        await broker.enqueue(first)
        # 100 claimed and handed back: job hashes, bare ids at the head, in their order.
        claimed = await broker.claim(["q"], 100, worker_id="w", lease=30)
        outcomes = await broker.release([Release(j.message.id, j.token) for j in claimed])
        assert outcomes == [FinishOutcome.OK] * 100
        # Jobs of two levels in turn: each level's orders have gaps.
        mixed = [
            bench_like(f"b{i}", priority=2 * (i % 2), fingerprint=f"fb{i}") for i in range(400)
        ]
        await broker.enqueue(mixed)
        levels = await raw.lrange(k.waiting("q", 0), 0, -1)
        assert len(levels) == 300 + 200
        assert levels[-1] == b"a0"  # handed back: a bare id, the job a hash
        # Every job read back whole, wherever its entry is.
        every = first + mixed
        records = await broker.get([m.id for m in every], queue="q")
        assert [r.message if r else None for r in records] == every
        assert all(r is not None and r.state is JobState.WAITING for r in records)
        times = {r.message.id: r.enqueued_at for r in records if r is not None}
        assert len(set(times.values())) == 2  # two enqueue calls
        # Cancel and remove from the middle of each kind of stretch.
        gone = ["a50", "a150", "a299", "b1", "b200", "b399"]
        for job_id in gone[:3]:
            assert await broker.cancel(job_id, queue="q") is CancelOutcome.CANCELLED
        assert await broker.remove(gone[3:], queue="q") == [True] * 3
        (cancelled,) = await broker.get(["a150"], queue="q")
        assert cancelled is not None
        assert cancelled.state is JobState.CANCELLED
        assert cancelled.message == first[150]
        assert cancelled.enqueued_at == times["a150"]
        # The claim order: level 2 first, then level 0, each in enqueue order.
        order = [m.id for m in mixed if m.priority == 2]
        order += [m.id for m in first] + [m.id for m in mixed if m.priority == 0]
        order = [i for i in order if i not in gone]
        jobs = await broker.claim(["q"], 1000, worker_id="w", lease=30)
        assert [j.message.id for j in jobs] == order
        by_id = {m.id: m for m in every}
        assert all(j.message == by_id[j.message.id] for j in jobs)
        counts = await broker.counts("q")
        assert (counts[JobState.WAITING], counts[JobState.ACTIVE]) == (0, len(order))
        assert (counts[JobState.CANCELLED], await raw.exists(k.waiting("q", 0))) == (3, 0)


async def test_a_stale_entry_never_claims_a_job_from_another_queue(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a", queue="q1")])
        assert await broker.remove(["a"]) == [True]
        # The same id again, elsewhere: q1 still holds the removed job's list entry.
        await broker.enqueue([message("a", queue="q2")])
        assert await broker.claim(["q1"], 5, worker_id="w", lease=30) == []
        (job,) = await broker.claim(["q2"], 5, worker_id="w", lease=30)
        assert job.message == message("a", queue="q2")
        assert (await broker.counts("q2"))[JobState.ACTIVE] == 1
        assert sum((await broker.counts("q1")).values()) == 0


async def test_records_of_the_previous_layout_are_still_read(redis_url: str) -> None:
    """Before job strings, every job was a hash whose ``m`` held the whole JobMessage."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        old = message("old-1", priority=2)
        await raw.hset(
            k.job("q", "old-1"),
            mapping={"m": msgspec.msgpack.encode(old), "q": "q", "s": "w", "o": 1, "e": 1, "p": 2},
        )
        await raw.lpush(k.waiting("q", 2), "old-1")
        await raw.zadd(k.levels("q"), {"2": -2})
        await raw.hset(k.counts("q"), "w", 1)
        (record,) = await broker.get(["old-1"], queue="q")
        assert record is not None
        assert record.message == old
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert job.message == old


async def test_a_job_failed_before_the_error_history_reads_its_last_record(redis_url: str) -> None:
    """A job hash written before ``eh`` existed (or garbage there): its one record is its
    history; a later failure appends to it."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message("old-2")])
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.fail([Failure(id="old-2", token=job.token, error=b"new", retry_delay=0.0)])
        await raw.hdel(k.job("q", "old-2"), "eh")
        (record,) = await broker.get(["old-2"])
        assert record is not None
        assert record.errors == (b"new",)
        await raw.hset(k.job("q", "old-2"), "eh", b"garbage")
        (record,) = await broker.get(["old-2"])
        assert record is not None
        assert record.errors == (b"new",)
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.fail([Failure(id="old-2", token=job.token, error=b"next")])
        (record,) = await broker.get(["old-2"])
        assert record is not None
        assert record.errors == (b"new", b"next")


async def test_enqueue_checks_its_arguments_before_writing(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        k = broker.keys
        await broker.enqueue([message("a")])
        before = {key async for key in raw.scan_iter("*")}
        seq = await raw.get(k.seq("q"))
        good = ["b", "q", "0", 0, 0, b"\x92\xa1t\xc4\x00"]
        bad = ["c", "bad|queue", "0", 0, 0, b"\x92\xa1t\xc4\x00"]
        with pytest.raises(BrokerError, match="malformed arguments"):
            await broker._eval("enqueue", [k.seq("q")], [k.prefix, 0, 2, *good, *bad])
        assert {key async for key in raw.scan_iter("*")} == before
        assert await raw.get(k.seq("q")) == seq


# -- round trips ----------------------------------------------------------------------


async def test_concurrent_single_enqueues_are_coalesced(redis_url: str) -> None:
    app = App("coalesce", broker=redis_url)

    @app.task
    async def noop(item: Item) -> None:
        return None

    async with app, raw_redis(redis_url) as raw:
        await raw.config_resetstat()
        async with anyio.create_task_group() as tg:
            for i in range(1000):
                tg.start_soon(noop.enqueue, Item(n=i))
        calls = await fcall_calls(raw)
        counts = await app.broker.counts(DEFAULT_QUEUE)
    assert counts[JobState.WAITING] == 1000
    assert calls <= 50, f"1000 concurrent enqueues took {calls} script calls"


async def test_enqueue_many_has_no_per_job_round_trip(redis_url: str) -> None:
    app = App("bulk", broker=redis_url)

    @app.task
    async def noop(item: Item) -> None:
        return None

    async with app:
        async with client_commands(redis_url) as sent:
            jobs = await noop.enqueue_many([Item(n=i) for i in range(10_000)])
        counts = await app.broker.counts(DEFAULT_QUEUE)
    assert len({j.id for j in jobs}) == 10_000
    assert counts[JobState.WAITING] == 10_000
    # One script call per chunk of 500, and the first use of the queue (the queue
    # registry and the queue's epoch); besides, only the handshakes of the few pooled
    # connections that send the chunks concurrently.
    assert sent.count("FCALL") == 20 + 1
    assert sent.count("SADD") == 1
    others = [c for c in sent if c not in ("FCALL", "SADD")]
    assert set(others) <= {"HELLO", "CLIENT", "PING", "SELECT"}
    assert len(others) <= 40


# -- calls per job --------------------------------------------------------------------


async def test_a_worker_makes_one_script_call_per_job_in_the_steady_state(redis_url: str) -> None:
    """Concurrency 1 with jobs waiting: each job costs one script call (its completion
    and the claim of the next job are one claim script) and no other round trip; the
    lease, recovery and heartbeat calls are periodic, not per job."""
    app = App("steady", broker=redis_url)
    ran = 0
    # Jobs 50 and 350 wait in their handler until let go: nothing is sent while they
    # wait, so the commands watched in between are those of jobs 51 to 350 exactly.
    reached = {50: anyio.Event(), 350: anyio.Event()}
    go = {50: anyio.Event(), 350: anyio.Event()}

    @app.task
    async def noop(item: Item) -> None:
        nonlocal ran
        ran += 1
        if ran in reached:
            reached[ran].set()
            await go[ran].wait()

    async with app:
        await noop.enqueue_many([Item(n=i) for i in range(400)])
        with anyio.fail_after(60):
            async with app.worker(concurrency=1):
                await reached[50].wait()
                async with client_commands(redis_url) as sent:
                    go[50].set()
                    await reached[350].wait()
                go[350].set()
    scripts = sent.count("FCALL")
    # 300 jobs: the settle of each of jobs 50 to 349 claims the next one. A periodic
    # call (lease renewal, recovery pass, worker heartbeat) may fall in the window too.
    assert 300 <= scripts <= 303, f"{scripts} script calls for 300 jobs"
    others = [c for c in sent if c != "FCALL"]
    assert len(others) <= 3, f"round trips besides scripts: {others}"


async def test_complete_and_claim_over_several_queues_is_one_script_call(redis_url: str) -> None:
    """Standalone Redis: completions on several queues (a partitioned queue's worker) and
    the claim that refills their slots are one script call."""
    queues = ["q.p0", "q.p1", "q.p2"]
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message(f"{q}-{i}", queue=q) for q in queues for i in range(2)])
        held = await broker.claim(queues, 3, worker_id="w", lease=30)
        assert len({j.message.queue for j in held}) >= 2
        before = await fcall_calls(raw)
        outcomes, jobs = await broker.complete_and_claim(
            [Completion(j.message.id, j.token, b"\xc0") for j in held],
            queues,
            3,
            worker_id="w",
            lease=30,
        )
        assert await fcall_calls(raw) - before == 1
        assert outcomes == [FinishOutcome.OK] * 3
        everything = {f"{q}-{i}" for q in queues for i in range(2)}
        assert {j.message.id for j in jobs} == everything - {j.message.id for j in held}
        for job in held:
            (record,) = await broker.get([job.message.id], queue=job.message.queue)
            assert record is not None
            assert record.state is JobState.COMPLETED
        stats = await broker.queue_stats(queues)
        assert sum(s.counts[JobState.ACTIVE] for s in stats) == 3
        assert sum(s.counts[JobState.WAITING] for s in stats) == 0


# -- idempotent re-sends (a lost reply, then the client's automatic retry) ------------


async def test_resent_enqueue_creates_nothing(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        batch = [message(f"j{i}") for i in range(100)]
        first = await broker.enqueue(batch)
        again = await broker.enqueue(batch)
        assert all(o.created for o in first)
        assert not any(o.created for o in again)
        assert (await broker.counts("q"))[JobState.WAITING] == 100


async def test_resent_claim_returns_the_same_jobs(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message(f"j{i}") for i in range(10)])
        # The same claim token twice: what a re-sent EVALSHA looks like to Redis.
        monkeypatch.setattr(
            "typedq.broker.redis.broker.secrets.token_hex", lambda _: "feedfacefeedface"
        )
        first = await broker.claim(["q"], 4, worker_id="w", lease=30)
        again = await broker.claim(["q"], 4, worker_id="w", lease=30)
        assert [c.message.id for c in first] == ["j0", "j1", "j2", "j3"]
        assert [(c.message.id, c.token, c.attempt) for c in again] == [
            (c.message.id, c.token, c.attempt) for c in first
        ]
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 4
        assert counts[JobState.WAITING] == 6
        monkeypatch.undo()
        fresh = await broker.claim(["q"], 4, worker_id="w", lease=30)
        assert [c.message.id for c in fresh] == ["j4", "j5", "j6", "j7"]


async def test_resent_complete_answers_already_finished(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a")])
        (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        done = [Completion("a", job.token, b"r1")]
        assert await broker.complete(done) == [FinishOutcome.OK]
        assert await broker.complete(done) == [FinishOutcome.ALREADY_FINISHED]
        (record,) = await broker.get(["a"])
        assert record is not None
        assert record.state is JobState.COMPLETED
        assert record.result == b"r1"
        assert (await broker.counts("q"))[JobState.COMPLETED] == 1


# -- fencing --------------------------------------------------------------------------


async def test_taken_over_lease_cannot_complete(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        await broker.enqueue([message("a")])
        (stale,) = await broker.claim(["q"], 1, worker_id="w1", lease=0.2)
        await anyio.sleep(0.3)
        assert await broker.recover_stalled() == 1
        (owner,) = await broker.claim(["q"], 1, worker_id="w2", lease=30)
        assert owner.attempt == 2
        assert owner.stalls == 1
        assert await broker.renew([("a", stale.token)], 30) == [LeaseStatus.LOST]
        assert await broker.complete([Completion("a", stale.token, b"stale")]) == [
            FinishOutcome.LEASE_LOST
        ]
        (record,) = await broker.get(["a"])
        assert record is not None
        assert record.state is JobState.ACTIVE
        assert record.result is None
        assert await broker.complete([Completion("a", owner.token, b"mine")]) == [FinishOutcome.OK]
        assert await broker.complete([Completion("a", stale.token, b"stale")]) == [
            FinishOutcome.LEASE_LOST
        ]
        (record,) = await broker.get(["a"])
        assert record is not None
        assert record.result == b"mine"


async def test_concurrent_reapers_recover_each_job_once(redis_url: str) -> None:
    async with broker_at(redis_url, max_stalls=5) as broker:
        await broker.enqueue([message(f"j{i}") for i in range(500)])
        await broker.claim(["q"], 500, worker_id="w", lease=0.1)
        await anyio.sleep(0.2)
        results: list[int] = []

        async def reap() -> None:
            while (n := await broker.recover_stalled(limit=50)) > 0:
                results.append(n)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(reap)
        assert sum(results) == 500
        jobs = await broker.claim(["q"], 1000, worker_id="w", lease=30)
        assert len(jobs) == 500
        assert {(j.attempt, j.stalls) for j in jobs} == {(2, 1)}


# -- bytes in Redis that typedq did not write -------------------------------------------


async def test_garbage_in_job_and_queue_keys_fails_those_jobs_only(redis_url: str) -> None:
    app = App("garbage", broker=redis_url, lease=5)
    ran: list[int] = []

    @app.task
    async def record(item: Item) -> None:
        ran.append(item.n)

    async with app, raw_redis(redis_url) as raw:
        broker = app.broker
        assert isinstance(broker, RedisBroker)
        keys = broker.keys
        # A waiting job hash (claimed once, handed back) whose body is garbage.
        bad_field = await record.enqueue(Item(n=100))
        (claimed,) = await broker.claim([DEFAULT_QUEUE], 1, worker_id="w", lease=30)
        assert await broker.release([Release(bad_field.id, claimed.token)]) == [FinishOutcome.OK]
        assert await raw.type(keys.job(DEFAULT_QUEUE, bad_field.id)) == b"hash"
        await raw.hset(keys.job(DEFAULT_QUEUE, bad_field.id), "m", b"\xc1\xff not msgpack")
        before = await record.enqueue_many([Item(n=i) for i in range(5)])
        # A waiting entry with a well-formed header and a garbage body.
        bad_body = await record.enqueue(Item(n=102))
        waiting = keys.waiting(DEFAULT_QUEUE, 0)
        entry = await raw.lindex(waiting, 0)
        assert isinstance(entry, bytes)
        assert entry.startswith(bad_body.id.encode() + b"|")
        header = entry.split(b"||", 1)[0] + b"||"
        await raw.lset(waiting, 0, header + b"\x93garbage")  # type: ignore[arg-type]
        # A waiting job string of the previous layout (a bare id in the list) replaced
        # by bytes that are no job record at all.
        bad_key = "junk-2"
        await raw.set(keys.job(DEFAULT_QUEUE, bad_key), b"\x80garbage")
        await raw.lpush(waiting, bad_key)
        await raw.hincrby(keys.counts(DEFAULT_QUEUE), "w", 1)
        # Ids pushed straight into the queue: one with no job, one with junk bytes, and
        # entries that are not even that.
        await raw.set(keys.job(DEFAULT_QUEUE, "junk-1"), b"{not a job")
        await raw.lpush(waiting, "ghost-1", "junk-1", "|", "ghost-2|x|y")
        assert (await broker.get([bad_body.id]))[0] is not None
        assert await broker.get([bad_key]) == [None]
        async with app.worker(concurrency=4):
            for job in before:
                await job.result(timeout=10)
            for job_id in (bad_field.id, bad_body.id, bad_key, "junk-1"):
                with pytest.raises(JobFailed) as failed:
                    await record.job(job_id).result(timeout=10)
                assert failed.value.reason is FailureReason.DECODE_ERROR
                assert failed.value.record.error_type == "DecodeError"
                assert job_id in failed.value.record.message
            after = await record.enqueue(Item(n=7))
            await after.result(timeout=10)
        assert await broker.get(["ghost-1"]) == [None]
        counts = await broker.counts(DEFAULT_QUEUE)
    assert sorted(ran) == [0, 1, 2, 3, 4, 7]
    assert counts[JobState.FAILED] == 4
    assert counts[JobState.COMPLETED] == 6
    assert counts[JobState.WAITING] == counts[JobState.ACTIVE] == 0


async def test_function_flush_mid_run_is_invisible(redis_url: str) -> None:
    app = App("flush", broker=redis_url, lease=5)

    @app.task
    async def noop(item: Item) -> None:
        return None

    async with app, raw_redis(redis_url) as raw:

        async def flusher() -> None:
            # Every 30 ms: some 80-100 flushes in a run. Every 10 ms kept the server
            # busy loading the library (~13 ms a load): ~950 loads made the test ~21 s.
            while True:
                await raw.function_flush()
                await anyio.sleep(0.03)

        await raw.config_resetstat()
        async with app.worker(concurrency=16), anyio.create_task_group() as tg:
            tg.start_soon(flusher)
            jobs = []
            for start in range(0, 2000, 100):
                jobs += await noop.enqueue_many([Item(n=i) for i in range(start, start + 100)])
            for job in jobs:
                await job.result(timeout=20)
            tg.cancel_scope.cancel()
        assert (await app.broker.counts(DEFAULT_QUEUE))[JobState.COMPLETED] == 2000
        # The flushes landed mid-run: calls met "Function not found" and loaded it again
        # (~80 loads here; a few at least even where the run takes a tenth of the time).
        loads = (await raw.info("commandstats"))["cmdstat_function|load"]["calls"]
        assert loads >= 5


# -- throughput rollups -----------------------------------------------------------------


async def test_rollups_are_one_write_per_queue_per_script_call(redis_url: str) -> None:
    """A batch of completions and failures adds to its queue's minute hash once per
    counter, not once per job, and the hash expires (bounded history)."""
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message(f"r{i}") for i in range(60)])
        jobs = await broker.claim(["q"], 60, worker_id="w", lease=30)
        await raw.config_resetstat()
        done = [Completion(j.message.id, j.token, b"\xc0") for j in jobs[:50]]
        assert await broker.complete(done) == [FinishOutcome.OK] * 50
        stats = await raw.info("commandstats")
        expires = stats.get("cmdstat_expire", {}).get("calls", 0)
        increments = stats["cmdstat_hincrby"]["calls"]
        # One EXPIRE for the minute hash; HINCRBY: the rollup's 'c' and the counts' two
        # states (active -1, completed +1), whatever the batch size.
        assert expires == 1
        assert increments == 3
        failures = [
            Failure(id=j.message.id, token=j.token, error=b"e", retry_delay=None if i % 2 else 0.0)
            for i, j in enumerate(jobs[50:])
        ]
        await broker.fail(failures)
        (minutes,) = await broker.history(["q"], minutes=2)
        assert sum(m.completed for m in minutes) == 50
        assert sum(m.failed for m in minutes) == 5
        assert sum(m.retried for m in minutes) == 5
        minute_keys = [k async for k in raw.scan_iter(broker.keys.minute("q", 0)[:-1] + "*")]
        assert minute_keys
        for key in minute_keys:
            assert 24 * 3600 < await raw.ttl(key) <= 25 * 3600


# -- retention ------------------------------------------------------------------------


async def test_retention_bounds_finished_jobs(redis_url: str) -> None:
    retention = Retention(completed_max=50, failed_max=20)
    async with broker_at(redis_url, retention=retention) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message(f"j{i}") for i in range(300)])
        while jobs := await broker.claim(["q"], 64, worker_id="w", lease=30):
            await broker.complete([Completion(j.message.id, j.token, b"") for j in jobs])
        counts = await broker.counts("q")
        assert counts[JobState.COMPLETED] == 50
        assert await raw.zcard(broker.keys.done("q", "c")) == 50
        # The newest 50 are kept, the rest are gone for good.
        assert (await broker.get(["j299"]))[0] is not None
        assert await broker.get(["j0"]) == [None]
        # Besides the jobs, only the fixed keys and request records (which expire).
        requests = [k async for k in raw.scan_iter(broker.keys.request("q", "*"))]
        assert await raw.dbsize() - len(requests) < 60
        assert all(0 < ttl <= 60_000 for ttl in [await raw.pttl(k) for k in requests])


# -- connection behaviour -------------------------------------------------------------


async def test_client_settings_are_explicit(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        pool = broker._conn().connection_pool
        kwargs = pool.connection_kwargs
        assert kwargs["socket_timeout"] == SOCKET_TIMEOUT
        assert kwargs["socket_connect_timeout"] == CONNECT_TIMEOUT
        assert kwargs["socket_keepalive"] is True
        assert kwargs["health_check_interval"] > 0
        assert kwargs["retry"].get_retries() == RETRIES
        assert isinstance(pool, aioredis.BlockingConnectionPool)


async def test_cancelled_command_does_not_corrupt_the_connection(redis_url: str) -> None:
    async with broker_at(redis_url) as broker:
        ids = [f"j{i}" for i in range(10)]
        await broker.enqueue([message(i) for i in ids])
        execute: Any = broker._conn().execute_command
        for i in range(20):
            with anyio.move_on_after(0.005):
                await execute("DEBUG", "SLEEP", "0.03")
            job_id = ids[i % len(ids)]
            (record,) = await broker.get([job_id])
            assert record is not None
            assert record.message.id == job_id


async def require_password(server: RedisProcess, password: str) -> None:
    # Set after start: the harness checks readiness with a PING that has no AUTH.
    async with raw_redis(server.url) as raw:
        await raw.config_set("requirepass", password)


async def test_unreachable_redis_fails_fast_without_the_password() -> None:
    with redis_process() as server:
        await require_password(server, "s3cret-pw")
        url = f"redis://:s3cret-pw@127.0.0.1:{server.port}/0"
        async with broker_at(url, "down") as broker:
            assert "s3cret-pw" not in repr(broker)
            await broker.enqueue([message("a")])
            server.kill()
            start = time.monotonic()
            with pytest.raises(BrokerUnavailable) as caught:
                await broker.enqueue([message("b")])
            assert time.monotonic() - start < 15
            assert f"127.0.0.1:{server.port}" in str(caught.value)
            assert "s3cret-pw" not in str(caught.value)
        wrong = RedisBroker(
            f"redis://:nope@127.0.0.1:{server.port}/0", BrokerSettings(namespace="x")
        )
        with pytest.raises(BrokerUnavailable):
            await wrong.connect()


async def test_wrong_password_is_a_clear_error() -> None:
    with redis_process() as server:
        await require_password(server, "s3cret-pw")
        broker = RedisBroker(
            f"redis://:wrong-pw@127.0.0.1:{server.port}/0", BrokerSettings(namespace="x")
        )
        with pytest.raises(BrokerError) as caught:
            await broker.connect()
        assert "wrong-pw" not in str(caught.value)
        assert f"127.0.0.1:{server.port}" in str(caught.value)


async def test_eviction_policy_warning(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    async with raw_redis(redis_url) as raw:
        await raw.config_set("maxmemory-policy", "allkeys-lru")
        try:
            with caplog.at_level(logging.WARNING, logger="typedq.broker.redis"):
                async with broker_at(redis_url):
                    pass
        finally:
            await raw.config_set("maxmemory-policy", "noeviction")
    assert "allkeys-lru" in caplog.text
    assert "noeviction" in caplog.text


async def test_persistence_warning(redis_url: str, caplog: pytest.LogCaptureFixture) -> None:
    # The session server runs with `--appendonly no --save ""`: no persistence at all.
    redis_health.WARNED.clear()  # warned once per process and address: maybe already
    with caplog.at_level(logging.WARNING, logger="typedq.broker.redis"):
        async with broker_at(redis_url):
            pass
    (warning,) = [r for r in caplog.records if "persistence" in r.getMessage()]
    assert warning.levelname == "WARNING"
    assert "a restart loses every job" in warning.getMessage()
    assert "appendonly yes" in warning.getMessage()
    caplog.clear()
    with redis_process(appendonly=True) as server, caplog.at_level(logging.WARNING):
        async with broker_at(server.url):
            pass
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_rdb_only_persistence_warning(caplog: pytest.LogCaptureFixture) -> None:
    with redis_process() as server:
        async with raw_redis(server.url) as raw:
            await raw.save()
        with caplog.at_level(logging.WARNING, logger="typedq.broker.redis"):
            async with broker_at(server.url):
                pass
    (warning,) = [r for r in caplog.records if "appendonly" in r.getMessage()]
    assert "RDB snapshots only" in warning.getMessage()


async def test_waiters_survive_a_pubsub_reconnect(redis_url: str) -> None:
    async with broker_at(redis_url) as broker, raw_redis(redis_url) as raw:
        await broker.enqueue([message("a")])
        got: list[JobState | None] = []

        async def wait(*, task_status: TaskStatus[None]) -> None:
            record = await broker.wait_finished("a", 10, task_status=task_status)
            got.append(None if record is None else record.state)

        async with anyio.create_task_group() as tg:
            await tg.start(wait)  # subscribed
            await raw.client_kill_filter(_type="pubsub")
            await anyio.sleep(0.2)
            (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
            await broker.complete([Completion("a", job.token, b"")])
        assert got == [JobState.COMPLETED]

        # Work notifications also come back after the subscriber connection dies.
        assert await broker.claim(["q"], 1, worker_id="w", lease=30) == []
        await raw.client_kill_filter(_type="pubsub")
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.5)
                await broker.enqueue([message("b")])

            tg.start_soon(enqueue_later)
            start = time.monotonic()
            while not await broker.claim(["q"], 1, worker_id="w", lease=30):
                await broker.wait_for_jobs(["q"], 10)
            assert time.monotonic() - start < 5


async def test_a_refill_does_not_hide_work_from_the_next_wait(redis_url: str) -> None:
    """Work published after a worker's claim is not hidden from its next wait by a refill
    (a completion's claim) that took only part of it: the wait returns at once instead of
    sleeping with a job waiting and a slot free."""
    async with broker_at(redis_url) as broker:
        await broker.wait_for_jobs(["q"], 0.2)  # subscribed to the work channel
        await broker.enqueue([message("x")])
        (held,) = await broker.claim(["q"], 4, worker_id="w", lease=30)  # the worker's claim
        await broker.enqueue([message("a")])
        await broker.enqueue([message("b")])
        await anyio.sleep(0.2)  # their notices have arrived
        _, refilled = await broker.complete_and_claim(
            [Completion("x", held.token, b"")], ["q"], 1, worker_id="w", lease=30
        )
        assert [j.message.id for j in refilled] == ["a"]
        start = time.monotonic()
        await broker.wait_for_jobs(["q"], 5)
        assert time.monotonic() - start < 2  # "b" waits: no sleeping through it
        assert [j.message.id for j in await broker.claim(["q"], 4, worker_id="w", lease=30)] == [
            "b"
        ]


async def test_least_privilege_acl_user(redis_url: str, redis_server: RedisProcess) -> None:
    async with raw_redis(redis_url) as raw:
        execute: Any = raw.execute_command  # untyped in redis-py
        await execute(
            "ACL", "SETUSER", "app1", "reset", "on", ">pw1", "~typedq:{app1}:*",
            "~tq:{app1:*", "&typedq:{app1}:*", "-@all", "+@read", "+@write", "+@scripting",
            "+@connection", "+@pubsub", "-@dangerous", "+time", "+info",
        )  # fmt: skip
        try:
            user_url = f"redis://app1:pw1@127.0.0.1:{redis_server.port}/0"
            async with broker_at(user_url, "app1") as broker:
                await broker.enqueue([message("a")])
                (job,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
                assert await broker.renew([("a", job.token)], 30) == [LeaseStatus.OK]

                finished: list[JobRecord | None] = []

                async def wait(*, task_status: TaskStatus[None]) -> None:
                    finished.append(await broker.wait_finished("a", 5, task_status=task_status))

                async with anyio.create_task_group() as tg:
                    await tg.start(wait)  # subscribed (the done channel is in the ACL)
                    await broker.complete([Completion("a", job.token, b"ok")])
                (record,) = finished
                assert record is not None
                assert record.state is JobState.COMPLETED
                assert await broker.recover_stalled() == 0
            with pytest.raises(BrokerError, match="ACL"):
                async with broker_at(user_url, "app2") as other:
                    await other.enqueue([message("x")])
        finally:
            await execute("ACL", "DELUSER", "app1")


async def test_stalled_job_fails_with_a_decodable_record(redis_url: str) -> None:
    async with broker_at(redis_url, max_stalls=0) as broker:
        await broker.enqueue([message("a")])
        await broker.claim(["q"], 1, worker_id="w-lost", lease=0.05)
        await anyio.sleep(0.1)
        assert await broker.recover_stalled() == 1
        (record,) = await broker.get(["a"])
        assert record is not None
        assert record.state is JobState.FAILED
        assert record.error is not None
        failure = msgspec.msgpack.decode(record.error, type=FailureRecord)
        assert failure.reason is FailureReason.STALLED
        assert failure.error_type == "WorkerLost"
        assert failure.worker_id == "w-lost"
        assert failure.attempt == 1
        assert failure.failed_at == pytest.approx(time.time(), abs=60)


async def test_a_job_id_is_unique_per_queue(redis_url: str) -> None:
    """A job is found through its queue: one id may name a job in each of two queues;
    a queue hint finds each, and without one the first queue by name answers."""
    async with broker_at(redis_url, "perqueue") as broker:
        created = await broker.enqueue([message("same", queue="b"), message("same", queue="a")])
        assert [o.created for o in created] == [True, True]
        # Dedup by id holds within a queue.
        assert [o.created for o in await broker.enqueue([message("same", queue="a")])] == [False]
        (in_a,) = await broker.get(["same"], queue="a")
        (in_b,) = await broker.get(["same"], queue="b")
        assert in_a is not None
        assert in_b is not None
        assert (in_a.message.queue, in_b.message.queue) == ("a", "b")
        (either,) = await broker.get(["same"])
        assert either is not None
        assert either.message.queue == "a"
        assert await broker.cancel("same", queue="b") is CancelOutcome.CANCELLED
        assert (await broker.counts("a"))[JobState.WAITING] == 1
        # An unknown id, with or without its queue.
        assert await broker.get(["nope"]) == [None]
        assert await broker.cancel("nope") is CancelOutcome.NOT_FOUND
        assert await broker.retry(["nope"], queue="a") == [RetryOutcome.NOT_FOUND]
