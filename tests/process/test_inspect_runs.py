"""``typedq inspect --run ID``: a durable run's timeline (the Inspector's query, the table
and ``--json``), and the CLI's errors.

The embedded broker cannot be shared across processes, so the query and the drawing run
in process on ``memory://`` (a run driven on virtual time); the CLI process is run for its
errors, and against Redis once the Redis broker keeps runs.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import anyio
import msgspec
import pytest
from rich.console import Console

from tests.redis_harness import RedisProcess, flushall
from tests.support import TEST_DEADLINE
from typedq import Abort, App, JobFailed
from typedq.broker.runs import RunRecord, RunState, SignalOutcome
from typedq.cli.render import render_run
from typedq.durable import Run, RunTimeout, Signal
from typedq.inspector import Inspector, RunView
from typedq.testing import FakeClock, run_worker

ROOT = Path(__file__).resolve().parents[2]
EPOCH = 1_700_000_000.0


class User(msgspec.Struct, frozen=True):
    name: str


class Account(msgspec.Struct, frozen=True):
    id: str


class Approval(msgspec.Struct, frozen=True):
    ok: bool
    by: str


class Progress(msgspec.Struct, frozen=True):
    done: int


class Onboarded(msgspec.Struct, frozen=True):
    account: str
    approved: bool


approval = Signal("inspect-approval", Approval)


def onboarding_app(broker: str = "memory://") -> App:
    app = App("inspectruns", broker=broker)

    @app.task
    async def create_account(user: User) -> Account:
        return Account(id=f"acct-{user.name}")

    @app.task(retries=0)
    async def charge(user: User) -> Account:
        raise Abort(f"card of {user.name} declined")

    @app.durable
    async def onboard(run: Run, user: User) -> Onboarded:
        account = await run.step(create_account, user)
        if run.patched("welcome-mail"):
            await run.emit(Progress(done=1))
        score = await run.do("score", lambda: len(user.name))
        await run.sleep(timedelta(hours=1))
        try:
            ok = (await run.wait_for(approval, timeout=timedelta(days=1))).ok
        except RunTimeout:
            ok = False
        try:
            await run.step(charge, user)
        except JobFailed:
            ok = ok and score > 100  # compensation: not approved after all
        return Onboarded(account=account.id, approved=ok)

    @app.durable
    async def quick(run: Run, user: User) -> Account:
        account = await run.step(create_account, user)
        await run.emit(Progress(done=1))
        return account

    return app


async def until(app: App, run_id: str, predicate: Callable[[RunRecord], bool]) -> RunRecord:
    with anyio.fail_after(TEST_DEADLINE):
        while True:
            [record] = await app.broker.get_runs([run_id])
            assert record is not None
            if predicate(record):
                return record
            await anyio.sleep(0.005)


def screen(view: RunView) -> str:
    out = io.StringIO()
    render_run(Console(file=out, width=100, force_terminal=False), view)
    return out.getvalue()


@pytest.mark.anyio
async def test_a_runs_timeline_shows_every_entry_waits_and_result() -> None:
    app = onboarding_app()
    onboard = app.durables["onboard"]
    async with run_worker(app, clock=FakeClock(EPOCH)) as harness:
        tool = Inspector(app.client, app.queues)
        assert await tool.run("no-such-run") is None
        handle = await onboard.start(User(name="ada"), run_id="user-7")
        await until(app, "user-7", lambda r: r.wake_at is not None and r.wait_signal is None)
        sleeping = await tool.run("user-7")
        assert sleeping is not None
        assert sleeping.state is RunState.RUNNING
        assert sleeping.wake_at == pytest.approx(EPOCH + 3600, abs=1)
        assert "the clock to pass 2023-11-14 23:13:20" in screen(sleeping)

        await harness.advance(3600)
        await until(app, "user-7", lambda r: r.wait_signal == "inspect-approval")
        waiting = await tool.run("user-7")
        assert waiting is not None
        assert waiting.wait_signal == "inspect-approval"
        assert "signal 'inspect-approval' until 2023-11-15" in screen(waiting)

        sent = await tool.signal_run("user-7", approval.name, approval.encode(Approval(True, "bo")))
        assert sent is SignalOutcome.DELIVERED
        assert await tool.signal_run("nope", approval.name, b"") is SignalOutcome.NOT_FOUND
        assert await handle.result(timeout=TEST_DEADLINE) == Onboarded("acct-ada", False)
        view = await tool.run("user-7")
    assert view is not None
    assert view.state is RunState.COMPLETED
    assert view.input == {"name": "ada"}
    assert view.result == {"account": "acct-ada", "approved": False}
    assert view.wake_at is None
    assert view.wait_signal is None
    assert not view.wait_jobs
    kinds = [(e.position, e.kind, e.name) for e in view.entries]
    assert kinds == [
        (0, "step", "create_account"),
        (0, "step_ok", "create_account"),
        (1, "patch", "welcome-mail"),
        (2, "emit", f"{__name__}.Progress"),
        (3, "do", "score"),
        (4, "sleep", ""),
        (5, "wait", "inspect-approval"),
        (5, "signal", "inspect-approval"),
        (6, "step", "charge"),
        (6, "step_failed", "charge"),
    ]
    by_kind = {e.kind: e for e in view.entries}
    assert by_kind["step_ok"].value == {"id": "acct-ada"}
    assert by_kind["emit"].value == {"done": 1}
    assert by_kind["do"].value == 3
    assert by_kind["sleep"].at == pytest.approx(EPOCH + 3600, abs=1)
    assert by_kind["wait"].at == pytest.approx(EPOCH + 3600 + 86400, abs=1)
    assert by_kind["signal"].value == {"ok": True, "by": "bo"}
    failure = by_kind["step_failed"].failure
    assert failure is not None
    assert "card of ada declined" in failure.message

    text = screen(view)
    for shown in (
        "user-7",
        "completed",
        "step scheduled",
        "step completed",
        "step failed",
        "signal received",
        "wait for signal",
        "patched",
        "emitted",
        "card of ada declined",
        '"approved": false',
        '{"ok":true,"by":"bo"}',
    ):
        assert shown in text, shown
    # --json prints the same structure.
    data = json.loads(msgspec.json.encode(view))
    assert data["state"] == "completed"
    assert data["entries"][1]["value"] == {"id": "acct-ada"}


@pytest.mark.anyio
async def test_a_cancelled_run_shows_its_failure_and_cancel_reports_the_end() -> None:
    app = onboarding_app()
    onboard = app.durables["onboard"]
    async with run_worker(app, clock=FakeClock(EPOCH)):
        tool = Inspector(app.client, app.queues)
        await onboard.start(User(name="bo"), run_id="user-8")
        await until(app, "user-8", lambda r: r.wake_at is not None)
        assert await tool.cancel_run("user-8") is True
        assert await tool.cancel_run("user-8") is False
        view = await tool.run("user-8")
    assert view is not None
    assert view.state is RunState.CANCELLED
    assert "cancelled" in screen(view)


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", "inspect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "nope"], "no durable run 'nope' in app 'x'"),
        (["--run", "a", "--job", "b"], "--job cannot be combined with --run"),
        (["--run", "a", "--retry", "b"], "--run cannot be combined with --retry"),
    ],
)
def test_inspect_run_errors_are_one_clear_line(args: list[str], message: str) -> None:
    result = inspect("--app", "x", "--broker", "memory://", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "typedq: error" in line]
    assert len(errors) == 1, result.stderr
    assert message in errors[0]


def test_inspect_run_on_redis_shows_the_timeline(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    app = onboarding_app(redis_server.url)
    quick = app.durables["quick"]

    async def drive() -> None:
        with anyio.fail_after(TEST_DEADLINE):
            async with app, app.worker(concurrency=4):
                handle = await quick.start(User(name="cy"), run_id="user-9")
                assert await handle.result(timeout=TEST_DEADLINE) == Account(id="acct-cy")

    anyio.run(drive)
    target = ["--broker", redis_server.url, "--app", "inspectruns", "--run", "user-9"]
    as_json = inspect(*target, "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["state"] == "completed"
    assert [e["kind"] for e in data["entries"]] == ["step", "step_ok", "emit"]
    table = inspect(*target)
    assert table.returncode == 0, table.stderr
    assert "step completed" in table.stdout
    assert "emitted" in table.stdout
