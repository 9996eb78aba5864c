"""Resumable replay (typedq.durable.resume): a run paused at its last turn goes on from its
pause, deciding what a replay from the top would; and the worker's kept runs
(DurableTask's paused runs), dropped on any mismatch with the log they expect.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE
from tests.unit.test_durable_replay import (
    Approval as ReplayApproval,
)
from tests.unit.test_durable_replay import (
    Host,
    NewUser,
    approval,
    create_account,
    onboard,
    ran,
)
from typedq import App, Run
from typedq.broker.memory import MemoryBroker
from typedq.broker.runs import RunRecord, RunSpec, RunState
from typedq.durable import Completed, Decision, DurableFunction, Failed, RunLog, replay
from typedq.durable.resume import Resumable, _Paused
from typedq.testing import FakeClock

pytestmark = pytest.mark.anyio

EPOCH = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _reset_counts() -> None:
    ran.clear()


def same(a: Decision[Any], b: Decision[Any]) -> bool:
    """Equal decisions (a failure's error compared by type and message)."""
    if isinstance(a, Failed) and isinstance(b, Failed):
        return (type(a.error), str(a.error), a.append) == (type(b.error), str(b.error), b.append)
    return a == b


class ResumingHost(Host):
    """The replay tests' host, turning the run with one Resumable; every decision is
    checked against a replay from the top on the same log."""

    def __init__(self, fn: DurableFunction[Any, Any], inp: Any) -> None:
        super().__init__(fn, inp)
        self.resumable: Resumable[Any, Any] = Resumable(fn, inp, self.run_id)
        self.paused: list[bool] = []

    async def replay(self) -> Decision[Any]:
        expected = await replay(self.fn, self.inp, self.log, run_id=self.run_id, now=self.now)
        if self.paused and not self.paused[-1]:
            self.resumable = Resumable(self.fn, self.inp, self.run_id)  # as the host does
        got = await self.resumable.advance(RunLog(self.log), self.now)
        self.paused.append(self.resumable.paused)
        assert same(got, expected), (got, expected)
        return got


async def test_a_resumed_run_decides_as_a_replay_from_the_top_at_every_turn() -> None:
    tops = Counter[str]()

    async def counted(run: Run, user: NewUser) -> Any:
        tops["top"] += 1
        return await onboard(run, user)

    host = ResumingHost(counted, NewUser(name="ada"))
    host.send(approval, ReplayApproval(ok=True, by="bob"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert done.result.approved
    assert done.result.v2
    # One coroutine went through the whole run: paused at every suspension, then ended;
    # the replays from the top (the check) account for the other tops.
    assert host.paused == [True] * (len(host.paused) - 1) + [False]
    assert tops["top"] == len(host.paused) + 1
    # The host ran each step once; the do block ran twice, the first time it was reached
    # (once by the checking replay, once by the resumed run), never on a later turn.
    assert ran == {"create_account": 1, "score": 2, "send_mail": 1, "bill": 1}


async def test_a_wait_that_times_out_goes_on_from_its_pause() -> None:
    host = ResumingHost(onboard, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert done.result.approved is False
    assert all(host.paused[:-1])


async def test_a_function_that_keeps_a_with_block_open_across_a_call_is_not_kept() -> None:
    async def scoped(run: Run, user: NewUser) -> Any:
        with anyio.CancelScope():
            account = await run.step(create_account, user)
        return account

    host = ResumingHost(scoped, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert host.paused == [False, False]  # unwound at the call, as a replay does


class Held:
    """A sync and async context manager doing nothing; ``step`` set: its ``__aenter__``
    (or ``__aexit__``) makes that call of the run."""

    def __init__(self, step: Any = None, on: str = "") -> None:
        self.step, self.on = step, on

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> Held:
        if self.on == "enter":
            await self.step()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.on == "exit":
            await self.step()


def lookup_fails() -> None:
    raise LookupError


async def in_sync_with(run: Run, user: NewUser) -> Any:
    with Held():
        return await run.step(create_account, user)


async def in_async_with(run: Run, user: NewUser) -> Any:
    async with Held():
        return await run.step(create_account, user)


async def in_try_in_with(run: Run, user: NewUser) -> Any:
    with Held():
        try:
            return await run.step(create_account, user)
        finally:
            pass


async def in_with_in_except_in_async_with(run: Run, user: NewUser) -> Any:
    async with Held():
        try:
            lookup_fails()
        except LookupError:
            with Held():
                return await run.step(create_account, user)


async def in_try_except_in_nested_withs(run: Run, user: NewUser) -> Any:
    async with Held():
        with anyio.CancelScope():
            try:
                return await run.step(create_account, user)
            except LookupError:
                return None


async def in_async_with_enter(run: Run, user: NewUser) -> Any:
    async with Held(lambda: run.step(create_account, user), on="enter"):
        return "entered"


async def in_async_with_exit(run: Run, user: NewUser) -> Any:
    async with Held(lambda: run.step(create_account, user), on="exit"):
        pass
    return "exited"


async def in_awaited_with(run: Run, user: NewUser) -> Any:
    async def below() -> Any:
        with Held():
            return await run.step(create_account, user)

    return await below()


@pytest.mark.parametrize(
    "fn",
    [
        in_sync_with,
        in_async_with,
        in_try_in_with,
        in_with_in_except_in_async_with,
        in_try_except_in_nested_withs,
        in_async_with_enter,
        in_async_with_exit,
        in_awaited_with,
    ],
)
async def test_a_call_inside_any_with_block_is_not_kept(fn: DurableFunction[Any, Any]) -> None:
    host = ResumingHost(fn, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert host.paused == [False, False]  # unwound at the call, as a replay does


async def after_a_with(run: Run, user: NewUser) -> Any:
    async with Held():
        pass
    with Held():
        pass
    return await run.step(create_account, user)


async def in_try_finally(run: Run, user: NewUser) -> Any:
    try:
        return await run.step(create_account, user)
    finally:
        pass


async def in_try_except(run: Run, user: NewUser) -> Any:
    try:
        return await run.step(create_account, user)
    except LookupError:
        return None


async def in_except_after_a_with(run: Run, user: NewUser) -> Any:
    with Held():
        pass
    try:
        lookup_fails()
    except LookupError:
        return await run.step(create_account, user)


@pytest.mark.parametrize(
    "fn", [after_a_with, in_try_finally, in_try_except, in_except_after_a_with]
)
async def test_a_call_outside_with_blocks_is_kept(fn: DurableFunction[Any, Any]) -> None:
    host = ResumingHost(fn, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert host.paused == [True, False]


async def test_a_call_from_a_task_the_function_started_unwinds_as_in_a_replay() -> None:
    async def grouped(run: Run, user: NewUser) -> Any:
        got: list[Any] = []

        async def one() -> None:
            got.append(await run.step(create_account, user))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
        return got[0]

    host = ResumingHost(grouped, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert host.paused == [False, False]


async def test_a_call_inside_a_do_block_unwinds_as_in_a_replay() -> None:
    async def nested(run: Run, user: NewUser) -> Any:
        async def inner() -> str:
            return (await run.step(create_account, user)).name

        return await run.do("inner", inner)

    host = ResumingHost(nested, NewUser(name="ada"))
    done = await host.drive()
    assert isinstance(done, Completed)
    assert done.result == "ada"
    assert host.paused == [False, False]


async def test_closing_a_paused_run_runs_its_finally_blocks_once() -> None:
    closed = Counter[str]()

    async def guarded(run: Run, user: NewUser) -> Any:
        try:
            return await run.step(create_account, user)
        finally:
            closed["finally"] += 1

    resumable = Resumable(guarded, NewUser(name="ada"), "r")
    await resumable.advance(RunLog(), 0.0)
    assert resumable.paused
    assert closed["finally"] == 0
    resumable.close()
    resumable.close()
    assert closed["finally"] == 1
    assert not resumable.paused


# -- the worker's kept runs --------------------------------------------------------------


class Item(msgspec.Struct, frozen=True):
    n: int


def pipeline_app(label: str, tops: Counter[str], ran_steps: Counter[str], gates: Any) -> App:
    """Three steps on the queue ``steps``, turns on ``turns``; step ``k`` waits for
    ``gates[k]`` if set (an Event) and marks ``gates['started', k]``."""
    app = App("resume", lease=1.0)

    @app.task(queue="steps")
    async def bump(item: Item) -> Item:
        ran_steps[f"step:{item.n}"] += 1
        started = gates.get(("started", item.n))
        if started is not None:
            started.set()
            await gates[item.n].wait()
        return Item(item.n + 1)

    @app.durable(queue="turns")
    async def pipeline(run: Run, item: Item) -> Item:
        tops[label] += 1
        try:
            for _ in range(3):
                item = await run.step(bump, item)
            return item
        finally:
            tops[f"{label}:closed"] += 1

    return app


async def test_a_run_kept_by_one_worker_and_turned_by_another_replays_from_the_top() -> None:
    """Worker A runs the run to its step 1 and stops; worker B (another process: its own
    kept runs) takes the next turns to step 2 and stops; A again: the run it keeps no
    longer matches the log, so it replays from the top. Each step is recorded once."""
    tops, ran_steps = Counter[str](), Counter[str]()
    gates: dict[Any, anyio.Event] = {}
    for k in (1, 2):
        gates[k], gates["started", k] = anyio.Event(), anyio.Event()
    app_a = pipeline_app("a", tops, ran_steps, gates)
    app_b = pipeline_app("b", tops, ran_steps, gates)
    clock = FakeClock(EPOCH)
    broker = MemoryBroker(app_a.settings, clock=clock)

    async def work_until(app: App, started: anyio.Event) -> None:
        with anyio.CancelScope() as scope:
            async with app.worker(concurrency=4, grace=0):
                clock.advance(60)  # the step a stopped worker left comes back
                await broker.recover_stalled()
                broker.wake()
                await started.wait()
                scope.cancel()

    with anyio.fail_after(TEST_DEADLINE), app_a.using_broker(broker):
        async with app_a:
            handle = await app_a.durables["pipeline"].start(Item(0), run_id="moved")
            await work_until(app_a, gates["started", 1])  # A: turn, step 0, turn, step 1
            assert "moved" in app_a.durables["pipeline"]._paused
            gates["started", 1] = anyio.Event()
            gates[1].set()
            with app_b.using_broker(broker):
                async with app_b:
                    await work_until(app_b, gates["started", 2])  # B: step 1 again, turn
                    assert "moved" in app_b.durables["pipeline"]._paused
                    assert tops["b:closed"] == 0
            assert tops["b:closed"] == 1  # B's paused run, closed as its app closed
            gates[2].set()
            del gates["started", 2]
            async with app_a.worker(concurrency=4, grace=0):
                clock.advance(60)
                await broker.recover_stalled()
                broker.wake()
                assert await handle.result(timeout=TEST_DEADLINE) == Item(3)
            [record] = await broker.get_runs(["moved"])
    assert record is not None
    assert record.state is RunState.COMPLETED
    # A replayed from the top twice (its first turn, and after B's appends); B once.
    assert tops["a"] == 2
    assert tops["b"] == 1
    assert tops["a:closed"] == 2  # the stale coroutine closed, the second one returned
    assert not app_a.durables["pipeline"]._paused
    done = [e.position for e in _entries(record) if type(e).__name__ == "StepCompleted"]
    assert done == [0, 1, 2]  # each outcome recorded once
    assert ran_steps == {"step:0": 1, "step:1": 2, "step:2": 2}  # the stopped ones twice


def _entries(record: RunRecord) -> list[Any]:
    from typedq.durable import decode_entries

    return [e for blob in record.log for e in decode_entries(blob)]


def _record(log: tuple[bytes, ...], *, created_at: float = 1.0, inp: bytes = b"i") -> RunRecord:
    spec = RunSpec(id="r", name="f", queue="q", turn_task="t", turn_payload=b"", input=inp)
    return RunRecord(spec=spec, state=RunState.RUNNING, log=log, inbox={}, created_at=created_at)


def test_a_kept_run_expects_exactly_the_log_its_last_turn_left() -> None:
    resumable: Resumable[Any, Any] = Resumable(onboard, NewUser(name="x"), "r")
    kept = _Paused(resumable=resumable, created_at=1.0, input=b"i", blobs=(b"a", b"b"), entries=[])
    assert kept.expects(_record((b"a", b"b")))
    assert not kept.expects(_record((b"a", b"c")))  # as long, another entry
    assert not kept.expects(_record((b"a", b"b", b"c")))  # appended to since
    assert not kept.expects(_record((b"a", b"b"), created_at=2.0))  # another run, same id
    assert not kept.expects(_record((b"a", b"b"), inp=b"j"))


async def test_kept_runs_are_bounded_and_an_evicted_one_replays_from_the_top() -> None:
    tops, ran_steps = Counter[str](), Counter[str]()
    app = pipeline_app("a", tops, ran_steps, {})
    durable = app.durables["pipeline"]
    durable.max_paused = 1
    clock = FakeClock(EPOCH)
    broker = MemoryBroker(app.settings, clock=clock)
    with anyio.fail_after(TEST_DEADLINE), app.using_broker(broker):
        async with app, app.worker(concurrency=4, grace=0):
            handles = [await durable.start(Item(10 * i), run_id=f"r{i}") for i in range(4)]
            results = [await h.result(timeout=TEST_DEADLINE) for h in handles]
    assert results == [Item(3), Item(13), Item(23), Item(33)]
    assert len(durable._paused) == 0
    assert tops["a:closed"] == tops["a"]  # every coroutine ended or was closed
    assert ran_steps == {f"step:{10 * i + k}": 1 for i in range(4) for k in range(3)}


async def test_a_run_cancelled_while_kept_is_closed_at_its_next_turn() -> None:
    tops, ran_steps = Counter[str](), Counter[str]()
    gates: dict[Any, anyio.Event] = {1: anyio.Event(), ("started", 1): anyio.Event()}
    app = pipeline_app("a", tops, ran_steps, gates)
    durable = app.durables["pipeline"]
    clock = FakeClock(EPOCH)
    broker = MemoryBroker(app.settings, clock=clock)
    with anyio.fail_after(TEST_DEADLINE), app.using_broker(broker):
        async with app, app.worker(concurrency=4, grace=0):
            handle = await durable.start(Item(0), run_id="c")
            await gates["started", 1].wait()
            assert "c" in durable._paused
            assert tops["a:closed"] == 0
            assert await handle.cancel() is True
            gates[1].set()
            await durable.turn("c")  # as the turn the step's end would start
    assert "c" not in durable._paused
    assert tops == {"a": 1, "a:closed": 1}


async def test_with_max_paused_0_every_turn_replays_from_the_top() -> None:
    tops, ran_steps = Counter[str](), Counter[str]()
    app = pipeline_app("a", tops, ran_steps, {})
    durable = app.durables["pipeline"]
    durable.max_paused = 0
    broker = MemoryBroker(app.settings, clock=FakeClock(EPOCH))
    with anyio.fail_after(TEST_DEADLINE), app.using_broker(broker):
        async with app, app.worker(concurrency=4, grace=0):
            handle = await durable.start(Item(0), run_id="off")
            assert await handle.result(timeout=TEST_DEADLINE) == Item(3)
    assert tops == {"a": 4, "a:closed": 4}  # one replay per turn: 3 steps, then the end
    assert not durable._paused
