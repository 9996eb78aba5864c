"""Durable runs on the embedded broker: ``@app.durable``, RunHandle and the run's turns.

The broker's clock is a :class:`~typedq.testing.FakeClock`: a run that sleeps for a day
resumes when the test advances the clock, in milliseconds of real time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE
from typedq import App
from typedq.broker.base import Completion, JobMessage, JobState
from typedq.broker.memory import MemoryBroker
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
from typedq.durable import (
    Emitted,
    Run,
    RunTimeout,
    Signal,
    StepScheduled,
    decode_entries,
    encode_entries,
)
from typedq.errors import ConfigError, JobCancelled, JobFailed, ResultTimeout
from typedq.serde import codec_for
from typedq.stubgen import select_tasks
from typedq.testing import FakeClock, run_worker

pytestmark = pytest.mark.anyio

EPOCH = 1_700_000_000.0


class User(msgspec.Struct, frozen=True):
    name: str


class Account(msgspec.Struct, frozen=True):
    id: str


class Approval(msgspec.Struct, frozen=True):
    ok: bool


class Onboarded(msgspec.Struct, frozen=True):
    account: str
    approved: bool


approval = Signal("approval", Approval)


def onboarding_app(calls: Counter[str]) -> App:
    app = App("runs")

    @app.task
    async def create_account(user: User) -> Account:
        calls["create_account"] += 1
        return Account(id=f"acct-{user.name}")

    @app.durable
    async def onboard(run: Run, user: User) -> Onboarded:
        account = await run.step(create_account, user)
        await run.sleep(timedelta(days=1))
        try:
            ok = (await run.wait_for(approval, timeout=timedelta(days=7))).ok
        except RunTimeout:
            ok = False
        return Onboarded(account=account.id, approved=ok)

    return app


async def wait_state(app: App, run_id: str, predicate: Callable[[RunRecord], bool]) -> None:
    """Poll the run until ``predicate(record)`` holds."""
    with anyio.fail_after(TEST_DEADLINE):
        while True:
            [record] = await app.broker.get_runs([run_id])
            if record is not None and predicate(record):
                return
            await anyio.sleep(0.005)


def sleeping(record: RunRecord) -> bool:
    return record.wake_at is not None and record.wait_signal is None


async def test_a_run_steps_sleeps_waits_for_a_signal_and_completes() -> None:
    calls: Counter[str] = Counter()
    app = onboarding_app(calls)
    onboard = app.durables["onboard"]
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)) as harness:
            handle = await onboard.start(User(name="ada"), run_id="user-42")
            await wait_state(app, "user-42", sleeping)  # after the step, in the day's sleep
            await harness.advance(86_400)
            await wait_state(app, "user-42", lambda r: r.wait_signal == "approval")
            assert await handle.send(approval, Approval(ok=True)) is SignalOutcome.DELIVERED
            assert await handle.result(timeout=TEST_DEADLINE) == Onboarded("acct-ada", True)
            # Finished: a signal is refused, and cancel says it had already ended.
            assert await handle.send(approval, Approval(ok=False)) is SignalOutcome.FINISHED
            assert await handle.cancel() is False
    assert calls["create_account"] == 1


async def test_a_signal_sent_before_the_wait_is_kept() -> None:
    calls: Counter[str] = Counter()
    app = onboarding_app(calls)
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)) as harness:
            handle = await app.durables["onboard"].start(User(name="bo"), run_id="early")
            assert await handle.send(approval, Approval(ok=True)) is SignalOutcome.DELIVERED
            await wait_state(app, "early", sleeping)
            await harness.advance(86_400)
            assert await handle.result(timeout=TEST_DEADLINE) == Onboarded("acct-bo", True)


async def test_the_wait_times_out_on_the_broker_clock() -> None:
    calls: Counter[str] = Counter()
    app = onboarding_app(calls)
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)) as harness:
            handle = await app.durables["onboard"].start(User(name="cy"), run_id="late")
            await wait_state(app, "late", sleeping)
            await harness.advance(86_400)
            await wait_state(app, "late", lambda r: r.wait_signal == "approval")
            await harness.advance(8 * 86_400)
            assert await handle.result(timeout=TEST_DEADLINE) == Onboarded("acct-cy", False)


async def test_start_is_idempotent_by_run_id() -> None:
    calls: Counter[str] = Counter()
    app = onboarding_app(calls)
    onboard = app.durables["onboard"]
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            first = await onboard.start(User(name="ada"), run_id="same")
            second = await onboard.start(User(name="other"), run_id="same")
            assert first.run_id == second.run_id == "same"
            await wait_state(app, "same", sleeping)
            record = await second.record()
            assert onboard.input.decode(record.spec.input) == User(name="ada")
    assert calls["create_account"] == 1


async def test_a_failed_step_fails_the_run_and_cancel_ends_a_waiting_one() -> None:
    app = App("runs")

    @app.task
    async def boom(user: User) -> Account:
        raise ValueError("no account")

    @app.durable
    async def failing(run: Run, user: User) -> Account:
        return await run.step(boom, user)

    @app.durable(queue="slow")
    async def waiting(run: Run, user: User) -> None:
        await run.wait_for(approval)

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await failing.start(User(name="x"), run_id="fails")
            with pytest.raises(JobFailed, match="failed"):
                await handle.result(timeout=TEST_DEADLINE)
            record = await handle.record()
            assert record.failure is not None
            assert "no account" in record.failure.message

            held = await waiting.start(User(name="y"), run_id="held")
            await wait_state(app, "held", lambda r: r.wait_signal == "approval")
            assert await held.cancel() is True
            with pytest.raises(JobCancelled):
                await held.result(timeout=TEST_DEADLINE)
            other = await waiting.start(User(name="z"), run_id="held-2")
            with pytest.raises(ResultTimeout):
                await other.result(timeout=0.05)


async def test_a_worker_stopped_mid_run_resumes_without_rerunning_finished_steps() -> None:
    calls: Counter[str] = Counter()
    gate = anyio.Event()
    started = anyio.Event()
    app = App("runs", lease=1.0)

    @app.task
    async def first(user: User) -> Account:
        calls["first"] += 1
        return Account(id="one")

    @app.task
    async def second(acct: Account) -> Account:
        calls["second"] += 1
        started.set()
        await gate.wait()
        return Account(id=acct.id + "+two")

    @app.durable
    async def two_steps(run: Run, user: User) -> Account:
        one = await run.step(first, user)
        return await run.step(second, one)

    clock = FakeClock(EPOCH)
    broker = MemoryBroker(app.settings, clock=clock)
    with anyio.fail_after(TEST_DEADLINE), app.using_broker(broker):
        async with app:
            handle = await two_steps.start(User(name="k"), run_id="crashy")
            # The first worker runs the first step, starts the second, and is stopped
            # (cancelled) while the second is running.
            with anyio.CancelScope() as scope:
                async with app.worker(concurrency=4, grace=0):
                    await started.wait()
                    scope.cancel()
            gate.set()
            # A new worker: the second step's job comes back (handed back or stalled)
            # and the run resumes from its log.
            async with app.worker(concurrency=4, grace=0):
                clock.advance(60)
                await broker.recover_stalled()
                broker.wake()
                assert await handle.result(timeout=TEST_DEADLINE) == Account(id="one+two")
    assert calls["first"] == 1
    assert calls["second"] == 2  # the interrupted attempt, and the one that finished


# -- the embedded broker's run store, directly ---------------------------------------------


def spec(run_id: str) -> RunSpec:
    return RunSpec(
        id=run_id, name="f", queue="q", turn_task="typedq.run.f", turn_payload=b"\x90", input=b""
    )


async def test_the_store_fences_appends_and_keeps_signals_in_order() -> None:
    broker = MemoryBroker(clock=FakeClock(EPOCH))
    await broker.connect()
    try:
        [(created, record)] = await broker.create_runs([spec("r1")])
        assert created
        assert record.state is RunState.RUNNING
        [(created, _)] = await broker.create_runs([spec("r1")])
        assert not created
        assert (await broker.counts("q"))[JobState.WAITING] == 1  # its first turn
        entry = encode_entries([StepScheduled(position=0, task="t", digest="0" * 16)])
        ok, stale = await broker.append_runs(
            [
                RunAppend(run_id="r1", expected=0, entries=(entry,)),
                RunAppend(run_id="r1", expected=0, entries=(entry,)),
            ]
        )
        assert (ok, stale) == (AppendOutcome.APPENDED, AppendOutcome.CONFLICT)
        [logged] = await broker.get_runs(["r1"])
        assert logged is not None
        assert [e.position for b in logged.log for e in decode_entries(b)] == [0]
        sent = await broker.signal_runs(
            [RunSignal(run_id="r1", signal="s", payload=p) for p in (b"1", b"2")]
        )
        assert sent == [SignalOutcome.DELIVERED] * 2
        [kept] = await broker.get_runs(["r1"])
        assert kept is not None
        assert kept.inbox == {"s": (b"1", b"2")}
        [taken] = await broker.append_runs(
            [RunAppend(run_id="r1", expected=1, take_signal="s", wait_signal="s")]
        )
        assert taken is AppendOutcome.APPENDED
        [left] = await broker.get_runs(["r1"])
        assert left is not None
        assert left.inbox == {"s": (b"2",)}
        assert await broker.cancel_runs(["r1", "r1", "nope"]) == [True, False, False]
        assert await broker.signal_runs([RunSignal(run_id="r1", signal="s", payload=b"")]) == [
            SignalOutcome.FINISHED
        ]
        assert await broker.get_runs(["nope"]) == [None]
        assert await broker.wake_runs([("r1", 0.0), ("nope", 0.0)]) == [False, False]
    finally:
        await broker.close()


async def test_the_store_keeps_a_waited_jobs_outcome_and_wakes_the_run() -> None:
    broker = MemoryBroker(clock=FakeClock(EPOCH))
    await broker.connect()
    try:
        await broker.create_runs([spec("r2")])
        step = JobMessage(id="r2:0", task="t", queue="steps", payload=b"", run_queue="q")
        await broker.enqueue([step])
        [appended] = await broker.append_runs(
            [RunAppend(run_id="r2", expected=0, wait_jobs=("r2:0",))]
        )
        assert appended is AppendOutcome.APPENDED
        [claimed] = await broker.claim(["steps"], 1, worker_id="w", lease=30)
        await broker.complete([Completion(claimed.message.id, claimed.token, b"out")])
        # The job's record may go (retention, an operator): the run keeps its outcome.
        assert await broker.remove(["r2:0"]) == [True]
        [record] = await broker.get_runs(["r2"])
        assert record is not None
        assert record.outcomes == {"r2:0": StepOutcome(state=JobState.COMPLETED, result=b"out")}
        # Its first turn still waits, unclaimed: the step's end adds no second one.
        assert (await broker.counts("q"))[JobState.WAITING] == 1
        [turn] = await broker.claim(["q"], 1, worker_id="w", lease=30)
        assert turn.message.id == "r2:t1"
        assert await broker.wake_runs([("r2", 0.0)]) == [True]  # claimed: a new turn is due
        assert (await broker.counts("q"))[JobState.WAITING] == 1
        # An append that records the outcome drops it from the run.
        [recorded] = await broker.append_runs(
            [RunAppend(run_id="r2", expected=0, recorded_jobs=("r2:0",))]
        )
        assert recorded is AppendOutcome.APPENDED
        [after] = await broker.get_runs(["r2"])
        assert after is not None
        assert after.outcomes == {}
    finally:
        await broker.close()


async def test_a_saga_catches_a_failed_step_and_compensates() -> None:
    app = App("runs")
    calls: Counter[str] = Counter()

    @app.task
    async def reserve(user: User) -> Account:
        calls["reserve"] += 1
        return Account(id="held")

    @app.task(retries=0)
    async def charge(acct: Account) -> Account:
        calls["charge"] += 1
        raise ValueError("card declined")

    @app.task
    async def release(acct: Account) -> Account:
        calls["release"] += 1
        return Account(id="released")

    @app.durable
    async def order(run: Run, user: User) -> Account:
        held, again = await run.gather(run.step(reserve, user), run.step(reserve, user))
        try:
            return await run.step(charge, held)
        except JobFailed:
            return await run.step(release, again)

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await order.start(User(name="s"), run_id="saga")
            assert await handle.result(timeout=TEST_DEADLINE) == Account(id="released")
    assert calls == Counter(reserve=2, charge=1, release=1)


class Progress(msgspec.Struct, frozen=True):
    done: int


async def test_events_are_the_runs_timeline_until_it_ends() -> None:
    app = App("runs")

    @app.task
    async def make(user: User) -> Account:
        return Account(id=user.name)

    @app.durable
    async def traced(run: Run, user: User) -> Account:
        account = await run.step(make, user)
        await run.emit(Progress(done=1))
        return account

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await traced.start(User(name="e"), run_id="timeline")
            seen = [entry async for entry in handle.events()]
    assert [type(e).__name__ for e in seen] == ["StepScheduled", "StepCompleted", "Emitted"]
    emitted = seen[-1]
    assert isinstance(emitted, Emitted)
    assert codec_for(Progress).decode(emitted.payload) == Progress(done=1)


def test_a_durables_turn_task_gets_no_producer_stub() -> None:
    calls: Counter[str] = Counter()
    app = onboarding_app(calls)
    assert "typedq.run.onboard" in app.tasks  # what workers run
    assert [t.name for t in select_tasks(app)] == ["create_account"]


async def test_a_step_of_another_apps_task_fails_the_run() -> None:
    app, other = App("runs"), App("other")

    @other.task
    async def elsewhere(user: User) -> Account:
        return Account(id="x")

    @app.durable
    async def strays(run: Run, user: User) -> Account:
        return await run.step(elsewhere, user)

    assert strays.turn_task.options.retries == 10
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await strays.start(User(name="s"))
            with pytest.raises(JobFailed, match="ConfigError"):
                await handle.result(timeout=TEST_DEADLINE)
            record = await handle.record()
            assert record.failure is not None
            assert "does not have" in record.failure.message


class Step(msgspec.Struct, frozen=True):
    name: str


async def test_emitted_yields_the_runs_events_decoded_with_their_models() -> None:
    app = App("runs")

    @app.task
    async def create_account(user: User) -> Account:
        return Account(id=f"acct-{user.name}")

    @app.durable
    async def chatty(run: Run, user: User) -> Account:
        await run.emit(Progress(done=0))
        account = await run.step(create_account, user)
        await run.emit(Step(name="created"))
        await run.emit(Progress(done=1))
        return account

    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await chatty.start(User(name="e"), run_id="typed-emits")
            progress = [p async for p in handle.emitted(Progress)]
            both = [e async for e in handle.emitted(Progress, Step)]
            with pytest.raises(ConfigError, match="emitted takes event models"):
                [e async for e in handle.emitted(User, int)]  # type: ignore[type-var]
            with pytest.raises(ConfigError, match="needs the event models"):
                [e async for e in handle.emitted()]  # type: ignore[call-overload]
    # A watcher that starts after the run ended still reads every event, in order.
    assert progress == [Progress(done=0), Progress(done=1)]
    assert both == [Progress(done=0), Step(name="created"), Progress(done=1)]


def test_an_event_recorded_under_main_matches_the_model_imported_by_path() -> None:
    from typedq.durable.log import same_event

    assert same_event(f"{__name__}.Progress", Progress)
    assert not same_event("elsewhere.Progress", Progress)
    assert same_event("__main__.Progress", Progress)  # a script emitted, a module watches
    assert not same_event("__main__.Other", Progress)


async def test_a_sleep_ends_after_advancing_exactly_its_length_from_a_fractional_start() -> None:
    app = App("runs")

    @app.durable
    async def nap(run: Run, user: User) -> Account:
        await run.sleep(timedelta(days=1))
        return Account(id=user.name)

    # 0.7116294 s past a whole second: the broker's µs clock rounds it up by 0.4 µs.
    start = 1796534898.7116294
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(start)) as harness:
            handle = await nap.start(User(name="n"), run_id="nap")
            await wait_state(app, "nap", sleeping)
            await harness.advance(86_400)
            assert await handle.result(timeout=1) == Account(id="n")


def test_known_signals_name_each_signal_once_and_leave_out_ambiguous_names() -> None:
    from typedq.durable.types import known_signals

    once = Signal("known-once", Approval)
    twice = Signal("known-twice", Approval)
    again = Signal("known-twice", Approval)  # the same name and model: one entry
    clash_a = Signal("known-clash", Approval)
    clash_b = Signal("known-clash", User)  # another model: a tool cannot tell which
    known = known_signals()
    assert known["known-once"] is once
    assert known["known-twice"].model is Approval
    assert "known-clash" not in known
    del once, twice, again, clash_a, clash_b


async def test_a_turn_that_fails_for_good_fails_its_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its turn job's last attempt failing (a broker error, a bug in the host) ends the
    run as failed with why, instead of leaving it running with no turn to come."""
    app = App("runs")

    @app.durable(retries=1)
    async def doomed(run: Run, user: User) -> Account:
        return Account(id=user.name)

    turns: list[str] = []

    async def broken_turn(run_id: str) -> None:
        turns.append(run_id)
        raise RuntimeError("the turn broke")

    monkeypatch.setattr(doomed, "turn", broken_turn)
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)) as harness:
            handle = await doomed.start(User(name="d"), run_id="doomed")
            await harness.idle()
            await harness.advance(60)  # past the turn's retry backoff
            with pytest.raises(JobFailed) as failed:
                await handle.result(timeout=5)
    assert turns == ["doomed", "doomed"]  # the first attempt and its one retry
    assert failed.value.record.error_type == "RuntimeError"
    assert "turn failed 2 times" in failed.value.record.message
    assert "the turn broke" in failed.value.record.message


