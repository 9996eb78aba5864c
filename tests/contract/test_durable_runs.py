"""Durable runs on every broker: ``@app.durable`` end to end, and the ``Runs`` capability
directly (compare-and-append, signal inboxes, turns, kept step outcomes, retention).

The embedded broker's run store (typedq/broker/memory/runs.py) is the reference; the
Redis broker keeps a run on its queue's slot (typedq/broker/redis/runs.py), the
PostgreSQL broker in its schema (migration 9, typedq/broker/postgres/runs.py). Real time
here: sleeps and timeouts are tens of milliseconds, and time bounds are generous.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE, connected
from typedq import App, Retention
from typedq.broker.base import (
    Broker,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    JobState,
    LeaseStatus,
)
from typedq.broker.runs import (
    AppendOutcome,
    RunAppend,
    RunRecord,
    RunSignal,
    RunSpec,
    RunState,
    SignalOutcome,
    StepOutcome,
)
from typedq.durable import Run, RunTimeout, Signal, StepScheduled, decode_entries, encode_entries
from typedq.errors import FailureReason, FailureRecord, JobCancelled, JobFailed

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class User(msgspec.Struct, frozen=True):
    name: str


class Account(msgspec.Struct, frozen=True):
    id: str


class Approval(msgspec.Struct, frozen=True):
    ok: bool


class Outcome(msgspec.Struct, frozen=True):
    accounts: list[str]
    approved: bool


approval = Signal("approval", Approval)


async def wait_record(
    broker: Broker, run_id: str, predicate: Callable[[RunRecord], bool]
) -> RunRecord:
    """Poll the run until ``predicate(record)`` holds."""
    with anyio.fail_after(TEST_DEADLINE):
        while True:
            [record] = await broker.get_runs([run_id])
            if record is not None and predicate(record):
                return record
            await anyio.sleep(0.005)


# -- @app.durable end to end -----------------------------------------------------------


async def test_a_run_with_steps_gather_a_sleep_and_a_signal(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls: Counter[str] = Counter()

    @app.task(queue="accounts")
    async def create_account(user: User) -> Account:
        calls[user.name] += 1
        return Account(id=f"acct-{user.name}")

    @app.durable
    async def onboard(run: Run, user: User) -> Outcome:
        first = await run.step(create_account, user)
        more = await run.gather(
            run.step(create_account, User(user.name + "-a")),
            run.step(create_account, User(user.name + "-b")),
        )
        await run.sleep(timedelta(seconds=0.05))
        got = await run.wait_for(approval, timeout=timedelta(seconds=TEST_DEADLINE))
        return Outcome(accounts=[first.id, *(a.id for a in more)], approved=got.ok)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            handle = await onboard.start(User("ada"), run_id="run-1")
            await wait_record(app.broker, "run-1", lambda r: r.wait_signal == "approval")
            assert await handle.send(approval, Approval(ok=True)) is SignalOutcome.DELIVERED
            result = await handle.result(timeout=TEST_DEADLINE)
            assert result == Outcome(["acct-ada", "acct-ada-a", "acct-ada-b"], True)
            record = await handle.record()
            assert record.state is RunState.COMPLETED
            assert record.outcomes == {}
            assert record.finished_at >= record.created_at > 0
            assert await handle.send(approval, Approval(ok=False)) is SignalOutcome.FINISHED
            assert await handle.cancel() is False
    assert calls == Counter({"ada": 1, "ada-a": 1, "ada-b": 1})


async def test_a_signal_sent_before_the_wait_is_kept(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.durable
    async def waits(run: Run, user: User) -> Approval:
        await run.sleep(timedelta(seconds=0.05))
        return await run.wait_for(approval)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            handle = await waits.start(User("bo"), run_id="early")
            assert await handle.send(approval, Approval(ok=True)) is SignalOutcome.DELIVERED
            assert await handle.send(approval, Approval(ok=False)) is SignalOutcome.DELIVERED
            assert await handle.result(timeout=TEST_DEADLINE) == Approval(ok=True)
            record = await handle.record()
            assert record.inbox == {"approval": (approval.encode(Approval(ok=False)),)}


async def test_the_wait_times_out(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)

    @app.durable
    async def impatient(run: Run, user: User) -> Approval:
        try:
            return await run.wait_for(approval, timeout=timedelta(seconds=0.05))
        except RunTimeout:
            return Approval(ok=False)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            start = anyio.current_time()
            handle = await impatient.start(User("cy"))
            assert await handle.result(timeout=TEST_DEADLINE) == Approval(ok=False)
            assert anyio.current_time() - start < TEST_DEADLINE / 2


async def test_a_failed_step_is_caught_and_compensated(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls: Counter[str] = Counter()
    caught: set[str] = set()

    @app.task
    async def reserve(user: User) -> Account:
        calls["reserve"] += 1
        return Account(id="held")

    @app.task(retries=0, queue="payments")
    async def charge(acct: Account) -> Account:
        calls["charge"] += 1
        raise ValueError("card declined")

    @app.task
    async def release(acct: Account) -> Account:
        calls["release"] += 1
        return Account(id="released")

    @app.durable
    async def order(run: Run, user: User) -> Account:
        held = await run.step(reserve, user)
        try:
            return await run.step(charge, held)
        except JobFailed as exc:
            caught.add(exc.record.message)  # (once per replay of this turn on)
            return await run.step(release, held)

    @app.durable
    async def uncaught(run: Run, user: User) -> Account:
        return await run.step(charge, Account(id="x"))

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            handle = await order.start(User("s"), run_id="saga")
            assert await handle.result(timeout=TEST_DEADLINE) == Account(id="released")
            failing = await uncaught.start(User("t"), run_id="fails")
            with pytest.raises(JobFailed, match="failed"):
                await failing.result(timeout=TEST_DEADLINE)
            record = await failing.record()
            assert record.state is RunState.FAILED
            assert record.failure is not None
            assert "card declined" in record.failure.message
    assert calls == Counter(reserve=1, charge=2, release=1)
    [message] = caught
    assert "card declined" in message


async def test_cancel_ends_the_run_and_cancels_its_running_step(
    app_name: str, broker_url: str
) -> None:
    app = App(app_name, broker=broker_url)
    started = anyio.Event()

    @app.task(queue="slow")
    async def forever(user: User) -> Account:
        started.set()
        await anyio.sleep(TEST_DEADLINE * 2)
        return Account(id="never")

    @app.durable
    async def stuck(run: Run, user: User) -> Account:
        return await run.step(forever, user)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=4):
            handle = await stuck.start(User("z"), run_id="stuck")
            await started.wait()
            await wait_record(app.broker, "stuck", lambda r: r.wait_jobs == ("stuck:0",))
            assert await handle.cancel() is True
            assert await handle.cancel() is False
            with pytest.raises(JobCancelled):
                await handle.result(timeout=TEST_DEADLINE)
            record = await handle.record()
            assert record.state is RunState.CANCELLED
            assert record.failure is not None
            assert record.failure.reason is FailureReason.CANCELLED
            assert record.wait_jobs == ()
            while True:
                [step] = await app.broker.get(["stuck:0"], queue="slow")
                assert step is not None
                if step.state is JobState.CANCELLED:
                    break
                await anyio.sleep(0.01)


async def test_start_is_idempotent_by_run_id(app_name: str, broker_url: str) -> None:
    app = App(app_name, broker=broker_url)
    calls: Counter[str] = Counter()

    @app.task
    async def make(user: User) -> Account:
        calls[user.name] += 1
        return Account(id=user.name)

    @app.durable
    async def once(run: Run, user: User) -> Account:
        return await run.step(make, user)

    with anyio.fail_after(TEST_DEADLINE):
        async with app, app.worker(concurrency=2):
            first = await once.start(User("ada"), run_id="same")
            second = await once.start(User("other"), run_id="same")
            assert await second.result(timeout=TEST_DEADLINE) == Account(id="ada")
            third = await once.start(User("third"), run_id="same")
            assert await third.result(timeout=TEST_DEADLINE) == Account(id="ada")
            assert first.run_id == "same"
    assert calls == Counter(ada=1)


# -- the capability, directly ------------------------------------------------------------


def stored(record: RunRecord | None) -> RunRecord | None:
    """A run record without the time it was read (two reads of one run differ there)."""
    return None if record is None else msgspec.structs.replace(record, read_at=0.0)


def spec(run_id: str, queue: str = "q") -> RunSpec:
    return RunSpec(
        id=run_id,
        name="f",
        queue=queue,
        turn_task="typedq.run.f",
        turn_payload=b"\x90",
        input=b"in",
    )


ENTRY = encode_entries([StepScheduled(position=0, task="t", digest="0" * 16)])


async def waiting_turns(broker: Broker, queue: str = "q") -> int:
    return (await broker.counts(queue))[JobState.WAITING]


async def test_appends_are_fenced_and_signals_kept_in_order(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        [(created, record)] = await broker.create_runs([spec("r1")])
        assert created
        assert record.spec == spec("r1")
        assert record.state is RunState.RUNNING
        assert (record.log, record.inbox, record.outcomes) == ((), {}, {})
        assert record.wait_jobs == ()
        assert record.wait_signal is None
        assert record.wake_at is None
        [(created, again)] = await broker.create_runs([spec("r1", queue="q")])
        assert not created
        assert again.created_at == record.created_at
        assert await waiting_turns(broker) == 1  # its first turn
        [turn] = await broker.get(["r1:t1"], queue="q")
        assert turn is not None
        assert (turn.message.task, turn.message.payload) == ("typedq.run.f", b"\x90")
        ok, stale, gone = await broker.append_runs(
            [
                RunAppend(run_id="r1", expected=0, entries=(ENTRY,)),
                RunAppend(run_id="r1", expected=0, entries=(ENTRY,)),
                RunAppend(run_id="nope", expected=0),
            ]
        )
        assert (ok, stale, gone) == (
            AppendOutcome.APPENDED,
            AppendOutcome.CONFLICT,
            AppendOutcome.NOT_FOUND,
        )
        [logged] = await broker.get_runs(["r1"])
        assert logged is not None
        assert [e.position for b in logged.log for e in decode_entries(b)] == [0]
        sent = await broker.signal_runs(
            [RunSignal(run_id="r1", signal="s", payload=p) for p in (b"1", b"2")]
            + [RunSignal(run_id="r1", signal="other", payload=b"o")]
        )
        assert sent == [SignalOutcome.DELIVERED] * 3
        [kept] = await broker.get_runs(["r1"])
        assert kept is not None
        assert kept.inbox == {"s": (b"1", b"2"), "other": (b"o",)}
        # Taking a signal that is not there is a conflict (only fenced appends take).
        [empty] = await broker.append_runs([RunAppend(run_id="r1", expected=1, take_signal="none")])
        assert empty is AppendOutcome.CONFLICT
        [taken] = await broker.append_runs(
            [RunAppend(run_id="r1", expected=1, entries=(ENTRY,), take_signal="s")]
        )
        assert taken is AppendOutcome.APPENDED
        [taken] = await broker.append_runs(
            [RunAppend(run_id="r1", expected=2, take_signal="s", wait_signal="s")]
        )
        assert taken is AppendOutcome.APPENDED
        [left] = await broker.get_runs(["r1"])
        assert left is not None
        assert left.inbox == {"other": (b"o",)}
        assert left.wait_signal == "s"
        assert len(left.log) == 2
        assert await broker.cancel_runs(["r1", "r1", "nope"]) == [True, False, False]
        [ended] = await broker.get_runs(["r1"])
        assert ended is not None
        assert ended.state is RunState.CANCELLED
        assert ended.failure is not None
        assert ended.failure.reason is FailureReason.CANCELLED
        assert ended.failure.message == "run cancelled"
        assert ended.wait_signal is None
        assert ended.finished_at >= ended.created_at
        assert await broker.signal_runs([RunSignal(run_id="r1", signal="s", payload=b"")]) == [
            SignalOutcome.FINISHED
        ]
        assert await broker.signal_runs([RunSignal(run_id="nope", signal="s", payload=b"")]) == [
            SignalOutcome.NOT_FOUND
        ]
        [finished] = await broker.append_runs([RunAppend(run_id="r1", expected=2)])
        assert finished is AppendOutcome.FINISHED
        assert [stored(r) for r in await broker.get_runs(["nope", "r1"])] == [None, stored(ended)]
        assert await broker.wake_runs([("r1", 0.0), ("nope", 0.0)]) == [False, False]


async def test_a_final_append_ends_the_run(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("ok"), spec("bad")])
        failure = msgspec.structs.replace(
            (await _some_failure(broker)), message="it broke", attempt=2
        )
        answers = await broker.append_runs(
            [
                RunAppend(
                    run_id="ok",
                    expected=0,
                    entries=(ENTRY, ENTRY),
                    state=RunState.COMPLETED,
                    result=b"",
                ),
                RunAppend(run_id="bad", expected=0, state=RunState.FAILED, failure=failure),
            ]
        )
        assert answers == [AppendOutcome.APPENDED] * 2
        ok, bad = await broker.get_runs(["ok", "bad"])
        assert ok is not None
        assert bad is not None
        assert (ok.state, ok.result, len(ok.log)) == (RunState.COMPLETED, b"", 2)
        assert (bad.state, bad.failure) == (RunState.FAILED, failure)


async def _some_failure(broker: Broker) -> FailureRecord:
    """A FailureRecord as a cancel writes it (any record will do)."""
    await broker.create_runs([spec("any")])
    await broker.cancel_runs(["any"])
    [record] = await broker.get_runs(["any"])
    assert record is not None
    assert record.failure is not None
    return record.failure


async def test_an_appends_steps_are_stored_with_it(app_name: str, broker_url: str) -> None:
    """RunAppend.steps: the step jobs an append schedules are stored with it (on the
    run's queue and on others), once, and the run waits on them; one that ends wakes it."""
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("r3")])
        steps = tuple(
            JobMessage(id=f"r3:{i}", task="t", queue=q, payload=b"", run_queue="q")
            for i, q in enumerate(("q", "other"))
        )
        [appended] = await broker.append_runs(
            [
                RunAppend(
                    run_id="r3",
                    expected=0,
                    entries=(ENTRY,),
                    wait_jobs=("r3:0", "r3:1"),
                    steps=steps,
                )
            ]
        )
        assert appended is AppendOutcome.APPENDED
        [again] = await broker.append_runs(
            [RunAppend(run_id="r3", expected=0, wait_jobs=("r3:0",), steps=steps[:1])]
        )
        assert again is AppendOutcome.CONFLICT
        jobs = await broker.get(["r3:0", "r3:1"])
        assert [(j.message.queue, j.state) for j in jobs if j is not None] == [
            ("q", JobState.WAITING),
            ("other", JobState.WAITING),
        ]
        assert await waiting_turns(broker) == 2  # the first turn and r3:0, once
        [record] = await broker.get_runs(["r3"])
        assert record is not None
        assert record.wait_jobs == ("r3:0", "r3:1")
        [claimed] = await broker.claim(["other"], 1, worker_id="w", lease=30)
        await broker.complete([Completion(claimed.message.id, claimed.token, b"out")])
        woken = await wait_record(broker, "r3", lambda r: "r3:1" in r.outcomes)
        assert woken.outcomes["r3:1"] == StepOutcome(state=JobState.COMPLETED, result=b"out")


