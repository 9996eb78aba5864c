"""The durable runs' replay core (typedq.durable), driven by an in-memory host.

:class:`Host` plays the broker's part: it keeps the log as a list, appends each decision's
entries, runs scheduled steps by calling their tasks in process, advances a virtual clock
to sleeps and deadlines, and delivers signals from an inbox. It counts every step and
``do`` block executed, to show that replays do not run them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from datetime import timedelta
from typing import Any

import anyio
import msgspec
import pytest
from pydantic import BaseModel

from typedq import App
from typedq.durable import (
    Completed,
    Decision,
    DoRecorded,
    DurableFunction,
    Emitted,
    Failed,
    LogEntry,
    NonDeterministic,
    PatchMarked,
    Run,
    RunTimeout,
    ScheduleSteps,
    Signal,
    SignalReceived,
    SignalTimedOut,
    SleepStarted,
    SleepUntil,
    StepCompleted,
    StepFailed,
    StepScheduled,
    WaitForSignal,
    WaitStarted,
    decode_entries,
    encode_entries,
    replay,
)
from typedq.errors import (
    BrokerDataError,
    ConfigError,
    FailureReason,
    FailureRecord,
    InvalidOption,
    JobFailed,
)

pytestmark = pytest.mark.anyio

DAY = 86_400.0
START = 1_000_000.0


class NewUser(msgspec.Struct):
    name: str


class Account(msgspec.Struct):
    id: int
    name: str


class Mail(msgspec.Struct):
    to: str


class Sent(msgspec.Struct):
    ok: bool


class Bill(msgspec.Struct):
    account_id: int


class Invoice(BaseModel):
    total: int


class CardDeclined(msgspec.Struct):
    code: str


class Approval(msgspec.Struct):
    ok: bool
    by: str


class Progress(msgspec.Struct):
    done: int
    of: int


class Score(BaseModel):
    value: int


class Out(msgspec.Struct):
    """A durable function's result in the small tests (results are models, as tasks' are)."""

    value: Any


class Onboarded(msgspec.Struct):
    account_id: int
    approved: bool
    score: int
    mailed: bool
    total: int
    v2: bool


approval = Signal("approval", Approval)
app = App("durable-test")
#: How many times each step's task and each ``do`` block really ran.
ran: Counter[str] = Counter()


@app.task
async def create_account(user: NewUser) -> Account:
    ran["create_account"] += 1
    return Account(id=42, name=user.name)


@app.task
async def send_mail(mail: Mail) -> Sent:
    ran["send_mail"] += 1
    return Sent(ok=mail.to != "")


@app.task(errors=(CardDeclined,))
def bill(b: Bill) -> Invoice:
    ran["bill"] += 1
    return Invoice(total=b.account_id * 10)


def compute(account: Account) -> int:
    ran["score"] += 1
    return account.id + 1


async def onboard(run: Run, user: NewUser) -> Onboarded:
    account = await run.step(create_account, user)
    await run.sleep(timedelta(days=1))
    try:
        ok = await run.wait_for(approval, timeout=timedelta(days=7))
        approved = ok.ok
    except RunTimeout:
        approved = False
    score = await run.do("score", lambda: compute(account))
    sent, invoice = await run.gather(
        run.step(send_mail, Mail(to=user.name)), run.step(bill, Bill(account_id=account.id))
    )
    await run.emit(Progress(done=3, of=4))
    v2 = run.patched("v2-scoring")
    return Onboarded(
        account_id=account.id,
        approved=approved,
        score=score,
        mailed=sent.ok,
        total=invoice.total,
        v2=v2,
    )


@pytest.fixture(autouse=True)
def _reset_counts() -> None:
    ran.clear()


class Host:
    """A broker's part in memory: the log, a virtual clock, an inbox of signals."""

    def __init__(self, fn: DurableFunction[Any, Any], inp: Any, run_id: str = "user-42") -> None:
        self.fn = fn
        self.inp = inp
        self.run_id = run_id
        self.now = START
        self.log: list[LogEntry] = []
        self.inbox: dict[str, list[bytes]] = {}
        self.decisions: list[Decision[Any]] = []

    def send(self, signal: Signal[Any], payload: Any) -> None:
        self.inbox.setdefault(signal.name, []).append(signal.encode(payload))

    async def replay(self) -> Decision[Any]:
        return await replay(self.fn, self.inp, self.log, run_id=self.run_id, now=self.now)

    async def advance(self, *, time_out: bool = True) -> Decision[Any]:
        """One replay; its entries appended and its decision carried out (a wait with
        nothing to deliver moves the clock to its deadline only if ``time_out``)."""
        decision = await self.replay()
        # A crash before the append replays to the same decision (ignoring do re-runs).
        self.decisions.append(decision)
        self.log.extend(decision.append)
        if isinstance(decision, ScheduleSteps):
            for request in decision.schedule:
                task = app.tasks[request.task]
                result = await task(task.input.decode(request.payload))
                self.log.append(
                    StepCompleted(
                        position=request.position,
                        task=request.task,
                        output=task.output.encode(result),
                    )
                )
        elif isinstance(decision, SleepUntil):
            self.now = max(self.now, decision.until)
        elif isinstance(decision, WaitForSignal):
            waiting = self.inbox.get(decision.signal)
            if waiting:
                payload = waiting.pop(0)
                self.log.append(
                    SignalReceived(
                        position=decision.position, signal=decision.signal, payload=payload
                    )
                )
            elif decision.deadline is not None and time_out:
                self.now = max(self.now, decision.deadline)
        return decision

    async def drive(self, limit: int = 20) -> Decision[Any]:
        """Advance until the run ends or waits for a signal with nothing to deliver."""
        for _ in range(limit):
            decision = await self.advance()
            if isinstance(decision, Completed | Failed):
                return decision
            if (
                isinstance(decision, WaitForSignal)
                and decision.deadline is None
                and not any(
                    isinstance(e, SignalReceived) and e.position == decision.position
                    for e in self.log
                )
            ):
                return decision
        raise AssertionError(f"the run did not end in {limit} replays: {self.decisions}")