class Count(msgspec.Struct, frozen=True):
    n: int


def counting_app(calls: Counter[str]) -> App:
    app = App("chain")

    @app.task
    async def bump(c: Count) -> Count:
        calls["bump"] += 1
        return Count(n=c.n + 1)

    @app.durable
    async def chain(run: Run, c: Count) -> Count:
        for _ in range(5):
            c = await run.step(bump, c)
        a, b = await run.gather(run.step(bump, c), run.step(bump, Count(n=0)))
        return Count(n=a.n + b.n)

    return app


@pytest.mark.parametrize("paused", [True, False])
async def test_a_steps_worker_takes_the_runs_next_turn(paused: bool) -> None:
    """A step returning in the worker that keeps its run paused records its result and
    the run's next decision in one append fenced by its lease (DurableTask.after_step):
    the run's only turn job is its first, and each step ran once. With no paused runs
    (max_paused 0) every step's completion wakes a turn job, as before."""
    calls: Counter[str] = Counter()
    app = counting_app(calls)
    chain = app.durables["chain"]
    if not paused:
        chain.max_paused = 0
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)):
            handle = await chain.start(Count(n=0), run_id="c1")
            assert await handle.result(timeout=TEST_DEADLINE) == Count(n=7)
            record = await handle.record()
            turns = [
                job
                for job in await app.broker.get([f"c1:t{i}" for i in range(1, 10)])
                if job is not None
            ]
    assert calls["bump"] == 7
    assert record.outcomes == {}
    if paused:
        assert [job.message.id for job in turns] == ["c1:t1"]
    else:
        # The first, then one per step (the gather's two: one or two, as they end).
        assert len(turns) in (7, 8)
