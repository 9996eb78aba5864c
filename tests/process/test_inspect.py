"""``typedq inspect``: the broker operations it needs, the Inspector, and the CLI.

The broker operations (``list_jobs``, ``retry``, ``remove``) and the Inspector run on
every broker. The CLI runs as a process: against Redis for real data (the embedded
broker cannot be shared across processes), and on ``memory://`` for its errors.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import pytest

from tests.redis_harness import RedisProcess, flushall
from tests.support import TEST_DEADLINE
from typedq import Abort, App, FailureReason, JobFailed, JobState, Task
from typedq.broker.base import RetryOutcome
from typedq.inspector import Inspector

ROOT = Path(__file__).resolve().parents[2]


class Work(msgspec.Struct, frozen=True):
    n: int


def make_app(name: str, url: str) -> tuple[App, Task[Work, None]]:
    app = App(name, broker=url)

    @app.task(queue="jobs")
    async def work(w: Work) -> None:
        if w.n % 2:
            raise Abort(f"odd {w.n}")

    return app, work


async def failed_jobs(
    app: App, work: Task[Work, None], n: int, *, concurrency: int = 8
) -> list[str]:
    """Run ``n`` new jobs to the end: odd ones fail. Returns their ids."""
    jobs = await work.enqueue_many(Work(i) for i in range(n))
    async with app.worker(concurrency=concurrency):
        for job in jobs:
            with contextlib.suppress(JobFailed):
                await job.result(timeout=10)
    return [job.id for job in jobs]


@pytest.fixture
async def app(broker_url: str, app_name: str) -> AsyncIterator[tuple[App, Task[Work, None]]]:
    app, work = make_app(app_name, broker_url)
    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            yield app, work


# -- broker operations -------------------------------------------------------------------


@pytest.mark.anyio
async def test_list_jobs_pages_each_state_in_its_order(
    app: tuple[App, Task[Work, None]],
) -> None:
    the_app, work = app
    broker = the_app.broker
    low = await work.enqueue(Work(0), job_id="low")
    high = await work.enqueue(Work(2), job_id="high", priority=5)
    later = await work.enqueue(Work(4), job_id="later", delay=3600)
    assert await broker.list_jobs("jobs", JobState.WAITING) == [high.id, low.id]
    assert await broker.list_jobs("jobs", JobState.WAITING, offset=1, limit=5) == [low.id]
    assert await broker.list_jobs("jobs", JobState.WAITING, limit=1) == [high.id]
    assert await broker.list_jobs("jobs", JobState.SCHEDULED) == [later.id]
    assert await broker.list_jobs("other", JobState.WAITING) == []
    assert await broker.remove([later.id]) == [True]

    async with the_app.worker(concurrency=1):  # runs high, then low
        await low.result(timeout=10)
    assert await broker.list_jobs("jobs", JobState.COMPLETED) == [low.id, high.id]
    failed = await work.enqueue(Work(1), job_id="f1")
    async with the_app.worker(concurrency=1):
        with pytest.raises(JobFailed):
            await failed.result(timeout=10)
    assert await broker.list_jobs("jobs", JobState.FAILED) == ["f1"]
    assert await broker.list_jobs("jobs", JobState.FAILED, offset=1) == []


@pytest.mark.anyio
async def test_retry_puts_failed_jobs_back_with_a_fresh_attempt_count(
    app: tuple[App, Task[Work, None]],
) -> None:
    the_app, work = app
    broker = the_app.broker
    ids = await failed_jobs(the_app, work, 4)
    odd, even = ids[1::2], ids[0::2]
    outcomes = await broker.retry([*odd, even[0], "missing"])
    assert outcomes == [RetryOutcome.RETRIED] * 2 + [
        RetryOutcome.NOT_RETRYABLE,
        RetryOutcome.NOT_FOUND,
    ]
    records = await broker.get(odd)
    for record in records:
        assert record is not None
        assert record.state is JobState.WAITING
        assert record.attempt == 0
        assert record.error is None
    assert (await broker.counts("jobs"))[JobState.FAILED] == 0
    # They run again (and fail again: the handler has not changed).
    async with the_app.worker(concurrency=2):
        for job_id in odd:
            with pytest.raises(Exception, match="odd"):
                await work.job(job_id).result(timeout=10)
    record = (await broker.get([odd[0]]))[0]
    assert record is not None
    assert record.attempt == 1


@pytest.mark.anyio
async def test_remove_deletes_only_jobs_still_in_the_given_states(
    app: tuple[App, Task[Work, None]],
) -> None:
    the_app, work = app
    broker = the_app.broker
    a = await work.enqueue(Work(0))
    b = await work.enqueue(Work(2))
    assert await broker.remove([a.id, "missing"], states=[JobState.FAILED]) == [False, False]
    assert await broker.remove([a.id, b.id], states=[JobState.WAITING]) == [True, True]
    assert await broker.get([a.id, b.id]) == [None, None]
    assert (await broker.counts("jobs"))[JobState.WAITING] == 0
    assert await broker.list_jobs("jobs", JobState.WAITING) == []


# -- the Inspector ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_overview_shows_counts_and_failed_jobs_with_their_errors(
    app: tuple[App, Task[Work, None]],
) -> None:
    the_app, work = app
    ids = await failed_jobs(the_app, work, 6)
    await work.enqueue(Work(100), delay=3600)
    tool = Inspector(the_app.client, the_app.queues)
    overview = await tool.overview()
    counts = overview.counts["jobs"]
    assert counts[JobState.COMPLETED] == 3
    assert counts[JobState.FAILED] == 3
    assert counts[JobState.SCHEDULED] == 1
    assert sorted(j.id for j in overview.jobs) == sorted(ids[1::2])
    for job in overview.jobs:
        assert job.state is JobState.FAILED
        assert job.error is not None
        assert job.error.reason is FailureReason.ABORTED
        assert job.error.message.startswith("odd ")
    assert len(await tool.jobs(JobState.FAILED, limit=2)) == 2


@pytest.mark.anyio
async def test_actions_by_id_and_for_a_whole_state(app: tuple[App, Task[Work, None]]) -> None:
    the_app, work = app
    broker = the_app.broker
    ids = await failed_jobs(the_app, work, 10)
    tool = Inspector(the_app.client, ["jobs"])

    report = await tool.act("retry", [ids[1], ids[0], "missing"])
    assert report.outcomes == {
        ids[1]: "retried",
        ids[0]: "not_retryable",
        "missing": "not_found",
    }
    assert report.done == 1

    progress: list[tuple[int, int]] = []
    report = await tool.act_on_state(
        "purge", JobState.FAILED, progress=lambda d, t: progress.append((d, t))
    )
    assert report.done == 4
    assert progress[-1] == (4, 4)
    assert (await broker.counts("jobs"))[JobState.FAILED] == 0

    report = await tool.act_on_state("cancel", JobState.WAITING)
    assert report.outcomes == {ids[1]: "cancelled"}
    report = await tool.act_on_state("retry", JobState.CANCELLED)
    assert report.outcomes == {ids[1]: "retried"}

    report = await tool.act("purge", [ids[0], ids[1]])
    assert report.done == 2
    assert await broker.get([ids[0], ids[1]]) == [None, None]

    with pytest.raises(ValueError, match="cannot retry waiting jobs"):
        await tool.act_on_state("retry", JobState.WAITING)


@pytest.mark.anyio
async def test_purging_many_goes_page_by_page(
    app: tuple[App, Task[Work, None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    the_app, work = app
    monkeypatch.setattr("typedq.inspector.PAGE", 7)
    await work.enqueue_many(Work(i) for i in range(50))
    tool = Inspector(the_app.client, ["jobs"])
    progress: list[int] = []
    report = await tool.act_on_state(
        "purge", JobState.WAITING, progress=lambda d, t: progress.append(d)
    )
    assert report.done == 50
    assert progress == [7, 14, 21, 28, 35, 42, 49, 50]
    assert (await the_app.broker.counts("jobs"))[JobState.WAITING] == 0


@pytest.mark.anyio
async def test_acting_on_a_state_while_workers_claim_reaches_every_job_once(
    app: tuple[App, Task[Work, None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The whole-state actions follow page_jobs cursors: workers claiming from the head of
    # the state between pages move no waiting job past the walk.
    the_app, work = app
    monkeypatch.setattr("typedq.inspector.PAGE", 7)
    jobs = await work.enqueue_many(Work(i) for i in range(60))
    broker = the_app.broker
    claimed: set[str] = set()
    page_jobs = broker.page_jobs

    async def claim_then_page(*args: object, **kwargs: object) -> object:
        if len(claimed) < 25:
            got = await broker.claim(["jobs"], 5, worker_id="w", lease=300)
            claimed.update(c.message.id for c in got)
        return await page_jobs(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(broker, "page_jobs", claim_then_page)
    report = await Inspector(the_app.client, ["jobs"]).act_on_state("cancel", JobState.WAITING)
    assert len(claimed) == 25
    assert report.outcomes == {j.id: "cancelled" for j in jobs if j.id not in claimed}
    assert (await broker.counts("jobs"))[JobState.WAITING] == 0


# -- the CLI -------------------------------------------------------------------------------


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", "inspect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TYPEDQ_BROKER": "", "COLUMNS": "200"},
        check=False,
    )


@pytest.mark.redis
def test_cli_on_redis_counts_lists_and_acts(redis_server: RedisProcess, app_name: str) -> None:
    flushall(redis_server.port)
    url = redis_server.url

    async def fill() -> list[str]:
        the_app, work = make_app(app_name, url)
        async with the_app:
            return await failed_jobs(the_app, work, 6)

    ids = anyio.run(fill)
    failed = ids[1::2]
    target = ["--broker", url, "--app", app_name, "--queue", "jobs"]

    overview = inspect(*target, "--json")
    assert overview.returncode == 0, overview.stderr
    data = json.loads(overview.stdout)
    assert data["counts"]["jobs"]["failed"] == 3
    assert data["counts"]["jobs"]["completed"] == 3
    assert sorted(j["id"] for j in data["jobs"]) == sorted(failed)
    assert {j["error"]["reason"] for j in data["jobs"]} == {"aborted"}

    table = inspect(*target)
    assert table.returncode == 0, table.stderr
    assert "failed jobs" in table.stdout
    assert "Abort: odd 1" in table.stdout
    assert "password" not in table.stdout

    retried = inspect(*target, "--retry", failed[0], "nope", "--json")
    assert retried.returncode == 1  # one id was not retried
    assert json.loads(retried.stdout)["outcomes"] == {failed[0]: "retried", "nope": "not_found"}

    purged = inspect(*target, "--purge", "--state", "failed")
    assert purged.returncode == 0, purged.stderr
    assert "purge all failed jobs: 2 of 2 done" in purged.stdout

    cancelled = inspect(*target, "--cancel", "--state", "waiting", "--json")
    assert json.loads(cancelled.stdout)["outcomes"] == {failed[0]: "cancelled"}

    after = json.loads(inspect(*target, "--json", "--state", "cancelled").stdout)
    assert after["counts"]["jobs"]["failed"] == 0
    assert [j["id"] for j in after["jobs"]] == [failed[0]]
    assert after["jobs"][0]["error"]["reason"] == "cancelled"


def test_cli_with_an_app_module_uses_its_name_and_queues() -> None:
    result = inspect("examples.billing.tasks:app", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["app"] == "billing"
    assert sorted(data["counts"]) == ["billing", "reports"]
    assert data["jobs"] == []
    assert "embedded broker" in result.stderr  # memory:// in a fresh process is empty


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give MODULE:APP, or --app NAME with --broker URL"),
        (["--app", "x"], "give --broker URL (or set TYPEDQ_BROKER) with --app"),
        (["no_such_module:app"], "cannot import module 'no_such_module'"),
        (["--app", "x", "--broker", "memory://", "--retry"], "--retry needs job ids, or --state"),
        (
            ["--app", "x", "--broker", "memory://", "--purge", "a", "--state", "failed"],
            "--purge takes job ids or --state, not both",
        ),
        (
            ["--app", "x", "--broker", "memory://", "--retry", "--state", "waiting"],
            "cannot retry waiting jobs; retry applies to: failed, cancelled",
        ),
        (["--app", "x", "--broker", "nope://h"], "unknown broker URL 'nope://h'"),
        (["examples.billing.tasks:app", "--app", "other"], "--app 'other' differs"),
    ],
)
def test_cli_errors_are_one_clear_line(args: list[str], message: str) -> None:
    result = inspect(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "typedq: error" in line]
    assert len(errors) == 1, result.stderr
    assert message in errors[0]
    assert "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_cli_progress_bar_draws_on_a_terminal(
    app: tuple[App, Task[Work, None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rich.console import Console

    from typedq.cli.inspect import _with_progress

    the_app, work = app
    monkeypatch.setattr("typedq.inspector.PAGE", 10)
    await work.enqueue_many(Work(i) for i in range(30))
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    tool = Inspector(the_app.client, ["jobs"])
    report = await _with_progress(tool, "purge", JobState.WAITING, console, quiet=False)
    assert report.done == 30
    assert "purge waiting jobs" in screen.getvalue()
    assert "30/30" in screen.getvalue()


class Part(msgspec.Struct, frozen=True):
    n: int


@pytest.mark.redis
def test_cli_shows_a_flow(redis_server: RedisProcess, app_name: str) -> None:
    flushall(redis_server.port)
    url = redis_server.url

    async def fill() -> str:
        app = App(app_name, broker=url)

        @app.task
        async def double(p: Part) -> Part:
            return Part(p.n * 2)

        @app.task
        async def add(parts: list[Part]) -> Part:
            return Part(sum(p.n for p in parts))

        async with app:
            job = await double.map(Part(i) for i in range(3)).then(add).enqueue()
            return job.id  # no worker: the members wait, the callback is held

    flow_id = anyio.run(fill)
    target = ["--broker", url, "--app", app_name]
    shown = inspect(*target, "--flow", flow_id)
    assert shown.returncode == 0, shown.stderr
    assert f"flow {flow_id}: scheduled (running)" in shown.stdout
    assert "fan-out: 3 members (3 waiting; 3 not settled)" in shown.stdout
    data = json.loads(inspect(*target, "--flow", flow_id, "--json").stdout)
    assert data["steps"][0]["task"] == "add"
    assert data["members_pending"] == 3
    missing = inspect(*target, "--flow", "nope")
    assert missing.returncode == 2
    assert "job 'nope' belongs to no workflow" in missing.stderr
    by_member = json.loads(inspect(*target, "--flow", f"{flow_id}.m1", "--json").stdout)
    assert by_member["id"] == flow_id