async def test_a_steps_outcome_is_kept_and_wakes_the_waiting_run(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("r2")])
        steps = [
            JobMessage(id=f"r2:{i}", task="t", queue=q, payload=b"", run_queue="q")
            for i, q in enumerate(("steps", "other", "q"))
        ]
        await broker.enqueue(steps)
        [appended] = await broker.append_runs(
            [RunAppend(run_id="r2", expected=0, wait_jobs=("r2:0", "r2:1", "r2:2"))]
        )
        assert appended is AppendOutcome.APPENDED
        [claimed] = await broker.claim(["steps"], 1, worker_id="w", lease=30)
        await broker.complete([Completion(claimed.message.id, claimed.token, b"out")])
        [failed] = await broker.claim(["other"], 1, worker_id="w", lease=30)
        await broker.fail([Failure(id=failed.message.id, token=failed.token, error=b"err")])
        # The job's record may go (retention, an operator): the run keeps its outcome.
        assert await broker.remove(["r2:0"], queue="steps") == [True]
        record = await wait_record(broker, "r2", lambda r: len(r.outcomes) == 2)
        assert record.outcomes["r2:0"] == StepOutcome(state=JobState.COMPLETED, result=b"out")
        assert record.outcomes["r2:1"].state is JobState.FAILED
        # Its first turn still waits, unclaimed: the steps' ends add no second one.
        assert await waiting_turns(broker) == 2  # the turn, and the step r2:2 on q
        [turn] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert turn.message.id == "r2:t1"
        assert await broker.wake_runs([("r2", 0.0)]) == [True]  # claimed: a new turn is due
        assert await broker.wake_runs([("r2", 0.0)]) == [True]  # ... one only
        [queued] = await broker.get(["r2:t2"], queue="q")
        assert queued is not None
        assert queued.state is JobState.WAITING
        [none] = await broker.get(["r2:t3"], queue="q")
        assert none is None
        # An append that records an outcome drops it from the run; one waiting on a step
        # whose outcome is kept wakes the run at once (its turn r2:t2 is still waiting).
        [recorded] = await broker.append_runs(
            [RunAppend(run_id="r2", expected=0, recorded_jobs=("r2:0",), wait_jobs=("r2:1",))]
        )
        assert recorded is AppendOutcome.APPENDED
        [after] = await broker.get_runs(["r2"])
        assert after is not None
        assert set(after.outcomes) == {"r2:1"}
        [none] = await broker.get(["r2:t3"], queue="q")
        assert none is None
        # A timer: a scheduled turn; a wait whose timer is past: a turn at once.
        both = await broker.claim(["q"], 2, worker_id="w", lease=30)
        assert sorted(c.message.id for c in both) == ["r2:2", "r2:t2"]
        [step2] = [c for c in both if c.message.id == "r2:2"]
        [timed] = await broker.append_runs(
            [
                RunAppend(
                    run_id="r2",
                    expected=0,
                    recorded_jobs=("r2:1",),
                    wait_jobs=("r2:2",),
                    wake_at=(await broker.broker_time_us()) / 1e6 + 3600,
                )
            ]
        )
        assert timed is AppendOutcome.APPENDED
        [later] = await broker.get(["r2:t3"], queue="q")
        assert later is not None
        assert later.state is JobState.SCHEDULED
        # The step on the run's own queue ends: the run wakes (r2:t4).
        await broker.complete([Completion(step2.message.id, step2.token, b"2")])
        [woken] = await broker.get(["r2:t4"], queue="q")
        assert woken is not None
        assert woken.state is JobState.WAITING
        [done] = await broker.get_runs(["r2"])
        assert done is not None
        assert done.outcomes == {"r2:2": StepOutcome(state=JobState.COMPLETED, result=b"2")}
        assert done.wake_at is not None
        # A job that is not a run's step (no run_queue) is none of its business.
        await broker.enqueue([JobMessage(id="r2:9", task="t", queue="plain", payload=b"")])
        [claimed9] = await broker.claim(["plain"], 1, worker_id="w", lease=30)
        assert claimed9.message.id == "r2:9"
        await broker.complete([Completion(claimed9.message.id, claimed9.token, b"")])
        # ... nor a wait on it: no turn at once.
        [ok] = await broker.append_runs(
            [RunAppend(run_id="r2", expected=0, recorded_jobs=("r2:2",), wait_jobs=("r2:9",))]
        )
        assert ok is AppendOutcome.APPENDED
        assert await broker.get(["r2:t5"], queue="q") == [None]
        [same] = await broker.get_runs(["r2"])
        assert same is not None
        assert same.outcomes == {}


