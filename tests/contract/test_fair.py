"""Fair shares (typedq.fair): a task's waiting jobs claimed round-robin across keys.

Broker-level tests enqueue envelopes carrying ``fair_key``/``fair_weight`` (what
``Fair(key=...)`` makes at the producer) and read the order claims hand them out; the
app-level ones go through ``@app.task(fair=...)`` and a worker.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE, Out, connected, msg, sleep_until
from typedq import App, Fair, JobState, QueueFull
from typedq.broker.base import (
    Broker,
    CancelOutcome,
    ClaimedJob,
    Completion,
    Failure,
    JobMessage,
    Release,
    RetryOutcome,
)
from typedq.broker.flow import FlowSpec, member_id, step_id
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


def fair(
    key: str,
    *,
    weight: int = 1,
    job_id: str | None = None,
    priority: int = 0,
    task: str = "t",
    concurrency_key: str = "",
    delay: float = 0.0,
) -> JobMessage:
    """A fair job of ``task`` for key ``key``."""
    return msgspec.structs.replace(
        msg(task=task, job_id=job_id, priority=priority, delay=delay),
        fair_key=key,
        fair_weight=weight,
        concurrency_key=concurrency_key,
    )


async def claim_order(broker: Broker, n: int, *, limit: int = 1) -> list[str]:
    """The ids of the next ``n`` jobs claims of ``limit`` hand out (completed at once)."""
    order: list[str] = []
    while len(order) < n:
        claimed = await broker.claim(["q"], limit, worker_id="w", lease=30)
        if not claimed:
            break
        order += [job.message.id for job in claimed]
        await broker.complete(
            [Completion(id=j.message.id, token=j.token, result=b"\xc0") for j in claimed]
        )
    return order


async def test_a_flood_of_one_key_does_not_delay_another_keys_job(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(300)])
        await broker.enqueue([fair("b", job_id="b0"), fair("c", job_id="c0")])
        order = await claim_order(broker, 4)
        # Three active keys: b's and c's jobs come within the next three claims.
        assert order[:3] == ["a0", "b0", "c0"]
        assert order[3] == "a1"
        # Big claims too: one claim of 10 takes a key's job once per turn.
        await broker.enqueue([fair("b", job_id=f"b{i}") for i in range(1, 4)])
        batch = [j.message.id for j in await broker.claim(["q"], 6, worker_id="w", lease=30)]
        assert batch == ["a2", "b1", "a3", "b2", "a4", "b3"]


async def test_fair_jobs_take_turns_with_plain_jobs_of_their_level(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(3)])
        await broker.enqueue([msg(job_id="p0"), msg(job_id="p1")])
        # The key holds one place in the FIFO: a0, then the plain jobs that came after
        # it joined, then its next turn.
        assert await claim_order(broker, 5) == ["a0", "p0", "p1", "a1", "a2"]


async def test_weights_take_that_many_jobs_per_turn(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("big", weight=3, job_id=f"B{i}") for i in range(9)])
        await broker.enqueue([fair("small", job_id=f"s{i}") for i in range(3)])
        order = await claim_order(broker, 12, limit=2)
        assert order == [
            *("B0", "B1", "B2", "s0"),
            *("B3", "B4", "B5", "s1"),
            *("B6", "B7", "B8", "s2"),
        ]


async def test_a_keys_new_weight_applies_from_its_next_turn(app_name: str, broker_url: str) -> None:
    """A key's weight is its newest job's: a new job with another weight (the task's
    ``weights`` changed) sets it from the key's next turn on; the turn under way keeps
    its count. Lowered mid-turn, then raised between turns."""
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("big", weight=3, job_id=f"B{i}") for i in range(6)])
        await broker.enqueue([fair("small", job_id=f"s{i}") for i in range(3)])
        assert await claim_order(broker, 1) == ["B0"]
        await broker.enqueue([fair("big", weight=1, job_id="B6")])
        assert await claim_order(broker, 10) == [
            *("B1", "B2", "s0"),  # the turn under way: 3
            *("B3", "s1", "B4", "s2", "B5", "B6"),  # then 1 a turn
        ]
        await broker.enqueue([fair("big", job_id=f"B{i}") for i in range(10, 14)])
        await broker.enqueue([fair("small", job_id=f"t{i}") for i in range(4)])
        assert await claim_order(broker, 1) == ["B10"]
        await broker.enqueue([fair("big", weight=2, job_id="B14")])
        assert await claim_order(broker, 10) == [
            *("t0", "B11", "B12", "t1", "B13", "B14", "t2", "t3"),
        ]
        # Several claims of 2: a turn's count is kept across claims, with the new weight.
        await broker.enqueue([fair("big", job_id=f"C{i}") for i in range(5)])
        await broker.enqueue([fair("small", job_id=f"u{i}") for i in range(2)])
        await broker.enqueue([fair("big", weight=3, job_id="C5")])
        assert await claim_order(broker, 10, limit=2) == [
            *("C0", "C1", "C2", "u0", "C3", "C4", "C5", "u1"),
        ]


async def test_a_retry_or_a_hand_back_leaves_its_keys_weight(
    app_name: str, broker_url: str
) -> None:
    """A job retried or handed back is no new job: its key keeps the weight its newest
    job gave it (a retry of a job enqueued with an older weight does not bring that
    back); a key it makes join the line again takes that job's own weight."""
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id="a0")])
        await broker.enqueue([fair("a", weight=3, job_id=f"a{i}") for i in range(1, 7)])
        await broker.enqueue([fair("b", job_id=f"b{i}") for i in range(3)])
        (first,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert first.message.id == "a0"  # a's first turn: the newest job's weight, 3
        await broker.fail(
            [Failure(id=first.message.id, token=first.token, error=b"err", retry_delay=0.0)]
        )
        (second,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert second.message.id == "a1"
        await broker.release([Release(id=second.message.id, token=second.token)])
        assert await claim_order(broker, 12) == [
            *("a1", "b0"),  # a1 (back first in a's lane) ends the turn of 3 it began
            *("a2", "a3", "a4", "b1", "a5", "a6", "a0", "b2"),  # a0 retried: at the tail
        ]
        # A key with no job waiting joins with the retried job's own weight (1 here,
        # though the turn that ran it took 3).
        await broker.enqueue([fair("a", job_id="x0"), fair("a", weight=3, job_id="x1")])
        await broker.enqueue([fair("b", job_id=f"y{i}") for i in range(3)])
        claimed = await broker.claim(["q"], 2, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["x0", "x1"]
        await broker.fail(
            [
                Failure(id=j.message.id, token=j.token, error=b"err", retry_delay=0.0)
                for j in claimed
            ]
        )
        await broker.enqueue([fair("b", job_id="y3")])
        assert await claim_order(broker, 10) == ["y0", "x0", "y1", "x1", "y2", "y3"]


async def test_priorities_come_before_fairness(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(3)])
        await broker.enqueue([fair("a", job_id="urgent", priority=5)])
        await broker.enqueue([fair("b", job_id="b0")])
        assert await claim_order(broker, 5) == ["urgent", "a0", "b0", "a1", "a2"]


async def test_fair_waiting_jobs_are_counted_listed_cancelled_and_removed(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(4)])
        await broker.enqueue([fair("b", job_id="b0"), msg(job_id="p0")])
        counts = await broker.counts("q")
        assert counts[JobState.WAITING] == 6
        listed = await broker.list_jobs("q", JobState.WAITING, limit=100)
        assert sorted(listed) == ["a0", "a1", "a2", "a3", "b0", "p0"]
        assert await broker.cancel("a1", queue="q") is CancelOutcome.CANCELLED
        assert await broker.cancel("b0", queue="q") is CancelOutcome.CANCELLED
        assert await broker.remove(["a2"], queue="q") == [True]
        assert (await broker.counts("q"))[JobState.WAITING] == 3
        assert sorted(await broker.list_jobs("q", JobState.WAITING)) == ["a0", "a3", "p0"]
        assert await claim_order(broker, 10) == ["a0", "p0", "a3"]
        assert (await broker.counts("q"))[JobState.WAITING] == 0
        # A key whose jobs all left comes back with its next job.
        await broker.enqueue([fair("b", job_id="b1")])
        assert await claim_order(broker, 10) == ["b1"]


async def test_purge_drops_fair_waiting_jobs(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(5)])
        await broker.enqueue([fair("b", job_id="b0"), msg(job_id="p0")])
        assert await broker.purge("q", [JobState.WAITING]) == 7
        assert (await broker.counts("q"))[JobState.WAITING] == 0
        assert await broker.list_jobs("q", JobState.WAITING) == []
        assert await broker.claim(["q"], 10, worker_id="w", lease=30) == []
        await broker.enqueue([fair("a", job_id="a9"), fair("b", job_id="b9")])
        assert await claim_order(broker, 10) == ["a9", "b9"]