def kinds(decisions: list[Decision[Any]]) -> list[str]:
    return [type(d).__name__ for d in decisions]


# -- a whole run --------------------------------------------------------------------------


async def test_an_onboarding_run_completes_with_each_step_run_once() -> None:
    host = Host(onboard, NewUser(name="ada"))
    host.send(approval, Approval(ok=True, by="bob"))
    done = await host.drive()
    assert done == Completed(
        result=Onboarded(account_id=42, approved=True, score=43, mailed=True, total=420, v2=True),
        append=done.append,
    )
    assert kinds(host.decisions) == [
        "ScheduleSteps",
        "SleepUntil",
        "WaitForSignal",
        "ScheduleSteps",
        "Completed",
    ]
    assert ran == {"create_account": 1, "score": 1, "send_mail": 1, "bill": 1}
    # gather scheduled both steps at once, with stable job ids.
    both = host.decisions[3]
    assert isinstance(both, ScheduleSteps)
    assert [(r.task, r.key) for r in both.schedule] == [
        ("send_mail", "user-42:4"),
        ("bill", "user-42:5"),
    ]
    sleep = host.decisions[1]
    assert isinstance(sleep, SleepUntil)
    assert sleep.until == START + DAY
    wait = host.decisions[2]
    assert isinstance(wait, WaitForSignal)
    assert (wait.signal, wait.deadline) == ("approval", START + 8 * DAY)
    assert [type(e).__name__ for e in host.log] == [
        "StepScheduled",
        "StepCompleted",
        "SleepStarted",
        "WaitStarted",
        "SignalReceived",
        "DoRecorded",
        "StepScheduled",
        "StepScheduled",
        "StepCompleted",
        "StepCompleted",
        "Emitted",
        "PatchMarked",
    ]
    assert [e.position for e in host.log] == [0, 0, 1, 2, 2, 3, 4, 5, 4, 5, 6, 7]


async def test_the_run_suspends_on_a_signal_until_it_is_sent() -> None:
    host = Host(onboard, NewUser(name="ada"))
    waiting = await host.advance(time_out=False)
    while not isinstance(waiting, WaitForSignal):
        waiting = await host.advance(time_out=False)
    # Nothing to deliver, deadline not reached: the same decision, again and again.
    assert await host.replay() == dataclasses.replace(waiting, append=())
    host.send(approval, Approval(ok=False, by="eve"))
    host.send(approval, Approval(ok=True, by="later"))  # kept for a later wait, in order
    done = await host.drive()
    assert isinstance(done, Completed)
    assert done.result.approved is False
    assert host.inbox["approval"] == [approval.encode(Approval(ok=True, by="later"))]