async def test_a_fenced_append_records_a_step_before_its_completion(
    app_name: str, broker_url: str
) -> None:
    """RunAppend.fence: a step's worker appends the step's outcome and the run's next
    decision while it holds the step's lease, then completes the step: the completion
    keeps no outcome and wakes no turn. A fence whose job is not held under its token
    (another token, the job completed) changes nothing: FENCED, no step stored. A
    broker without ``fenced_run_appends`` answers FENCED to every fenced append."""
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("rf")])
        [turn] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert turn.message.id == "rf:t1"  # claimed: a wake-up would enqueue rf:t2
        step0 = JobMessage(id="rf:0", task="t", queue="q", payload=b"", run_queue="q")
        step1 = JobMessage(id="rf:1", task="t", queue="q", payload=b"", run_queue="q")
        [first] = await broker.append_runs(
            [
                RunAppend(
                    run_id="rf", expected=0, entries=(ENTRY,), wait_jobs=("rf:0",), steps=(step0,)
                )
            ]
        )
        assert first is AppendOutcome.APPENDED
        [claimed] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert claimed.message.id == "rf:0"
        fenced = RunAppend(
            run_id="rf",
            expected=1,
            entries=(ENTRY,),
            recorded_jobs=("rf:0",),
            wait_jobs=("rf:1",),
            steps=(step1,),
            fence=("rf:0", claimed.token, "q"),
        )
        wrong = msgspec.structs.replace(fenced, fence=("rf:0", "0" * 32, "q"))
        assert await broker.append_runs([wrong]) == [AppendOutcome.FENCED]
        assert await broker.get(["rf:1"], queue="q") == [None]
        [applied] = await broker.append_runs([fenced])
        if not broker.fenced_run_appends:
            assert applied is AppendOutcome.FENCED
            return
        assert applied is AppendOutcome.APPENDED
        [record] = await broker.get_runs(["rf"])
        assert record is not None
        assert (len(record.log), record.wait_jobs, record.outcomes) == (2, ("rf:1",), {})
        [stored] = await broker.get(["rf:1"], queue="q")
        assert stored is not None
        assert stored.state is JobState.WAITING
        assert await broker.complete([Completion("rf:0", claimed.token, b"out")]) == [
            FinishOutcome.OK
        ]
        [record] = await broker.get_runs(["rf"])
        assert record is not None
        assert record.outcomes == {}  # recorded already: not kept again
        assert await broker.get(["rf:t2"], queue="q") == [None]  # and no turn woken
        # The job has ended: its token holds no lease any more.
        again = msgspec.structs.replace(fenced, expected=2)
        assert await broker.append_runs([again]) == [AppendOutcome.FENCED]


