"""The Redis commands each steady-state script makes, pinned (issue 13): a worker's claim
that settles its last job, an enqueue, a completion; per call and per extra job of a
batch. A command more per job is Redis CPU on every job, so it fails here and must be
chosen on purpose (then update the lists below).

The commands are read with MONITOR (a script's own commands are the ones of its ``lua``
client). Every test talks to a real redis-server spawned by the suite (never :6379).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest

from tests.redis_support import broker_at, message, raw_redis
from typedq.broker.base import Completion, FinishOutcome, JobMessage, JobState, Retention
from typedq.broker.redis import RedisBroker

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]


@pytest.fixture
def url(redis_url: str) -> str:
    """conftest's ``redis_url`` under the name this file's tests take (their parameter
    becomes ``redis_url`` with the next edit of their pins, not in a fixture change)."""
    return redis_url


@contextlib.asynccontextmanager
async def script_commands(url: str) -> AsyncIterator[list[str]]:
    """Names of the commands scripts make while the block runs (MONITOR's ``lua``
    client), in order."""
    seen: list[str] = []
    async with raw_redis(url) as raw, raw.monitor() as monitor:
        yield seen
        await raw.echo("typedq-monitor-end")
        while True:
            command = await monitor.next_command()
            if command["command"] == "ECHO typedq-monitor-end":
                break
            if command["client_type"] == "lua":
                seen.append(command["command"].split()[0].upper())


async def commands_of(url: str, call: Callable[[], Awaitable[Any]]) -> Counter[str]:
    """How many of each command the scripts of ``call`` make. A rollup hash's first write
    in a minute also sets its TTL (EXPIRE): left out, a minute may start mid-test."""
    async with script_commands(url) as seen:
        await call()
    return Counter(c for c in seen if c != "EXPIRE")


#: A worker's steady state: one claim that completes its last job and claims the next.
SETTLE_AND_CLAIM_ONE = Counter(
    {
        "TIME": 1,
        # the completion: the job's fields; the queue's events config and unique flag
        # (once per queue); out of active, the job hash, into done
        "HMGET": 2,
        "ZREM": 1,
        "HSET": 2,  # the completed job; the claimed job
        "ZADD": 2,  # into done; into active
        "HGET": 1,  # the index entry
        # retention (count and age bounds, once per queue and call)
        "ZCARD": 1,
        "ZCOUNT": 1,
        # the claim: its record, the scheduled set's head (nothing due: no
        # ZRANGEBYSCORE; a short claim's next due time reads it no more), gates, best
        # level, pop, index
        "GET": 1,
        "EXISTS": 1,
        "ZRANGE": 2,
        "RPOP": 1,
        "HDEL": 1,
        "SET": 1,
        # counts (waiting -1, completed +1; active nets to 0), the minute's rollup
        "HINCRBY": 3,
        "PUBLISH": 1,
    }
)
#: Each more job of a settle-and-claim batch: the completion's and the claim's own work
#: (a batch writes the active and completed sets once per call, not once per job).
SETTLE_AND_CLAIM_PER_JOB = Counter({"HMGET": 1, "HSET": 2, "HGET": 1, "HDEL": 1})
#: Enqueue of one waiting job.
ENQUEUE_ONE = Counter(
    {
        "GET": 1,  # its request record (a re-sent call's answer)
        "TIME": 1,
        # no job key of that id (one EXISTS for up to 500 ids) ..., and no idle worker
        # registered for a direct hand-off (the queue's H hash: one per call)
        "EXISTS": 2,
        "INCRBY": 1,
        "HSETNX": 1,  # ... and its index field, written where missing
        # onto a level list that holds jobs already, so its level is listed (no ZADD;
        # onto an empty one, the ZADD of its level follows)
        "LPUSH": 1,
        "SET": 1,
        "HINCRBY": 1,
        # the queue's waiter mark (absent: no worker waits, so no work notice is published)
        "DEL": 1,
    }
)
#: Each more waiting job of a batch: its index field (the job keys' EXISTS is per call).
ENQUEUE_PER_JOB = Counter({"HSETNX": 1})
#: complete.lua of one job (a worker whose claim loop does not settle).
COMPLETE_ONE = Counter(
    {
        "TIME": 1,
        "HMGET": 2,  # the job's fields; the queue's events config and unique flag
        "ZREM": 1,
        "HSET": 1,
        "ZADD": 1,
        "ZCARD": 1,
        "ZCOUNT": 1,
        "HINCRBY": 3,  # active -1, completed +1, the rollup
        "PUBLISH": 1,
    }
)
#: (A batch writes the active and completed sets once per call, not once per job.)
COMPLETE_PER_JOB = Counter({"HMGET": 1, "HSET": 1})


def _per_job(batch: Counter[str], one: Counter[str], extra: int) -> Counter[str]:
    """Commands per job beyond the first of a batch of 1 + ``extra`` jobs."""
    diff = batch.copy()
    diff.subtract(one)
    assert all(n % extra == 0 for n in diff.values()), diff
    return Counter({k: n // extra for k, n in diff.items() if n})


async def _settle_and_claim(url: str, broker: RedisBroker, n: int) -> Counter[str]:
    """Commands of one steady-state settle-and-claim of ``n`` jobs (after one that warmed
    up the queue: its counts, rollup and records exist)."""
    await broker.enqueue([message(f"j{n}-{i}") for i in range(3 * n)])
    held = await broker.claim(["q"], n, worker_id="w", lease=30)
    for _ in range(2):
        items = [Completion(j.message.id, j.token, b"\xc0") for j in held]
        outcomes: list[FinishOutcome] = []

        async def call(items: list[Completion] = items) -> None:
            nonlocal held, outcomes
            outcomes, held = await broker.complete_and_claim(
                items, ["q"], n, worker_id="w", lease=30
            )

        seen = await commands_of(url, call)
        assert outcomes == [FinishOutcome.OK] * n
        assert len(held) == n
    return seen


async def test_a_settle_and_claim_makes_the_pinned_commands(url: str) -> None:
    async with broker_at(url, "cost") as broker:
        one = await _settle_and_claim(url, broker, 1)
        assert one == SETTLE_AND_CLAIM_ONE, f"commands per call: {sorted(one.items())}"
        four = await _settle_and_claim(url, broker, 4)
        per_job = _per_job(four, one, 3)
        assert per_job == SETTLE_AND_CLAIM_PER_JOB, f"per job: {sorted(per_job.items())}"
        assert sum(one.values()) == 22
        assert sum(per_job.values()) == 5


async def test_a_short_claim_reads_the_scheduled_set_and_the_levels_once(url: str) -> None:
    """A claim that comes up short (the queue drained: a worker that keeps up) answers
    its next due time from the look that found nothing due (nothing scheduled, or a job
    not due yet), not from a second read; and it drains its queue's only level without a
    second look at the levels. With two levels it looks again, and takes from both."""
    async with broker_at(url, "cost") as broker:
        await broker.enqueue([message("warm")])
        await broker.claim(["q"], 1, worker_id="w", lease=30)
        await broker.enqueue([message("a")])
        short = await commands_of(url, lambda: broker.claim(["q"], 4, worker_id="w", lease=30))
        # (ZRANGE: the scheduled set's head; the levels, once: the one it drained was the
        # only one, so no second look finds none left)
        assert (short["ZRANGE"], short["ZRANGEBYSCORE"]) == (2, 0), sorted(short.items())
        later_job = JobMessage(id="later", task="t", queue="q", payload=b"\x91\x01", delay=600.0)
        await broker.enqueue([later_job])
        await broker.enqueue([message("b")])
        held: list[Any] = []

        async def claim() -> None:
            held.extend(await broker.claim(["q"], 4, worker_id="w", lease=30))

        later = await commands_of(url, claim)
        assert (later["ZRANGE"], later["ZRANGEBYSCORE"]) == (2, 0), sorted(later.items())
        assert [j.message.id for j in held] == ["b"]
        await broker.enqueue([message("c"), message("hi", priority=5)])
        two = await broker.claim(["q"], 4, worker_id="w", lease=30)
        assert [j.message.id for j in two] == ["hi", "c"]


async def test_an_enqueue_makes_the_pinned_commands(url: str) -> None:
    async with broker_at(url, "cost") as broker:
        await broker.enqueue([message("warm")])
        one = await commands_of(url, lambda: broker.enqueue([message("a")]))
        assert one == ENQUEUE_ONE, f"commands per call: {sorted(one.items())}"
        batch = await commands_of(url, lambda: broker.enqueue([message(f"b{i}") for i in range(5)]))
        per_job = _per_job(batch, one, 4)
        assert per_job == ENQUEUE_PER_JOB, f"per job: {sorted(per_job.items())}"
        # A level with no job waiting yet is listed (its ZADD), and claimed from first.
        level = await commands_of(url, lambda: broker.enqueue([message("p", priority=5)]))
        assert level - ENQUEUE_ONE == Counter({"ZADD": 1}), sorted(level.items())
        again = await commands_of(url, lambda: broker.enqueue([message("p2", priority=5)]))
        assert again == ENQUEUE_ONE, f"commands per call: {sorted(again.items())}"
        claimed = await broker.claim(["q"], 4, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["p", "p2", "warm", "a"]


async def test_a_batch_checks_the_job_keys_once_unless_one_exists(url: str) -> None:
    """One EXISTS of all the job keys per 500; only when it counts one (a job with a key
    of its own, e.g. claimed, is named again) one EXISTS per job finds which. (+1: the
    EXISTS of the queue's hand-off registrations, once per call.)"""
    async with broker_at(url, "cost") as broker:
        await broker.enqueue([message("warm")])
        big = await commands_of(url, lambda: broker.enqueue([message(f"m{i}") for i in range(501)]))
        assert (big["EXISTS"], big["HSETNX"], big["LPUSH"]) == (2 + 1, 501, 2)
        await broker.claim(["q"], 1, worker_id="w", lease=30)  # "warm" gets a key
        names = ["warm", "n1", "n2"]
        again = await commands_of(url, lambda: broker.enqueue([message(i) for i in names]))
        assert (again["EXISTS"], again["HSETNX"], again["INCRBY"]) == (1 + 3 + 1, 2, 1)
        repeats = await commands_of(url, lambda: broker.enqueue([message("n1"), message("n3")]))
        # The repeat's order is given back: a second INCRBY.
        assert (repeats["EXISTS"], repeats["HSETNX"], repeats["INCRBY"]) == (1 + 1, 2, 2)


async def test_an_enqueue_publishes_only_for_a_waiting_worker(url: str) -> None:
    """A claim that came up short sets its queue's waiter mark (one SET); the next enqueue
    consumes it and publishes the work notice; the one after publishes nothing again."""
    async with broker_at(url, "cost") as broker:
        await broker.enqueue([message("warm")])
        await broker.claim(["q"], 1, worker_id="w", lease=30)
        short = await commands_of(url, lambda: broker.claim(["q"], 1, worker_id="w", lease=30))
        assert short["SET"] == 1, f"commands: {sorted(short.items())}"  # the mark
        assert "PUBLISH" not in short
        woke = await commands_of(url, lambda: broker.enqueue([message("a")]))
        expected = ENQUEUE_ONE.copy()
        expected["PUBLISH"] = 1
        expected["HGETALL"] = 1  # the hand-off registrations the notice ends (none here)
        expected["ZADD"] = 1  # the queue had no job waiting: its level is listed again
        assert woke == expected, f"commands per call: {sorted(woke.items())}"
        again = await commands_of(url, lambda: broker.enqueue([message("b")]))
        assert again == ENQUEUE_ONE, f"commands per call: {sorted(again.items())}"


async def test_a_completion_makes_the_pinned_commands(url: str) -> None:
    async with broker_at(url, "cost") as broker:
        await broker.enqueue([message(f"j{i}") for i in range(8)])
        held = await broker.claim(["q"], 8, worker_id="w", lease=30)
        await broker.complete([Completion(held[0].message.id, held[0].token, b"\xc0")])
        one = await commands_of(
            url, lambda: broker.complete([Completion(held[1].message.id, held[1].token, b"")])
        )
        assert one == COMPLETE_ONE, f"commands per call: {sorted(one.items())}"
        batch = await commands_of(
            url,
            lambda: broker.complete([Completion(j.message.id, j.token, b"") for j in held[2:7]]),
        )
        per_job = _per_job(batch, one, 4)
        assert per_job == COMPLETE_PER_JOB, f"per job: {sorted(per_job.items())}"


#: Each more job of a fair claim (typedq.fair; weight-1 keys whose lanes keep jobs): its
#: id from its key's lane, its job string read and deleted (no TYPE first), the job
#: hash, and whether its lane has jobs left. The markers of the turns go back to the
#: level's tail in one LPUSH per call, and a plain job of the claim makes three (HGET,
#: HDEL, HSET: SETTLE_AND_CLAIM_PER_JOB without the completion's two).
FAIR_CLAIM_PER_JOB = Counter({"RPOP": 1, "GETDEL": 1, "HSET": 1, "EXISTS": 1})


async def test_a_fair_claim_makes_the_pinned_commands(url: str) -> None:
    def fair(job_id: str, key: str) -> JobMessage:
        return msgspec.structs.replace(message(job_id), fair_key=key, fair_weight=1)

    async with broker_at(url, "cost") as broker:
        await broker.enqueue([fair(f"k{k}-{r}", f"k{k}") for r in range(3) for k in range(20)])
        await broker.claim(["q"], 1, worker_id="w", lease=30)
        one = await commands_of(url, lambda: broker.claim(["q"], 1, worker_id="w", lease=30))
        five = await commands_of(url, lambda: broker.claim(["q"], 5, worker_id="w", lease=30))
        per_job = _per_job(five, one, 4)
        assert per_job == FAIR_CLAIM_PER_JOB, f"per job: {sorted(per_job.items())}"
        assert (one["LPUSH"], five["LPUSH"], one["TYPE"], five["TYPE"]) == (1, 1, 0, 0)


async def test_a_completion_at_the_retention_cap_deletes_the_trimmed_jobs_at_once(
    url: str,
) -> None:
    """At the cap every completion trims: the popped jobs' states are read (one field:
    only a failed job can be parked) and the ones still completed are deleted by one DEL
    for the call, not one per job; the counts move by the number trimmed."""
    async with broker_at(url, "cost", retention=Retention(completed_max=3)) as broker:
        await broker.enqueue([message(f"a{i}") for i in range(8)])
        first = await broker.claim(["q"], 4, worker_id="w", lease=30)
        await broker.complete([Completion(j.message.id, j.token, b"\xc0") for j in first])
        held = await broker.claim(["q"], 4, worker_id="w", lease=30)
        items = [Completion(j.message.id, j.token, b"\xc0") for j in held]
        async with script_commands(url) as seen:
            assert await broker.complete(items) == [FinishOutcome.OK] * 4
        commands = Counter(seen)
        # 3 kept + 4 completed: the 4 oldest go (the budget is the call's jobs + 100).
        assert (commands["ZPOPMIN"], commands["DEL"]) == (1, 1)
        # the completions' 4 reads, the events config's, the 4 trimmed jobs' states
        assert commands["HMGET"] == 4 + 1 + 4
        counts = await broker.counts("q")
        assert counts[JobState.COMPLETED] == 3
        stats = await broker.queue_stats(["q"])
        assert stats[0].trimmed[JobState.COMPLETED] == 5
        records = await broker.get([f"a{i}" for i in range(8)])
        assert sum(r is None for r in records) == 5
