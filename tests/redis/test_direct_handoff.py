"""Direct hand-off (issue 31, broker/redis/direct.py): an idle worker registers and
blocks on an inbox of its own; an enqueue that finds it hands the new jobs over already
claimed, never more than the worker's free slots; work stored any other way ends the
registration (the worker claims); a pop whose answer is lost, a shutdown and a cancel
lose no job and run none twice. Real redis-server spawned by the suite.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

from tests.redis_support import broker_at, message, raw_redis
from typedq import App
from typedq.broker.base import CLAIM_RECORD_TTL, ClaimedJob, Completion, FinishOutcome, JobState
from typedq.broker.redis import RedisBroker
from typedq.errors import BrokerUnavailable
from typedq.limits import LimitSpec

pytestmark = [pytest.mark.redis, pytest.mark.anyio, pytest.mark.asyncio_only]

#: Far past the pop's own bound (3 s): only a hand-off or a wake-up ends the wait
#: sooner than that within the test's deadline.
LONG = 3600.0
PROMPT = 20.0


async def assert_no_registration_left(raw: Any, queue_prefix: str) -> None:
    """No inbox nor registration of an ended hand-off is left; only what an end answered
    (':e'), kept a request TTL so that a re-sent end (its answer lost) answers the same
    jobs again, then gone."""
    for key in await raw.keys(queue_prefix + "I:*"):
        assert key.endswith(b":e"), key
        assert 0 < await raw.pttl(key) <= CLAIM_RECORD_TTL * 1000, key


async def idle(broker: RedisBroker, queues: list[str], free: int = 4) -> None:
    """A worker's claim that comes up short (it is about to wait)."""
    assert await broker.claim(queues, free, worker_id="w", lease=30) == []


async def wait_handed(
    broker: RedisBroker, queues: list[str], free: int, out: list[list[ClaimedJob]]
) -> None:
    out.append(await broker.wait_for_handoff(queues, free, LONG, worker_id="w", lease=30))


async def registered(broker: RedisBroker, queue: str) -> None:
    """Until the worker's registration is in the queue's hash."""
    async with raw_redis(broker.url) as raw:
        with anyio.fail_after(PROMPT):
            while not await raw.exists(broker.keys.handoffs(queue)):  # noqa: ASYNC110
                await anyio.sleep(0.005)


def handed_token(job: ClaimedJob) -> bool:
    """A hand-off's token ('<registration>.<id>'), not a claim's ('<claim>.<n>')."""
    return job.token.endswith("." + job.message.id)


async def test_an_enqueue_hands_its_job_to_the_waiting_worker(redis_url: str) -> None:
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"])
        got: list[list[ClaimedJob]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_handed, worker, ["q"], 4, got)
            await registered(worker, "q")
            await producer.enqueue([message("j")])
        ((job,),) = got
        assert job.message.id == "j"
        assert job.attempt == 1
        assert handed_token(job)
        # Claimed for the worker: active under that token, nothing waiting.
        (record,) = await producer.get(["j"], queue="q")
        assert record is not None
        assert record.state is JobState.ACTIVE
        counts = await producer.counts("q")
        assert counts[JobState.ACTIVE] == 1
        assert counts[JobState.WAITING] == 0
        # The worker settles it like any claimed job.
        assert await worker.complete([Completion("j", job.token, b"\xc0")]) == [FinishOutcome.OK]


async def test_never_more_jobs_than_free_slots_the_rest_wait(redis_url: str) -> None:
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"], 2)
        got: list[list[ClaimedJob]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_handed, worker, ["q"], 2, got)
            await registered(worker, "q")
            await producer.enqueue([message(f"j{i}") for i in range(5)])
        (jobs,) = got
        assert [j.message.id for j in jobs] == ["j0", "j1"]  # the oldest, in order
        counts = await producer.counts("q")
        assert counts[JobState.ACTIVE] == 2
        assert counts[JobState.WAITING] == 3
        # The registration is spent: the next enqueue is stored, and claims find all.
        await producer.enqueue([message("j5")])
        claimed = await worker.claim(["q"], 10, worker_id="w2", lease=30)
        assert [j.message.id for j in claimed] == ["j2", "j3", "j4", "j5"]