async def test_a_steps_stale_owner_records_nothing_in_its_run(
    app_name: str, broker_url: str
) -> None:
    """A step whose lease ran out and was recovered and claimed again: its first owner
    can neither renew it nor settle it, and its run keeps no outcome and wakes for none
    of its calls; the new owner's completion is the run's, once (issue 30)."""
    lease = 0.2
    async with connected(app_name, broker_url, lease=lease) as broker:
        await broker.create_runs([spec("r9")])
        await broker.enqueue(
            [JobMessage(id="r9:0", task="t", queue="steps", payload=b"", run_queue="q")]
        )
        [appended] = await broker.append_runs(
            [RunAppend(run_id="r9", expected=0, wait_jobs=("r9:0",))]
        )
        assert appended is AppendOutcome.APPENDED
        [turn] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert turn.message.id == "r9:t1"  # claimed: a wake-up would enqueue r9:t2
        [stale] = await broker.claim(["steps"], 1, worker_id="w1", lease=lease)
        await anyio.sleep(lease * 1.5 + 0.05)  # the lease runs out (the broker's clock)
        assert await broker.recover_stalled() == 1
        [fresh] = await broker.claim(["steps"], 1, worker_id="w2", lease=30)
        assert (fresh.attempt, fresh.token != stale.token) == (2, True)
        assert await broker.renew([("r9:0", stale.token)], 30) == [LeaseStatus.LOST]
        assert await broker.complete([Completion("r9:0", stale.token, b"stale")]) == [
            FinishOutcome.LEASE_LOST
        ]
        assert await broker.fail([Failure(id="r9:0", token=stale.token, error=b"e")]) == [
            FinishOutcome.LEASE_LOST
        ]
        [record] = await broker.get_runs(["r9"])
        assert record is not None
        assert record.outcomes == {}
        assert await broker.get(["r9:t2"], queue="q") == [None]
        assert await broker.renew([("r9:0", fresh.token)], 30) == [LeaseStatus.OK]
        assert await broker.complete([Completion("r9:0", fresh.token, b"real")]) == [
            FinishOutcome.OK
        ]
        [record] = await broker.get_runs(["r9"])
        assert record is not None
        assert record.outcomes == {"r9:0": StepOutcome(state=JobState.COMPLETED, result=b"real")}
        [woken] = await broker.get(["r9:t2"], queue="q")
        assert woken is not None
        assert woken.state is JobState.WAITING
        assert await broker.get(["r9:t3"], queue="q") == [None]