async def test_wait_for_raises_run_timeout_at_its_deadline() -> None:
    host = Host(onboard, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert done.result.approved is False
    timed_out = [e for e in host.log if isinstance(e, SignalTimedOut)]
    assert timed_out == [SignalTimedOut(position=2, signal="approval")]
    assert host.now == START + 8 * DAY


async def test_an_uncaught_run_timeout_fails_the_run() -> None:
    async def strict(run: Run, user: NewUser) -> Approval:
        return await run.wait_for(approval, timeout=60)

    host = Host(strict, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Failed)
    assert isinstance(done.error, RunTimeout)
    assert (done.error.signal, done.error.deadline) == ("approval", START + 60)
    # Replays raise it again from the log, even at an earlier clock.
    host.now = START
    again = await host.replay()
    assert isinstance(again, Failed)
    assert isinstance(again.error, RunTimeout)


async def test_a_signal_recorded_before_the_timeout_wins_over_it() -> None:
    async def waits(run: Run, user: NewUser) -> Approval:
        return await run.wait_for(approval, timeout=60)

    log: list[LogEntry] = [
        WaitStarted(position=0, signal="approval", deadline=START + 60),
        SignalReceived(
            position=0, signal="approval", payload=approval.encode(Approval(ok=True, by="x"))
        ),
        SignalTimedOut(position=0, signal="approval"),
    ]
    done = await replay(waits, NewUser(name="a"), log, run_id="r", now=START + 999)
    assert done == Completed(result=Approval(ok=True, by="x"))


# -- crash and replay -----------------------------------------------------------------------


async def test_replaying_the_same_log_gives_the_same_decision_and_runs_nothing() -> None:
    host = Host(onboard, NewUser(name="ada"))
    host.send(approval, Approval(ok=True, by="bob"))
    for _ in range(10):
        before = list(host.log)
        counts = Counter(ran)
        # A worker crashed before appending: the next one replays the same log.
        first = await host.replay()
        second = await host.replay()
        assert first == second or isinstance(first, Failed)
        assert host.log == before
        do_reruns = Counter(ran) - counts
        # Only a do block met for the first time runs (at-least-once); steps never do.
        assert set(do_reruns) <= {"score"}
        decision = await host.advance()
        if isinstance(decision, Completed):
            break
    else:
        raise AssertionError("the run did not complete")
    assert ran["create_account"] == ran["send_mail"] == ran["bill"] == 1
    # The finished log replays to the same result without running anything or recording more.
    counts = Counter(ran)
    final = await host.replay()
    assert final == dataclasses.replace(decision, append=())
    assert ran == counts


async def test_a_step_scheduled_but_unfinished_is_pending_not_rescheduled() -> None:
    host = Host(onboard, NewUser(name="ada"))
    host.send(approval, Approval(ok=True, by="bob"))
    while True:
        decision = await host.replay()
        if isinstance(decision, ScheduleSteps) and len(decision.schedule) == 2:
            break
        await host.advance()
    host.log.extend(decision.append)
    mail, bill_req = decision.schedule
    # bill finished first; send_mail still runs.
    host.log.append(
        StepCompleted(
            position=bill_req.position, task="bill", output=bill.output.encode(Invoice(total=1))
        )
    )
    again = await host.replay()
    assert again == ScheduleSteps(schedule=(), pending=(mail.position,))


# -- determinism ----------------------------------------------------------------------------


async def _log_until_sleep() -> list[LogEntry]:
    host = Host(onboard, NewUser(name="ada"))
    await host.advance()
    await host.advance()
    return host.log


async def test_a_different_step_at_a_recorded_position_is_non_deterministic() -> None:
    log = await _log_until_sleep()

    async def changed(run: Run, user: NewUser) -> None:
        await run.step(send_mail, Mail(to=user.name))

    with pytest.raises(NonDeterministic) as caught:
        await replay(changed, NewUser(name="ada"), log, run_id="user-42", now=START)
    message = str(caught.value)
    assert "call #0" in message
    assert "step 'send_mail'" in message
    assert "the log records step 'create_account'" in message
    assert "\n" not in message


async def test_a_step_with_another_input_is_non_deterministic() -> None:
    log = await _log_until_sleep()
    with pytest.raises(NonDeterministic, match=r"step 'create_account'.*the log records step"):
        await replay(onboard, NewUser(name="grace"), log, run_id="user-42", now=START)


async def test_another_kind_of_call_is_non_deterministic() -> None:
    log = await _log_until_sleep()

    async def changed(run: Run, user: NewUser) -> None:
        await run.step(create_account, user)
        await run.wait_for(approval)

    with pytest.raises(NonDeterministic, match="wait_for 'approval' but the log records sleep"):
        await replay(changed, NewUser(name="ada"), log, run_id="user-42", now=START)


async def test_returning_before_the_recorded_calls_is_non_deterministic() -> None:
    log = await _log_until_sleep()

    async def shorter(run: Run, user: NewUser) -> None:
        await run.step(create_account, user)

    with pytest.raises(NonDeterministic, match="call #1: the code asks for to return"):
        await replay(shorter, NewUser(name="ada"), log, run_id="user-42", now=START)


async def test_catching_the_divergence_in_the_function_does_not_hide_it() -> None:
    log = await _log_until_sleep()

    async def sly(run: Run, user: NewUser) -> None:
        with contextlib.suppress(NonDeterministic):
            await run.step(send_mail, Mail(to="x"))
        await run.sleep(1)  # stops again: the run has diverged

    with pytest.raises(NonDeterministic):
        await replay(sly, NewUser(name="ada"), log, run_id="user-42", now=START)


async def test_catching_the_suspension_does_not_let_the_function_run_on() -> None:
    async def sly(run: Run, user: NewUser) -> Account:
        try:
            return await run.step(create_account, user)
        except BaseException:
            return Account(id=0, name="made up")

    decision = await replay(sly, NewUser(name="ada"), [], run_id="r", now=START)
    assert isinstance(decision, ScheduleSteps)
    assert [r.task for r in decision.schedule] == ["create_account"]


async def test_other_base_exceptions_propagate() -> None:
    class Stop(BaseException):
        pass

    async def stops(run: Run, user: NewUser) -> None:
        raise Stop

    with pytest.raises(Stop):
        await replay(stops, NewUser(name="ada"), [], run_id="r", now=START)


# -- patching -------------------------------------------------------------------------------


async def patched_onboard(run: Run, user: NewUser) -> Out:
    account = await run.step(create_account, user)
    if run.patched("send-welcome"):
        await run.step(send_mail, Mail(to=account.name))
        path = "new"
    else:
        path = "old"
    await run.sleep(1)
    return Out(path)


async def test_patched_is_true_for_a_fresh_run_and_on_its_replays() -> None:
    host = Host(patched_onboard, NewUser(name="ada"))
    done = await host.drive()
    assert done == Completed(result=Out("new"), append=done.append)
    assert PatchMarked(position=1, patch="send-welcome") in host.log
    assert await host.replay() == Completed(result=Out("new"))


async def test_patched_is_false_for_a_run_whose_log_predates_it() -> None:
    # Recorded by the code before the patch: step, then sleep at position 1.
    log = await _log_until_sleep()
    counts = Counter(ran)
    decision = await replay(patched_onboard, NewUser(name="ada"), log, run_id="user-42", now=START)
    assert isinstance(decision, SleepUntil)
    assert decision.append == ()
    done = await replay(
        patched_onboard, NewUser(name="ada"), log, run_id="user-42", now=START + DAY
    )
    assert done == Completed(result=Out("old"))
    assert ran == counts


# -- steps ----------------------------------------------------------------------------------


def _failure(**fields: Any) -> FailureRecord:
    return FailureRecord(
        reason=fields.pop("reason", FailureReason.DOMAIN_ERROR),
        error_type="Reject",
        message="declined",
        attempt=3,
        retryable=False,
        **fields,
    )


async def test_a_failed_step_raises_its_typed_error_inside_the_run() -> None:
    async def saga(run: Run, user: NewUser) -> Out:
        account = await run.step(create_account, user)
        try:
            await run.step(bill, Bill(account_id=account.id))
        except JobFailed as exc:
            declined = exc.domain_error(CardDeclined)
            assert declined is not None
            await run.step(send_mail, Mail(to=f"refund {declined.code}"))
            return Out(f"compensated {exc.job_id}")
        return Out("billed")

    log: list[LogEntry] = [
        StepCompleted(position=0, task="create_account", output=b""),
    ]
    log[0] = StepCompleted(
        position=0,
        task="create_account",
        output=create_account.output.encode(Account(id=1, name="a")),
    )
    record = _failure(
        domain_type=f"{CardDeclined.__module__}.{CardDeclined.__qualname__}",
        domain_payload=msgspec.msgpack.encode(CardDeclined(code="insufficient")),
    )
    log.append(StepFailed(position=1, task="bill", failure=record))
    decision = await replay(saga, NewUser(name="a"), log, run_id="r", now=START)
    assert isinstance(decision, ScheduleSteps)
    assert decision.schedule[0].task == "send_mail"
    assert send_mail.input.decode(decision.schedule[0].payload) == Mail(to="refund insufficient")
    log.extend(decision.append)
    log.append(
        StepCompleted(position=2, task="send_mail", output=send_mail.output.encode(Sent(ok=True)))
    )
    assert await replay(saga, NewUser(name="a"), log, run_id="r", now=START) == Completed(
        result=Out("compensated r:1")
    )


async def test_gather_raises_the_first_failure_in_argument_order_once_all_finished() -> None:
    async def both(run: Run, user: NewUser) -> Any:
        return await run.gather(
            run.step(send_mail, Mail(to="a")), run.step(bill, Bill(account_id=1))
        )

    log: list[LogEntry] = [
        StepFailed(position=1, task="bill", failure=_failure(reason=FailureReason.ERROR)),
    ]
    # send_mail was never scheduled: it is, and bill's failure waits for it.
    decision = await replay(both, NewUser(name="a"), log, run_id="r", now=START)
    assert isinstance(decision, ScheduleSteps)
    assert [r.task for r in decision.schedule] == ["send_mail"]
    log.append(
        StepFailed(position=0, task="send_mail", failure=_failure(reason=FailureReason.ERROR))
    )
    failed = await replay(both, NewUser(name="a"), log, run_id="r", now=START)
    assert isinstance(failed, Failed)
    assert isinstance(failed.error, JobFailed)
    assert failed.error.task == "send_mail"


async def test_a_step_input_is_validated_when_asked_for() -> None:
    async def bad(run: Run, user: NewUser) -> Any:
        return await run.step(create_account, Mail(to="x"))  # type: ignore[misc]

    decision = await replay(bad, NewUser(name="a"), [], run_id="r", now=START)
    assert isinstance(decision, Failed)


# -- do -------------------------------------------------------------------------------------


async def test_do_records_typed_values_and_replays_them() -> None:
    @dataclasses.dataclass
    class Pair:
        a: int
        b: str

    async def fetch() -> Score:
        ran["fetch"] += 1
        return Score(value=7)

    async def inline(run: Run, user: NewUser) -> Out:
        score = await run.do("fetch", fetch, type=Score)
        pair = await run.do("pair", lambda: Pair(1, "x"), type=Pair)
        tup = await run.do("tuple", lambda: (1, "x"), type=tuple[int, str])
        plain = await run.do("plain", lambda: [1, 2])
        await run.sleep(1)
        return Out((score, pair, tup, plain))

    host = Host(inline, NewUser(name="a"))
    first = await host.advance()
    assert isinstance(first, SleepUntil)
    assert [type(e) for e in first.append] == [DoRecorded] * 4 + [SleepStarted]
    done = await host.drive()
    assert done == Completed(result=Out((Score(value=7), Pair(1, "x"), (1, "x"), [1, 2])))
    assert ran["fetch"] == 1


async def test_do_refuses_a_value_it_could_not_give_back_as_such() -> None:
    async def untyped(run: Run, user: NewUser) -> Any:
        return await run.do("account", lambda: Account(id=1, name="a"))

    decision = await replay(untyped, NewUser(name="a"), [], run_id="r", now=START)
    assert isinstance(decision, Failed)
    assert isinstance(decision.error, ConfigError)
    assert "pass type=" in str(decision.error)


async def test_a_do_with_another_name_is_non_deterministic() -> None:
    log: list[LogEntry] = [DoRecorded(position=0, name="a", value=msgspec.msgpack.encode(1))]

    async def renamed(run: Run, user: NewUser) -> Out:
        return Out(await run.do("b", lambda: 1))

    with pytest.raises(NonDeterministic, match="do 'b' but the log records do 'a'"):
        await replay(renamed, NewUser(name="a"), log, run_id="r", now=START)


# -- emit, options, the log -----------------------------------------------------------------


async def test_emit_is_recorded_once_and_checked_on_replay() -> None:
    async def emits(run: Run, user: NewUser) -> None:
        await run.emit(Progress(done=1, of=2))
        await run.sleep(1)

    first = await replay(emits, NewUser(name="a"), [], run_id="r", now=START)
    (emitted, _) = first.append
    assert isinstance(emitted, Emitted)
    assert msgspec.msgpack.decode(emitted.payload, type=Progress) == Progress(done=1, of=2)
    assert emitted.event.endswith(".Progress")
    again = await replay(emits, NewUser(name="a"), list(first.append), run_id="r", now=START)
    assert again.append == ()

    async def other(run: Run, user: NewUser) -> None:
        await run.emit(Approval(ok=True, by="x"))

    with pytest.raises(NonDeterministic, match=r"emit .*Approval but the log records emit"):
        await replay(other, NewUser(name="a"), list(first.append), run_id="r", now=START)


async def test_bad_durations_are_refused() -> None:
    async def negative(run: Run, user: NewUser) -> None:
        await run.sleep(-1)

    decision = await replay(negative, NewUser(name="a"), [], run_id="r", now=START)
    assert isinstance(decision, Failed)
    assert isinstance(decision.error, InvalidOption)


def test_the_log_round_trips_as_msgpack() -> None:
    entries: list[LogEntry] = [
        StepScheduled(position=0, task="t", digest="0123456789abcdef"),
        StepCompleted(position=0, task="t", output=b"\x80"),
        StepFailed(position=1, task="t", failure=_failure()),
        DoRecorded(position=2, name="d", value=b"\x01"),
        SleepStarted(position=3, until=START),
        WaitStarted(position=4, signal="s", deadline=None),
        SignalReceived(position=4, signal="s", payload=b"\x80"),
        SignalTimedOut(position=5, signal="s"),
        Emitted(position=6, event="m.E", payload=b"\x80"),
        PatchMarked(position=7, patch="p"),
    ]
    assert decode_entries(encode_entries(entries)) == entries
    with pytest.raises(BrokerDataError):
        decode_entries(b"\x91\x01")


def test_a_signal_checks_its_name_and_payload() -> None:
    with pytest.raises(ConfigError):
        Signal("no spaces", Approval)
    assert approval.decode(approval.encode(Approval(ok=True, by="x"))) == Approval(ok=True, by="x")
    assert repr(approval) == f"Signal('approval', {__name__}.Approval)"


async def test_a_suspension_inside_a_task_group_still_suspends_the_run() -> None:
    async def grouped(run: Run, user: NewUser) -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(run.sleep, 5)
            group.start_soon(run.sleep, 9)

    decision = await replay(grouped, NewUser(name="a"), [], run_id="r", now=START)
    # The first sleep stops the run; the other child's call only unwinds (gather is how
    # several steps run at once).
    assert isinstance(decision, SleepUntil)
    assert len(decision.append) == 1


async def test_a_do_block_that_raises_records_nothing() -> None:
    async def flaky(run: Run, user: NewUser) -> Out:
        def boom() -> int:
            ran["boom"] += 1
            raise RuntimeError("the service is down")

        return Out(await run.do("call", boom))

    host = Host(flaky, NewUser(name="a"))
    for attempt in (1, 2):
        decision = await host.advance()
        assert isinstance(decision, Failed)
        assert decision.append == ()
        assert ran["boom"] == attempt