async def test_a_handed_batch_dedups_like_any_and_indexes_only_what_waits(
    redis_url: str,
) -> None:
    """With a worker registered, an enqueue writes no index field for the jobs it hands
    over (it finds new ids by their missing field, and a repeat of the call by its first
    occurrence): a repeated id is created once; the jobs past the worker's slots wait,
    with their index, so a claim takes them and a repeat of their ids later is refused;
    nothing handed is left in the index."""
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"], 2)
        got: list[list[ClaimedJob]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_handed, worker, ["q"], 2, got)
            await registered(worker, "q")
            created = await producer.enqueue(
                [message("a"), message("a"), message("b"), message("c"), message("b")]
            )
        assert [c.created for c in created] == [True, False, True, True, False]
        (jobs,) = got
        assert [j.message.id for j in jobs] == ["a", "b"]
        again = await producer.enqueue([message("c"), message("d")])
        assert [c.created for c in again] == [False, True]
        async with raw_redis(redis_url) as raw:
            indexed = set()
            for key in await raw.keys(producer.keys.queue_prefix("q") + "i:*"):
                indexed |= {f.decode() if isinstance(f, bytes) else f for f in await raw.hkeys(key)}
        assert indexed == {"c", "d"}
        claimed = await worker.claim(["q"], 10, worker_id="w2", lease=30)
        assert [j.message.id for j in claimed] == ["c", "d"]


async def test_work_stored_another_way_wakes_the_worker_to_claim(redis_url: str) -> None:
    """A job enqueued for later is stored, not handed: the registration ends with ''
    in the inbox, the wait returns no job, and the claim after it sees the work."""
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"])
        got: list[list[ClaimedJob]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_handed, worker, ["q"], 4, got)
            await registered(worker, "q")
            with anyio.fail_after(PROMPT):
                later = msgspec.structs.replace(message("s"), delay=0.2)
                await producer.enqueue([later])
        assert got == [[]]
        async with raw_redis(redis_url) as raw:
            assert await raw.exists(worker.keys.handoffs("q")) == 0


async def test_a_worker_registers_only_while_nothing_waits(redis_url: str) -> None:
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"])
        # Work came after the short claim, before the wait: the wait returns at once.
        await producer.enqueue([message("j")])
        with anyio.fail_after(PROMPT):
            assert await worker.wait_for_handoff(["q"], 4, LONG, worker_id="w", lease=30) == []
        (job,) = await worker.claim(["q"], 4, worker_id="w", lease=30)
        assert job.message.id == "j"
        assert not handed_token(job)


async def test_a_lost_pop_answer_loses_no_job(redis_url: str) -> None:
    """Jobs taken from the inbox by a pop whose answer never reached the worker (here:
    popped by another client) come back from the registration's record when it ends
    with ``recover`` (what a failed pop does), and only those the worker does not hold."""
    async with (
        broker_at(redis_url, "ho") as worker,
        broker_at(redis_url, "ho") as producer,
        raw_redis(redis_url) as raw,
    ):
        await idle(worker, ["q"])
        jobs, reg = await worker._register(None, ("q",), 4, worker_id="w", lease=30)
        assert jobs == []
        assert reg is not None
        await producer.enqueue([message("a"), message("b"), message("c")])
        inbox = worker.keys.inbox("q", reg.token)
        lost: list[bytes] = await raw.rpop(inbox, 2)  # type: ignore[assignment]
        assert [x.split(b"|")[0] for x in lost] == [b"a", b"b"]  # the pop's lost answer
        back = await worker._end(reg, worker_id="w", lease=30, recover=True)
        assert sorted(j.message.id for j in back) == ["a", "b", "c"]
        # Once held, a job is not answered again (the worker runs it already).
        again, reg2 = await worker._register(None, ("q",), 4, worker_id="w", lease=30)
        assert again == []
        assert reg2 is not None
        await producer.enqueue([message("d")])
        await raw.rpop(worker.keys.inbox("q", reg2.token), 1)
        back = await worker._end(reg2, worker_id="w", lease=30, recover=True)
        assert [j.message.id for j in back] == ["d"]
        assert await worker._end(reg2, worker_id="w", lease=30, recover=True) == []