async def test_a_wait_already_over_wakes_the_run_at_once(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("r3")])
        [first] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert first.message.id == "r3:t1"
        await broker.signal_runs([RunSignal(run_id="r3", signal="go", payload=b"x")])
        [ok] = await broker.append_runs([RunAppend(run_id="r3", expected=0, wait_signal="go")])
        assert ok is AppendOutcome.APPENDED
        assert await waiting_turns(broker) == 1  # a signal in the inbox: a turn at once
        [second] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert second.message.id == "r3:t2"
        [ok] = await broker.append_runs([RunAppend(run_id="r3", expected=0, wake_at=1.0)])
        assert ok is AppendOutcome.APPENDED
        [third] = await broker.get(["r3:t3"], queue="q")
        assert third is not None
        assert third.state is JobState.WAITING
        [ok] = await broker.append_runs([RunAppend(run_id="r3", expected=0, wait_signal="other")])
        assert ok is AppendOutcome.APPENDED
        assert await waiting_turns(broker) == 1  # nothing over: no turn
        # A signal it waits for wakes it (a turn waits already: no second one).
        await broker.signal_runs([RunSignal(run_id="r3", signal="other", payload=b"")])
        assert await waiting_turns(broker) == 1


async def test_ended_runs_are_kept_within_the_retention_bounds(
    app_name: str, broker_url: str
) -> None:
    retention = Retention(completed_max=2, failed_ttl=0.3)
    async with connected(app_name, broker_url, retention=retention) as broker:
        ids = [f"c{i}" for i in range(4)]
        await broker.create_runs([spec(i) for i in ids])
        for run_id in ids:
            [ok] = await broker.append_runs(
                [RunAppend(run_id=run_id, expected=0, state=RunState.COMPLETED, result=b"")]
            )
            assert ok is AppendOutcome.APPENDED
        records = await broker.get_runs(ids)
        assert [r is not None for r in records] == [False, False, True, True]  # oldest out
        # A dropped run's id is free again: a new run under it.
        [(created, again)] = await broker.create_runs([spec("c0")])
        assert created
        assert again.state is RunState.RUNNING
        await broker.create_runs([spec("x1")])
        assert await broker.cancel_runs(["x1"]) == [True]
        [cancelled] = await broker.get_runs(["x1"])
        assert cancelled is not None
        with anyio.fail_after(TEST_DEADLINE):
            while True:  # failed_ttl passes
                if await broker.get_runs(["x1"]) == [None]:
                    break
                await anyio.sleep(0.05)
        assert await broker.signal_runs([RunSignal(run_id="x1", signal="s", payload=b"")]) == [
            SignalOutcome.NOT_FOUND
        ]
        # One that expired unseen is dropped by the create that takes its id again.
        await broker.create_runs([spec("x2")])
        assert await broker.cancel_runs(["x2"]) == [True]
        await anyio.sleep(0.5)
        [(created, fresh)] = await broker.create_runs([spec("x2")])
        assert created
        [found] = await broker.get_runs(["x2"])
        assert stored(found) == stored(fresh)
        # The running and the completed ones are not aged out by failed_ttl.
        assert [r is not None for r in await broker.get_runs(["c0", "c2", "c3"])] == [True] * 3