async def test_a_retry_goes_back_fair(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(4)])
        await broker.enqueue([fair("b", job_id="b0")])
        (first,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert first.message.id == "a0"
        # Failed with a retry due now: it waits again in a's lane, not ahead of b.
        await broker.fail(
            [Failure(id=first.message.id, token=first.token, error=b"err", retry_delay=0.0)]
        )
        assert await claim_order(broker, 5) == ["b0", "a1", "a2", "a3", "a0"]


async def test_a_concurrency_limit_per_key_parks_only_that_key(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        broker.set_limits({"t": LimitSpec(concurrency=1)})
        await broker.enqueue([fair("a", job_id=f"a{i}", concurrency_key="a") for i in range(50)])
        await broker.enqueue([fair("b", job_id=f"b{i}", concurrency_key="b") for i in range(2)])
        claimed = await broker.claim(["q"], 10, worker_id="w", lease=30)
        # One of each key runs; a's flood is parked by its gate, b's next too.
        assert [j.message.id for j in claimed] == ["a0", "b0"]
        await broker.complete(
            [Completion(id=j.message.id, token=j.token, result=b"\xc0") for j in claimed]
        )
        again = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert sorted(j.message.id for j in again) == ["a1", "b1"]
        await broker.complete(
            [Completion(id=j.message.id, token=j.token, result=b"\xc0") for j in again]
        )
        (third,) = await broker.claim(["q"], 10, worker_id="w", lease=30)
        assert third.message.id == "a2"
        assert (await broker.counts("q"))[JobState.WAITING] == 47


class Work(msgspec.Struct, frozen=True):
    tenant: str
    n: int


async def test_fair_tasks_through_the_app(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    started: list[tuple[str, int]] = []

    @app.task(fair=Fair(key=lambda w: w.tenant, weights={"big": 2}))
    async def work(w: Work) -> Out:
        started.append((w.tenant, w.n))
        return Out(w.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            message = work.message(Work("big", 0))
            assert (message.fair_key, message.fair_weight) == ("big", 2)
            assert work.message(Work("small", 0)).fair_weight == 1
            jobs = await work.enqueue_many([Work("big", i) for i in range(40)])
            late = await work.enqueue(Work("small", 0))
            async with app.worker(concurrency=1):
                assert (await late.result(timeout=TEST_DEADLINE)).n == 0
                for job in jobs:
                    await job.result(timeout=TEST_DEADLINE)
            # The small tenant's one job started within the first few.
            assert started.index(("small", 0)) <= 3


async def test_a_due_scheduled_fair_job_and_a_handed_back_one_wait_fair(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(4)])
        await broker.enqueue([fair("b", job_id="b-late", delay=0.2)])
        record = (await broker.get(["b-late"], queue="q"))[0]
        assert record is not None
        assert record.state is JobState.SCHEDULED
        await sleep_until(record.run_at)
        # Due: promoted as b's first job, so b takes the next turn after a's.
        (first,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        (second,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert [first.message.id, second.message.id] == ["a0", "b-late"]
        # Handed back unrun (a worker shutting down): waiting again, still fair.
        await broker.release([Release(id=first.message.id, token=first.token)])
        await broker.complete([Completion(id="b-late", token=second.token, result=b"\xc0")])
        order = await claim_order(broker, 10)
        assert sorted(order) == ["a0", "a1", "a2", "a3"]
        assert (await broker.counts("q"))[JobState.WAITING] == 0


async def test_fair_jobs_are_read_paged_and_capped(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=12) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}", priority=i % 2) for i in range(6)])
        await broker.enqueue([fair("b", job_id=f"b{i}") for i in range(3)] + [msg(job_id="p")])
        record = (await broker.get(["a3"], queue="q"))[0]
        assert record is not None
        assert record.state is JobState.WAITING
        assert (record.message.fair_key, record.message.fair_weight) == ("a", 1)
        assert record.message.priority == 1
        listed: list[str] = []
        cursor: str | None = None
        while True:
            page = await broker.page_jobs("q", JobState.WAITING, cursor=cursor, limit=3)
            listed += page.ids
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(listed) == sorted([f"a{i}" for i in range(6)] + ["b0", "b1", "b2", "p"])
        with pytest.raises(QueueFull):
            await broker.enqueue([fair("c", job_id=f"c{i}") for i in range(3)])
        await broker.enqueue([fair("c", job_id="c0"), fair("c", job_id="c1")])
        assert (await broker.counts("q"))[JobState.WAITING] == 12


async def test_a_claim_over_several_queues_takes_fair_turns(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(5)])
        await broker.enqueue([fair("b", job_id="b0")])
        await broker.enqueue([msg(queue="q2", job_id="other")])
        claimed = await broker.claim(["q", "q2"], 10, worker_id="w", lease=30)
        ids = [j.message.id for j in claimed]
        assert sorted(ids) == ["a0", "a1", "a2", "a3", "a4", "b0", "other"]
        assert ids.index("b0") <= 2


async def test_one_call_with_fair_and_plain_jobs_of_several_queues(
    app_name: str, broker_url: str
) -> None:
    """One enqueue call mixing queues, one with fair jobs and one without: every job is
    stored (on Redis Cluster each queue is its own script, and a queue's script follows
    its own jobs: the plain queue's jobs once went to the fair script and were refused)."""
    async with connected(app_name, broker_url) as broker:
        batch = [
            msg(queue="q2", job_id="p0"),
            fair("a", job_id="a0", weight=2),
            msg(queue="q2", job_id="p1"),
            fair("b", job_id="b0"),
        ]
        outcomes = await broker.enqueue(batch)
        assert [(o.id, o.created) for o in outcomes] == [
            ("p0", True),
            ("a0", True),
            ("p1", True),
            ("b0", True),
        ]
        assert (await broker.counts("q"))[JobState.WAITING] == 2
        assert (await broker.counts("q2"))[JobState.WAITING] == 2
        assert await claim_order(broker, 2) == ["a0", "b0"]


async def test_a_fan_out_of_a_fair_task_runs_fair(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    started: list[str] = []

    @app.task(fair=Fair(key=lambda w: w.tenant))
    async def work(w: Work) -> Out:
        started.append(w.tenant)
        return Out(w.n)

    @app.task
    async def total(outs: list[Out]) -> Out:
        return Out(sum(o.n for o in outs))

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            items = [Work("big", i) for i in range(30)] + [Work("small", 100)]
            job = await work.map(items).then(total).enqueue()
            async with app.worker(concurrency=1):
                assert await job.result(timeout=TEST_DEADLINE) == Out(sum(range(30)) + 100)
    # The members carry their key: the small tenant's one member runs within the first
    # few, not after the big tenant's thirty.
    assert started.index("small") <= 3


async def test_delayed_fair_jobs_wait_fair_once_due(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}", delay=0.2) for i in range(4)])
        await broker.enqueue([fair("b", job_id="b0", delay=0.2)])
        record = (await broker.get(["b0"], queue="q"))[0]
        assert record is not None
        await sleep_until(record.run_at)
        # Promoted together: each key takes its turns, b's job is not behind a's four.
        assert await claim_order(broker, 5) == ["a0", "b0", "a1", "a2", "a3"]


async def test_unique_and_debounced_fair_jobs_wait_fair(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(key=lambda w: f"{w.tenant}-{w.n}", unique_for=60, fair=Fair(key=lambda w: w.tenant))
    async def once(w: Work) -> None:
        pass

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            for i in range(4):
                await once.enqueue(Work("a", i))
            await once.enqueue(Work("b", 0))
            claimed = await app.broker.claim([once.queue], 2, worker_id="w", lease=30)
            tenants = [msgspec.msgpack.decode(j.message.payload, type=Work).tenant for j in claimed]
            assert tenants == ["a", "b"]


@pytest.mark.parametrize("how", ["retry-now", "retry-later", "operator-retry", "lease-expired"])
async def test_retried_fair_jobs_take_turns_in_their_keys_lane(
    app_name: str, broker_url: str, how: str
) -> None:
    """A burst of one key's retries (a retry due now or later, an operator's retry, a
    recovery of expired leases) waits in that key's lane: the keys still take turns,
    instead of the retried jobs going first, one after another, as participants of
    their own."""
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(3)])
        claimed = await broker.claim(["q"], 3, worker_id="w", lease=60)
        assert [j.message.id for j in claimed] == ["a0", "a1", "a2"]
        await broker.enqueue([fair("b", job_id=f"b{i}") for i in range(3)])
        if how == "lease-expired":
            leases = [(j.message.id, j.token) for j in claimed]
            assert await broker.renew(leases, 0.001) is not None
            await anyio.sleep(0.05)
            assert await broker.recover_stalled() == 3
        else:
            delay = {"retry-now": 0.0, "retry-later": 0.05, "operator-retry": None}[how]
            await broker.fail(
                [
                    Failure(id=j.message.id, token=j.token, error=b"err", retry_delay=delay)
                    for j in claimed
                ]
            )
            if how == "operator-retry":
                assert await broker.retry(["a0", "a1", "a2"]) == [RetryOutcome.RETRIED] * 3
            elif how == "retry-later":
                await anyio.sleep(0.1)
        counts = await broker.counts("q")
        assert counts[JobState.WAITING] + counts[JobState.SCHEDULED] == 6
        order = await claim_order(broker, 6)
        # One job per key per turn, each key's jobs in their order.
        assert [i for i in order if i[0] == "a"] == ["a0", "a1", "a2"]
        assert [i for i in order if i[0] == "b"] == ["b0", "b1", "b2"]
        assert [i[0] for i in order] in (list("ababab"), list("bababa")), order


# Hand-backs and retries keep the key's place (docs/flow-control.md, "Turns and
# hand-backs"): a job that comes back waits for its key's next turn, first of its key's
# jobs when handed back unrun, last when retried; its key neither jumps ahead of the
# other keys nor loses its turn, and a key with no job waiting joins at the tail.

HAND_BACKS = ["release", "lease-expired"]
RETRIES = ["retry-now", "retry-later", "operator-retry"]


async def come_back(broker: Broker, claimed: list[ClaimedJob], how: str) -> None:
    """The claimed jobs wait again: handed back unrun (a release, as a worker shutting
    down does; a recovered expired lease) or retried (a retry due now or after a delay,
    an operator's retry of the failed jobs)."""
    ids = [j.message.id for j in claimed]
    if how == "release":
        await broker.release([Release(id=j.message.id, token=j.token) for j in claimed])
    elif how == "lease-expired":
        assert await broker.renew([(j.message.id, j.token) for j in claimed], 0.001) is not None
        await anyio.sleep(0.05)
        assert await broker.recover_stalled() == len(claimed)
    else:
        delay = {"retry-now": 0.0, "retry-later": 0.05, "operator-retry": None}[how]
        await broker.fail(
            [
                Failure(id=j.message.id, token=j.token, error=b"err", retry_delay=delay)
                for j in claimed
            ]
        )
        if how == "operator-retry":
            assert await broker.retry(ids) == [RetryOutcome.RETRIED] * len(ids)
        elif how == "retry-later":
            await anyio.sleep(0.1)
    records = await broker.get(ids)
    assert all(r is not None and r.state is not JobState.ACTIVE for r in records)


@pytest.mark.parametrize("how", HAND_BACKS + RETRIES)
async def test_a_fair_job_back_keeps_its_keys_place(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(3)])
        await broker.enqueue([fair("b", job_id="b0"), fair("b", job_id="b1")])
        await broker.enqueue([fair("c", job_id="c0")])
        claimed = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["a0"]
        # a's turn ended with jobs left: a is behind b and c now, and stays there.
        await come_back(broker, claimed, how)
        order = await claim_order(broker, 6)
        if how in HAND_BACKS:
            # Unrun: first of a's jobs at a's next turn (not ahead of b and c).
            assert order == ["b0", "c0", "a0", "b1", "a1", "a2"]
        else:
            # Run and failed: last of a's jobs, like a new one (a keeps its turns).
            assert order == ["b0", "c0", "a1", "b1", "a2", "a0"]


@pytest.mark.parametrize("how", HAND_BACKS + RETRIES)
async def test_a_fair_job_back_whose_key_had_none_waiting_joins_at_the_tail(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id="a0")])
        await broker.enqueue([fair("b", job_id="b0"), fair("b", job_id="b1")])
        await broker.enqueue([fair("c", job_id="c0"), fair("c", job_id="c1")])
        claimed = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["a0"]
        # a left the line with its last job; back, it joins behind b and c (where it
        # would be had it kept a job), not ahead of them as a0's enqueue order would put it.
        await come_back(broker, claimed, how)
        assert await claim_order(broker, 5) == ["b0", "c0", "a0", "b1", "c1"]