async def test_an_end_resent_after_its_answer_was_lost_answers_the_same_jobs(
    redis_url: str,
) -> None:
    """A network fault can swallow the answer of the script that ends a registration, and
    the client then sends it again: the re-send answers the jobs the lost answer carried
    (handed, never received), or they would wait for their lease to expire with no worker
    dead (seen under dropped replies: tests/process/test_network_faults.py)."""
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        for recover in (False, True):
            await idle(worker, ["q"])
            jobs, reg = await worker._register(None, ("q",), 4, worker_id="w", lease=30)
            assert jobs == []
            assert reg is not None
            await producer.enqueue([message(f"{recover}-a"), message(f"{recover}-b")])
            first = await worker._end(reg, worker_id="w", lease=30, recover=recover)
            assert sorted(j.message.id for j in first) == [f"{recover}-a", f"{recover}-b"]
            for job in first:  # the answer never arrived: the worker holds none of them
                worker._held.pop(job.token)
            again = await worker._end(reg, worker_id="w", lease=30, recover=recover)
            assert [(j.message.id, j.token) for j in again] == [
                (j.message.id, j.token) for j in first
            ]
            await worker.complete([Completion(j.message.id, j.token, b"") for j in again])


async def test_a_refill_resent_while_registered_answers_what_its_first_copy_claimed(
    redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's completions with their refill claim (``complete_and_claim``) whose
    answer is lost are re-sent with the same claim id; meanwhile the worker's claim loop
    found nothing and registered for a hand-off. The re-send must still carry the claim,
    which answers the jobs the first copy claimed (a registered worker's completions
    otherwise go alone: those jobs would wait for their lease to expire with no worker
    dead; seen under dropped replies: tests/process/test_network_faults.py)."""
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await producer.enqueue([message("a"), message("b")])
        [a] = await worker.claim(["q"], 1, worker_id="w", lease=30)
        real = worker._eval

        async def answer_lost(*args: Any, **kwargs: Any) -> Any:
            await real(*args, **kwargs)  # it ran on Redis...
            monkeypatch.setattr(worker, "_eval", real)
            raise BrokerUnavailable("the reply was lost")  # ...its answer never came

        monkeypatch.setattr(worker, "_eval", answer_lost)
        done = [Completion(a.message.id, a.token, b"")]
        with pytest.raises(BrokerUnavailable):
            await worker.complete_and_claim(
                done, ["q"], 1, worker_id="w", lease=30, claim_id="c1c1c1c1"
            )
        await idle(worker, ["q"])  # "b" was taken by the lost copy's claim
        jobs, reg = await worker._register(None, ("q",), 4, worker_id="w", lease=30)
        assert jobs == []
        assert reg is not None
        worker._registrations["w"] = reg
        outcomes, refill = await worker.complete_and_claim(
            done, ["q"], 1, worker_id="w", lease=30, claim_id="c1c1c1c1"
        )
        assert [j.message.id for j in refill] == ["b"]
        assert (await worker.get(["a"]))[0].state is JobState.COMPLETED  # type: ignore[union-attr]
        assert len(outcomes) == 1
        # An answered call is forgotten: the registered worker's next completions go alone.
        [b] = refill
        outcomes, more = await worker.complete_and_claim(
            [Completion(b.message.id, b.token, b"")],
            ["q"],
            1,
            worker_id="w",
            lease=30,
            claim_id="c2c2c2c2",
        )
        assert more == []
        await worker.end_handoff("w")


async def test_a_killed_blocking_connection_ends_the_wait_cleanly(redis_url: str) -> None:
    async with (
        broker_at(redis_url, "ho") as worker,
        broker_at(redis_url, "ho") as producer,
        raw_redis(redis_url) as raw,
    ):
        await idle(worker, ["q"])
        got: list[list[ClaimedJob]] = []
        with anyio.fail_after(PROMPT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait_handed, worker, ["q"], 4, got)
                await registered(worker, "q")
                while not [c for c in await raw.client_list() if c.get("cmd") == "blmpop"]:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
                for c in await raw.client_list():
                    if c.get("cmd") == "blmpop":
                        await raw.client_kill_filter(_id=c["id"])
        assert got == [[]]
        assert await raw.exists(worker.keys.handoffs("q")) == 0
        # The next enqueue is stored for a claim, and the worker waits again as before.
        await producer.enqueue([message("j")])
        (job,) = await worker.claim(["q"], 4, worker_id="w", lease=30)
        assert job.message.id == "j"


async def test_shutdown_hands_back_jobs_handed_but_not_taken(redis_url: str) -> None:
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"])
        got: list[list[ClaimedJob]] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_handed, worker, ["q"], 4, got)
            await registered(worker, "q")
            await producer.enqueue([message("a")])
        ((_a,),) = got
        # The registration still has 3 slots: a job handed now sits in the inbox.
        await producer.enqueue([message("b")])
        await worker.end_handoff("w")
        counts = await producer.counts("q")
        assert counts[JobState.WAITING] == 1
        assert counts[JobState.ACTIVE] == 1
        (b,) = await producer.claim(["q"], 4, worker_id="w2", lease=30)
        assert b.message.id == "b"
        assert b.attempt == 1
        async with raw_redis(redis_url) as raw:
            await assert_no_registration_left(raw, worker.keys.queue_prefix("q"))


async def test_a_worker_with_limits_is_never_handed_a_job(redis_url: str) -> None:
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        worker.set_limits({"t": LimitSpec(concurrency=1)})
        await idle(worker, ["q"])
        async with anyio.create_task_group() as tg:

            async def enqueue_later() -> None:
                await anyio.sleep(0.2)
                await producer.enqueue([message("j")])

            tg.start_soon(enqueue_later)
            with anyio.fail_after(PROMPT):
                assert await worker.wait_for_handoff(["q"], 4, LONG, worker_id="w", lease=30) == []
        async with raw_redis(redis_url) as raw:
            assert await raw.exists(worker.keys.handoffs("q")) == 0
        (job,) = await worker.claim(["q"], 4, worker_id="w", lease=30)
        assert not handed_token(job)


class In(msgspec.Struct):
    n: int


class Out(msgspec.Struct):
    n: int


async def test_workers_run_trickled_jobs_once_each(redis_url: str) -> None:
    """Two workers of one app, jobs enqueued one by one (each finds an idle worker):
    every job runs once, most of them handed over directly."""
    app = App("hotrickle", broker=redis_url)
    runs: Counter[int] = Counter()
    tokens: list[bool] = []

    @app.task
    async def tally(x: In) -> Out:
        runs[x.n] += 1
        return Out(x.n)

    with anyio.fail_after(60):
        async with app:
            async with app.worker(concurrency=2) as w1, app.worker(concurrency=3) as w2:
                jobs = []
                for i in range(120):
                    jobs.append(await tally.enqueue(In(i)))
                    if i % 10 == 0:
                        await anyio.sleep(0.01)
                results = [await job.result(timeout=10) for job in jobs]
            broker = app.broker
            assert isinstance(broker, RedisBroker)
            async with raw_redis(redis_url) as raw:
                for job in jobs:
                    # The token of its completed attempt ('d').
                    token = await raw.hget(broker.keys.job("default", job.id), "d")
                    tokens.append(
                        isinstance(token, bytes) and token.endswith(f".{job.id}".encode())
                    )
                # Nothing left registered once the workers stopped.
                await assert_no_registration_left(raw, broker.keys.queue_prefix("default"))
    assert results == [Out(i) for i in range(120)]
    assert runs == dict.fromkeys(range(120), 1)
    assert w1.stats.completed + w2.stats.completed == 120
    assert sum(tokens) > 60  # most went straight to an idle worker


async def test_a_registration_cancelled_before_its_answer_was_read_takes_no_job(
    redis_url: str,
) -> None:
    """A worker's shutdown cancels its registration's call after the script ran and
    before the answer was read: the worker does not know of the registration, and it
    would take the next enqueue's jobs (claimed for an inbox nobody pops, until their
    lease ran out: a job enqueued right after a worker stopped stayed active). The
    cancelled call ends it."""
    async with broker_at(redis_url, "ho") as worker, broker_at(redis_url, "ho") as producer:
        await idle(worker, ["q"])
        real = worker._eval
        with anyio.CancelScope() as scope:

            async def cancelled_after_the_script(name: str, keys: Any, args: Any) -> Any:
                reply = await real(name, keys, args)
                if name == "handoff" and args[3]:  # a registration: a new token
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()  # the answer is never read
                return reply

            worker._eval = cancelled_after_the_script  # type: ignore[method-assign]
            await worker.wait_for_handoff(["q"], 4, LONG, worker_id="w", lease=30)
        assert scope.cancelled_caught
        worker._eval = real  # type: ignore[method-assign]
        await producer.enqueue([message("a")])
        (a,) = await producer.claim(["q"], 4, worker_id="w2", lease=30)
        assert a.message.id == "a"
        async with raw_redis(redis_url) as raw:
            await assert_no_registration_left(raw, worker.keys.queue_prefix("q"))