async def test_wait_run_wakes_when_the_log_grows_or_the_run_ends(
    app_name: str, broker_url: str
) -> None:
    async with connected(app_name, broker_url) as broker:
        assert await broker.wait_run("nope", 0, 0.01) is None
        await broker.create_runs([spec("w")])
        # Nothing new: the record as it is, after the timeout.
        start = anyio.current_time()
        before = await broker.broker_time_us() / 1_000_000
        [record] = await broker.get_runs(["w"])
        # A read tells the broker's time of it (a turn replays at that time).
        assert record is not None
        assert before <= record.read_at <= await broker.broker_time_us() / 1_000_000
        assert stored(await broker.wait_run("w", 0, 0.05)) == stored(record)
        assert anyio.current_time() - start >= 0.04
        got: list[RunRecord | None] = []

        async def wait(seen: int) -> None:
            got.append(await broker.wait_run("w", seen, TEST_DEADLINE))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, 0)
            await anyio.sleep(0.05)
            # An append without entries (what it waits for) wakes no one.
            await broker.append_runs([RunAppend(run_id="w", expected=0, wait_signal="s")])
            await anyio.sleep(0.05)
            assert got == []
            start = anyio.current_time()
            await broker.append_runs([RunAppend(run_id="w", expected=0, entries=(ENTRY,))])
        assert anyio.current_time() - start < TEST_DEADLINE / 2
        [grown] = got
        assert grown is not None
        assert len(grown.log) == 1
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait, 1)
            await anyio.sleep(0.05)
            assert await broker.cancel_runs(["w"]) == [True]
        ended = got[-1]
        assert ended is not None
        assert ended.state is RunState.CANCELLED
        # Ended: at once, whatever it has seen.
        assert stored(await broker.wait_run("w", 5, TEST_DEADLINE)) == stored(ended)


