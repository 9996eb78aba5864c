"""The batched claim of limited tasks on PostgreSQL (migration 11): one claim takes as
many jobs of a bucket as its free slots and rate tokens allow, never more, and decides
every job as migration 4's claim (one job at a time) did: random programs run in
lockstep on two schemas, one with migration 4's claim put back, and the claims' answers
and the parked jobs must be equal. Under many concurrent claimers no concurrency limit
is exceeded and no rate window overfilled (a throwaway cluster: tests/pg_harness.py)."""

from __future__ import annotations

import random
import re
from collections import defaultdict
from typing import Any

import anyio
import msgspec
import pytest

from tests.contract.test_limits import worst_window
from tests.pg_harness import PgCluster
from tests.support import TEST_DEADLINE, msg
from typedq import JobState
from typedq.broker.base import BrokerSettings, ClaimedJob, Completion, JobMessage
from typedq.broker.postgres import PostgresBroker, migration_4
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]

HOUR_US = 3_600_000_000

#: Time kept out of the comparison: windows of an hour, a spacing of ten minutes taken
#: up to 25 minutes early (three starts at once, then closed for the run).
SPECS = {
    "a": LimitSpec(concurrency=2),
    "b": LimitSpec(rate=3, per_us=HOUR_US),
    "c": LimitSpec(concurrency=1, rate=2, per_us=HOUR_US),
    "e": LimitSpec(rate=5, per_us=HOUR_US, spacing_us=600_000_000, early_us=1_500_000_000),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def job(
    job_id: str, task: str, *, key: str = "", rkey: str = "", queue: str = "q", prio: int = 0
) -> JobMessage:
    return msgspec.structs.replace(
        msg(task=task, job_id=job_id, queue=queue, priority=prio),
        concurrency_key=key,
        rate_key=rkey,
    )


def _old_claim(schema: str) -> str:
    """Migration 4's claim (one job at a time), to put back in a schema for comparison."""
    found = re.search(r"CREATE FUNCTION \{s\}\.claim\(.*?\nEND \$\$;", migration_4.SQL, re.S)
    assert found is not None
    return (
        found.group(0)
        .replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
        .format(s=f'"{schema}"')
    )


async def _broker(url: str, ns: str, limits: dict[str, LimitSpec]) -> PostgresBroker:
    broker = PostgresBroker(url, BrokerSettings(namespace=ns))
    await broker.connect()
    broker.set_limits(limits)
    return broker


async def test_one_claim_takes_a_buckets_free_slots_and_tokens_at_once(
    pg_cluster: PgCluster, app_name: str
) -> None:
    limits = {"a": LimitSpec(concurrency=4), "b": LimitSpec(rate=3, per_us=HOUR_US)}
    broker = await _broker(pg_cluster.url, app_name, limits)
    try:
        await broker.enqueue([job(f"a{i}", "a") for i in range(10)])
        await broker.enqueue([job(f"b{i}", "b") for i in range(10)])
        claimed = await broker.claim(["q"], 20, worker_id="w", lease=30)
        ids = sorted(j.message.id for j in claimed)
        assert ids == ["a0", "a1", "a2", "a3", "b0", "b1", "b2"]
        assert sorted(int(j.token.split(".")[1]) for j in claimed) == list(range(1, 8))
        assert await broker.claim(["q"], 20, worker_id="w", lease=30) == []
        # A freed slot gives back one job, the best parked one.
        first = next(j for j in claimed if j.message.id == "a0")
        await broker.complete([Completion(first.message.id, first.token, b"")])
        (again,) = await broker.claim(["q"], 20, worker_id="w", lease=30)
        assert again.message.id == "a4"
        counts = await broker.counts("q")
        assert counts[JobState.ACTIVE] == 7
        assert counts[JobState.WAITING] == 12
    finally:
        await broker.close()


async def test_batched_claims_decide_as_the_one_at_a_time_claim(
    pg_cluster: PgCluster, app_name: str
) -> None:
    new = await _broker(f"{pg_cluster.url}?schema=batched", app_name, SPECS)
    old = await _broker(f"{pg_cluster.url}?schema=single", app_name, SPECS)
    await old._fetchval("old_claim", _old_claim("single"))
    sides = (old, new)
    try:
        with anyio.fail_after(TEST_DEADLINE * 4):
            for seed in range(12):
                await _program(sides, random.Random(seed), f"s{seed}")
    finally:
        for broker in sides:
            await broker.close()


async def _program(sides: tuple[PostgresBroker, ...], rng: random.Random, tag: str) -> None:
    held: list[list[ClaimedJob]] = [[] for _ in sides]
    queues = [f"{tag}q1", f"{tag}q2"]
    made = 0
    for step in range(40):
        roll = rng.random()
        if roll < 0.3:
            batch = []
            for _ in range(rng.randint(1, 8)):
                made += 1
                task = rng.choice("abcde")
                batch.append(
                    job(
                        f"{tag}j{made}",
                        task,
                        key=rng.choice(["", "k1", "k2"]) if task in "ac" else "",
                        rkey=rng.choice(["", "r1"]) if task in "bce" else "",
                        queue=rng.choice(queues),
                        prio=rng.choice([0, 0, 1]),
                    )
                )
            for broker in sides:
                await broker.enqueue(batch)
        elif roll < 0.75:
            which = rng.sample(queues, rng.randint(1, 2))
            limit = rng.randint(1, 9)
            answers = []
            for n, broker in enumerate(sides):
                claimed = await broker.claim(which, limit, worker_id="w", lease=3600)
                held[n].extend(claimed)
                answers.append([(j.token.split(".")[1], j.message.id) for j in claimed])
            assert answers[0] == answers[1], f"{tag} step {step}"
        elif held[0]:
            picks = rng.sample(range(len(held[0])), rng.randint(1, len(held[0])))
            gone = {held[0][p].message.id for p in picks}
            for n, broker in enumerate(sides):
                chosen = [j for j in held[n] if j.message.id in gone]
                await broker.complete([Completion(j.message.id, j.token, b"") for j in chosen])
                held[n] = [j for j in held[n] if j.message.id not in gone]
        states = [await _states(broker, tag) for broker in sides]
        assert states[0] == states[1], f"{tag} step {step}"


async def _states(broker: PostgresBroker, tag: str) -> tuple[Any, ...]:
    s = f'"{broker.target.schema}"'
    jobs = await broker._fetch(
        "states",
        f"SELECT id, state, gate, slot FROM {s}.jobs WHERE ns = $1 AND id LIKE $2 ORDER BY id",  # noqa: S608 (the test's own schema)
        broker.ns,
        f"{tag}%",
    )
    # A gate's time as the place in its rate window of the start it waits on (the
    # clocks of the two sides differ).
    gates = await broker._fetch(
        "gates",
        f"SELECT g.queue, g.gate, g.opens_us IS NULL, array_position(r.starts, g.opens_us - $3)"  # noqa: S608 (the test's own schema)
        f" FROM {s}.gates g LEFT JOIN {s}.rate_windows r"
        " ON r.ns = g.ns AND r.task = g.task AND r.key = g.key AND g.kind = 'r'"
        " WHERE g.ns = $1 AND g.queue LIKE $2 ORDER BY g.queue, g.gate",
        broker.ns,
        f"{tag}%",
        HOUR_US,
    )
    return [tuple(r) for r in jobs], [tuple(r) for r in gates]


async def test_many_concurrent_batched_claims_keep_every_limit(
    pg_cluster: PgCluster, app_name: str
) -> None:
    # Three brokers (three pools, as three worker processes), eight claimers each with
    # claims of 8: two keys of concurrency 3 and a rate of 4 per 300 ms on task "r".
    conc, rate, per_us = 3, 4, 300_000
    limits = {"c": LimitSpec(concurrency=conc), "r": LimitSpec(rate=rate, per_us=per_us)}
    brokers = [await _broker(pg_cluster.url, app_name, limits) for _ in range(3)]
    jobs = [job(f"c{k}{i}", "c", key=k) for i in range(30) for k in ("x", "y")]
    jobs += [job(f"r{i}", "r") for i in range(16)]
    running: dict[str, int] = defaultdict(int)
    peak: dict[str, int] = defaultdict(int)
    sizes: list[int] = []
    done: list[str] = []
    try:
        await brokers[0].enqueue(jobs)

        async def claimer(broker: PostgresBroker, seed: int) -> None:
            rng = random.Random(seed)
            while len(done) < len(jobs):
                claimed = await broker.claim(["q"], 8, worker_id=f"w{seed}", lease=30)
                if not claimed:
                    await broker.wait_for_jobs(["q"], 0.05)
                    continue
                sizes.append(sum(1 for j in claimed if j.message.task == "c"))
                for j in claimed:
                    key = j.message.concurrency_key
                    if j.message.task == "c":
                        running[key] += 1
                        peak[key] = max(peak[key], running[key])
                await anyio.sleep(rng.random() * 0.01)
                for j in claimed:
                    # Counted off before the completion is sent (its slot is freed at
                    # its commit, after this).
                    if j.message.task == "c":
                        running[j.message.concurrency_key] -= 1
                await broker.complete([Completion(j.message.id, j.token, b"") for j in claimed])
                done.extend(j.message.id for j in claimed)

        with anyio.fail_after(TEST_DEADLINE):
            async with anyio.create_task_group() as tg:
                for i in range(24):
                    tg.start_soon(claimer, brokers[i % 3], i)
        assert sorted(done) == sorted(m.id for m in jobs)
        assert max(peak.values()) <= conc
        assert max(sizes) > 1  # a claim took several jobs of the limited task at once
        records = await brokers[0].get([m.id for m in jobs if m.task == "r"])
        starts = [round(r.started_at * 1_000_000) for r in records if r is not None]
        assert len(starts) == 16
        assert worst_window(starts, per_us) <= rate
    finally:
        for broker in brokers:
            await broker.close()