@pytest.mark.parametrize("how", HAND_BACKS)
async def test_fair_jobs_handed_back_together_keep_their_order(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", weight=2, job_id=f"a{i}") for i in range(4)])
        await broker.enqueue([fair("b", job_id="b0"), fair("c", job_id="c0")])
        claimed = await broker.claim(["q"], 3, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["a0", "a1", "b0"]
        # Handed back in any order (here the reverse), in one call: each key's jobs
        # first in its lane in their order, b (no job waiting) behind c and a.
        await come_back(broker, claimed[::-1], how)
        assert await claim_order(broker, 6) == ["c0", "a0", "a1", "b0", "a2", "a3"]


@pytest.mark.parametrize("how", HAND_BACKS)
async def test_a_plain_job_handed_back_among_fair_keys_takes_its_old_place(
    app_name: str, broker_url: str, how: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([msg(job_id="p0")])
        await broker.enqueue([fair("a", job_id="a0"), fair("a", job_id="a1")])
        await broker.enqueue([fair("b", job_id="b0"), msg(job_id="p1")])
        claimed = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["p0"]
        # p0 was ahead of a's and b's places when claimed: it is again, and they keep
        # theirs among the plain jobs.
        await come_back(broker, claimed, how)
        assert await claim_order(broker, 5) == ["p0", "a0", "b0", "p1", "a1"]


async def until_count(broker: Broker, state: JobState, n: int) -> None:
    """Until ``n`` jobs of queue default are in ``state`` (polled: the broker's side of a
    worker's claim or hand-back has no event to wait on)."""
    while True:
        if (await broker.counts("default")).get(state, 0) >= n:
            return
        await anyio.sleep(0.005)


async def test_a_worker_stopping_hands_a_prefetched_fair_job_back_to_its_keys_place(
    app_name: str, broker_url: str
) -> None:
    """A worker shutting down hands its prefetched job back (a release): its key, which
    had no other job waiting, joins behind the keys that kept theirs."""
    app = App(app_name, broker=broker_url)
    long_started = anyio.Event()
    finish = anyio.Event()

    @app.task(fair=Fair(key=lambda w: w.tenant))
    async def work(w: Work) -> Out:
        if w.n == 0:
            long_started.set()
            await finish.wait()
        return Out(w.n)

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            broker = app.broker
            await work.enqueue_many([Work("a", 0), Work("a", 1), Work("b", 2), Work("c", 3)])
            async with app.worker(concurrency=1, prefetch=1, grace=60) as worker:
                await long_started.wait()  # a's first job runs; b's is prefetched
                await until_count(broker, JobState.ACTIVE, 2)
                worker.stop()
                await until_count(broker, JobState.WAITING, 3)
                finish.set()
            assert worker.stats.completed == 1
            claimed = await broker.claim(["default"], 3, worker_id="w", lease=30)
            tenants = [msgspec.msgpack.decode(j.message.payload, type=Work).tenant for j in claimed]
            assert tenants == ["c", "a", "b"]


async def test_a_fair_job_its_gate_gives_back_keeps_its_keys_place(
    app_name: str, broker_url: str
) -> None:
    """A job its concurrency limit parked during its key's turn comes back when the
    slot frees (a hand-back): its key, with no other job waiting, joins at the tail."""
    async with connected(app_name, broker_url) as broker:
        broker.set_limits({"t": LimitSpec(concurrency=1)})
        await broker.enqueue([fair("a", job_id=f"a{i}", concurrency_key="a") for i in range(2)])
        await broker.enqueue([fair("b", job_id=f"b{i}", task="u") for i in range(4)])
        (first,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert first.message.id == "a0"
        # a's turn comes with a0 still running: a1 is parked, and a has no job waiting.
        assert [j.message.id for j in await broker.claim(["q"], 2, worker_id="w", lease=30)] == [
            "b0",
            "b1",
        ]
        await broker.complete([Completion(id="a0", token=first.token, result=b"\xc0")])
        claimed = await broker.claim(["q"], 3, worker_id="w", lease=30)
        assert [j.message.id for j in claimed] == ["b2", "a1", "b3"]


async def test_a_flows_released_fair_step_goes_first_in_its_keys_lane(
    app_name: str, broker_url: str
) -> None:
    """A chain's next step of a fair task, released while its key has jobs waiting,
    goes first in the key's lane (a flow under way finishes before new work starts, as
    a plain step goes to the head of its level), and the key keeps its place in the
    line; a key with no job waiting takes its turn at the head of the line."""
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue([fair("a", job_id=f"a{i}") for i in range(3)])
        first = msg(job_id=step_id("f", 0, 2), task="plain")
        second = msgspec.structs.replace(fair("a", job_id="f"), payload=b"")
        await broker.enqueue_flows([FlowSpec(id="f", steps=(first, second))])
        await broker.enqueue([fair("b", job_id=f"b{i}") for i in range(2)])
        # a's turn (a0), the flow's first step (its completion releases "f"), b's turn.
        assert await claim_order(broker, 3) == ["a0", "f.0", "b0"]
        assert await claim_order(broker, 4) == ["f", "b1", "a1", "a2"]
        first = msg(job_id=step_id("g", 0, 2), task="plain")
        second = msgspec.structs.replace(fair("a", job_id="g"), payload=b"")
        await broker.enqueue_flows([FlowSpec(id="g", steps=(first, second))])
        await broker.enqueue([fair("b", job_id="b2"), msg(job_id="p0")])
        assert await claim_order(broker, 1) == ["g.0"]
        assert await claim_order(broker, 3) == ["g", "b2", "p0"]


@pytest.mark.parametrize(
    ("fair_members", "fair_callback"),
    [(False, False), (True, False), (False, True), (True, True)],
    ids=["plain", "fair-members", "fair-callback", "both-fair"],
)
async def test_a_traced_fan_in_of_fair_jobs_links_its_members_spans(
    app_name: str, broker_url: str, fair_members: bool, fair_callback: bool
) -> None:
    """A traced fan-in callback gets its members' spans (JobMessage.trace_links, in
    member order) whether the members or the callback are fair jobs or not (a fair job's
    body has all 16 fields, trace_links among them: it is filled in, not appended)."""
    traceparent = "traceparent=00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    spans = [f"00-{'c' * 32}-{i:016x}-01" for i in range(3)]

    def job(key: str, job_id: str, is_fair: bool) -> JobMessage:
        return fair(key, job_id=job_id) if is_fair else msg(job_id=job_id)

    members = tuple(job(f"k{i}", member_id("f", i), fair_members) for i in range(3))
    callback = msgspec.structs.replace(
        job("cb", "f", fair_callback), payload=b"", trace_context=traceparent
    )
    async with connected(app_name, broker_url) as broker:
        await broker.enqueue_flows(
            [FlowSpec(id="f", members=members, fan_out=True, steps=(callback,))]
        )
        claimed = await broker.claim(["q"], 3, worker_id="w", lease=30)
        assert sorted(j.message.id for j in claimed) == [member_id("f", i) for i in range(3)]
        await broker.complete(
            [
                Completion(
                    id=j.message.id,
                    token=j.token,
                    result=b"\xc0",
                    span=spans[int(j.message.id.rsplit("m", 1)[1])],
                )
                for j in claimed
            ]
        )
        (got,) = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert got.message.id == "f"
        assert got.message.trace_context == traceparent
        assert got.message.trace_links == ",".join(spans)
        assert got.message.fair_weight == (1 if fair_callback else 0)