async def test_a_turn_is_enqueued_past_max_queue_length(app_name: str, broker_url: str) -> None:
    async with connected(app_name, broker_url, max_queue_length=1) as broker:
        await broker.enqueue([JobMessage(id="filler", task="t", queue="q", payload=b"")])
        [(created, _)] = await broker.create_runs([spec("full")])
        assert created
        assert await waiting_turns(broker) == 2  # the filler and the run's first turn
        [turn] = await broker.get(["full:t1"], queue="q")
        assert turn is not None


async def test_wait_run_for_the_end_only_sleeps_through_a_growing_log(
    app_name: str, broker_url: str
) -> None:
    """``seen`` sys.maxsize (what RunHandle.result asks): appends that grow the log do not
    end the wait; the run's end does."""
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("e")])
        got: list[RunRecord | None] = []

        async def wait() -> None:
            got.append(await broker.wait_run("e", sys.maxsize, TEST_DEADLINE))

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.sleep(0.05)
            await broker.append_runs([RunAppend(run_id="e", expected=0, entries=(ENTRY,))])
            await anyio.sleep(0.1)
            assert got == []
            await broker.append_runs([RunAppend(run_id="e", expected=1, entries=(ENTRY,))])
            await anyio.sleep(0.1)
            assert got == []
            assert await broker.cancel_runs(["e"]) == [True]
        [ended] = got
        assert ended is not None
        assert ended.state is RunState.CANCELLED
        assert len(ended.log) == 2


async def test_a_turn_that_fails_for_good_fails_its_run(app_name: str, broker_url: str) -> None:
    """No turn comes again after a turn job failed for good (its retries or its stalls
    spent: a turn that kills its worker each time): the run fails with the turn's record,
    instead of staying running with nothing to move it."""
    why = FailureRecord(
        reason=FailureReason.STALLED,
        error_type="Stalled",
        message="stalled 4 times",
        attempt=4,
        retryable=False,
    )
    async with connected(app_name, broker_url) as broker:
        await broker.create_runs([spec("tf"), spec("ok")])
        turns = await broker.claim(["q"], 2, worker_id="w", lease=30)
        assert sorted(t.message.id for t in turns) == ["ok:t1", "tf:t1"]
        turn = next(t for t in turns if t.message.id == "tf:t1")
        other = next(t for t in turns if t.message.id == "ok:t1")
        encoded = msgspec.msgpack.encode(why)
        await broker.fail([Failure(id=turn.message.id, token=turn.token, error=encoded)])
        # A turn that fails but is retried leaves its run alone.
        await broker.fail(
            [Failure(id=other.message.id, token=other.token, error=encoded, retry_delay=0)]
        )
        failed, running = await broker.get_runs(["tf", "ok"])
        assert failed is not None
        assert running is not None
        assert failed.state is RunState.FAILED
        assert failed.failure == why
        assert running.state is RunState.RUNNING
        # Ended: the failed run takes no more appends.
        [late] = await broker.append_runs([RunAppend(run_id="tf", expected=0)])
        assert late is AppendOutcome.FINISHED
