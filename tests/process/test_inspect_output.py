"""``typedq inspect`` output: tables that fit 80 columns (ids in full, never cut), the
due time of scheduled jobs, errors without their type said twice, ``--limit 0``, the
``--job ID`` detail view and the ``--workers`` listing."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest
from rich.console import Console

from typedq import App, FailureReason, FailureRecord, JobFailed, JobState
from typedq.backoff import Backoff
from typedq.broker.base import WorkerInfo
from typedq.cli.render import render_job, render_overview, render_workers
from typedq.inspector import Inspector, JobView, Overview, partition_totals

ROOT = Path(__file__).resolve().parents[2]


class Order(msgspec.Struct, frozen=True):
    n: int


def screen(width: int = 80) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=width, force_terminal=False), out


def view(job_id: str, error: FailureRecord | None, *, run_at: float = 0.0) -> JobView:
    return JobView(
        id=job_id,
        task="charge_customer_card",
        queue="billing",
        state=JobState.FAILED,
        attempt=3,
        priority=0,
        enqueued_at=time.time() - 60,
        finished_at=time.time(),
        error=error,
        run_at=run_at,
    )


def record(error_type: str, message: str) -> FailureRecord:
    return FailureRecord(
        reason=FailureReason.DOMAIN_ERROR,
        error_type=error_type,
        message=message,
        attempt=3,
        retryable=False,
    )


def test_failed_jobs_fit_80_columns_with_full_ids_and_single_type_names() -> None:
    """Ids are never cut (issue 29): they are copied into --retry. A ULID fits the table
    at 80 columns; a longer id puts each job on an id line and a line of the rest."""
    long_id = "charge_customer_card:customer-000042-invoice-000007"
    ulid = "01M8Q8Y4H1FDMH9E8TMJWNNAG9"
    jobs = [
        view(long_id, record("shop.errors.CardDeclined", "CardDeclined(code='insufficient')")),
        view(ulid, record("ValueError", "bad amount")),
    ]
    overview = Overview(
        app="shop",
        broker="redis://localhost:6379/0",
        counts={"billing": {JobState.FAILED: 2}},
        state=JobState.FAILED,
        jobs=jobs,
    )
    console, out = screen(80)
    render_overview(console, overview)
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "…" not in text
    lines = [line.strip() for line in text.splitlines()]
    assert long_id in lines  # a line of its own: copied whole
    assert ulid in lines
    assert "CardDeclined(code='insufficient')" in text
    # ULIDs alone fit a table at 80 columns, in full.
    console, out = screen(80)
    render_overview(console, msgspec.structs.replace(overview, jobs=jobs[1:]))
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    (row,) = [line for line in text.splitlines() if ulid in line]
    assert row.split()[0] == ulid
    assert "amount" in text  # the error, folded in its column
    # Wide terminals: one table, every id in full, the errors on one line each.
    console, out = screen(160)
    render_overview(console, overview)
    text = out.getvalue()
    assert ulid in text
    assert long_id in text
    assert "…" not in text
    assert "CardDeclined(code='insufficient')" in text
    assert text.count("CardDeclined") == 1  # not "CardDeclined: CardDeclined(...)"
    assert "shop.errors" not in text
    assert "ValueError: bad amount" in text


def test_partitions_are_listed_and_summed_under_their_queue() -> None:
    counts = {
        "emails.p0": {JobState.WAITING: 2, JobState.FAILED: 1},
        "emails.p1": {JobState.WAITING: 3},
        "emails.p2": {},
        "other": {JobState.WAITING: 7},
        "lonely.p0": {JobState.WAITING: 1},
    }
    totals = partition_totals(counts)
    assert totals == {"emails": (3, {JobState.WAITING: 5, JobState.FAILED: 1}, "emails.p2")}
    overview = Overview(
        app="shop", broker="memory://", counts=counts, state=JobState.FAILED, jobs=[]
    )
    console, out = screen(120)
    render_overview(console, overview)
    lines = out.getvalue().splitlines()
    total_row = next(line for line in lines if "emails (3 partitions)" in line)
    cells = [cell.strip() for cell in total_row.split("│")][1:-1]
    assert cells == ["emails (3 partitions)", "5", "0", "0", "0", "1", "0"]
    # Right after the last partition, before the next queue.
    at = lines.index(total_row)
    assert "emails.p2" in lines[at - 1]
    assert "lonely.p0" in lines[at + 1]
    assert not any("lonely (" in line for line in lines)  # one partition: no total


def test_scheduled_jobs_show_their_due_time_and_limit_0_says_none_were_listed() -> None:
    due = 1_900_000_000.0  # 2030-03-17 17:46:40 UTC
    scheduled = msgspec.structs.replace(
        view("01M8Q8Y4H1FDMH9E8TMJWNNAG9", None, run_at=due), state=JobState.SCHEDULED
    )
    overview = Overview(
        app="shop",
        broker="memory://",
        counts={"billing": {JobState.SCHEDULED: 1}},
        state=JobState.SCHEDULED,
        jobs=[scheduled],
    )
    console, out = screen(120)
    render_overview(console, overview)
    assert "due" in out.getvalue()
    assert "2030-03-17 17:46:40" in out.getvalue()
    console, out = screen(80)
    render_overview(console, msgspec.structs.replace(overview, jobs=[]), limit=0)
    assert "scheduled jobs: 1; none listed (--limit 0)" in out.getvalue()
    assert "no scheduled jobs" not in out.getvalue()


@pytest.mark.anyio
async def test_job_detail_shows_payload_error_record_and_traceback() -> None:
    app = App("inspectjob", broker="memory://")

    @app.task(retries=0)
    async def charge(order: Order) -> Order:
        raise RuntimeError(f"gateway down for order {order.n}")

    async with app:
        job = await charge.enqueue(Order(n=41))
        async with app.worker(concurrency=1):
            with contextlib.suppress(JobFailed):
                await job.result(timeout=10)
        tool = Inspector(app.client, ["default"])
        detail = await tool.job(job.id)
        assert await tool.job("no-such-job") is None
    assert detail is not None
    assert detail.payload == {"n": 41}
    assert detail.job.state is JobState.FAILED
    assert detail.job.error is not None
    assert detail.job.error.traceback is not None
    console, out = screen(80)
    render_job(console, detail)
    text = out.getvalue()
    assert job.id in text  # the detail view never clips the id
    assert '"n": 41' in text
    assert "RuntimeError: gateway down for order 41" in text
    assert "Traceback (most recent call last)" in text
    assert "error (attempt 1, error, " in text


@pytest.mark.anyio
async def test_job_detail_shows_every_failed_attempt_with_its_traceback() -> None:
    app = App("inspectattempts", broker="memory://")

    @app.task(retries=2, backoff=Backoff(kind="fixed", base=0))
    async def charge(order: Order) -> Order:
        raise RuntimeError(f"gateway down, try {order.n}")

    async with app:
        job = await charge.enqueue(Order(n=7))
        async with app.worker(concurrency=1):
            with contextlib.suppress(JobFailed):
                await job.result(timeout=10)
        detail = await Inspector(app.client, ["default"]).job(job.id)
    assert detail is not None
    assert [a.attempt for a in detail.attempts] == [1, 2, 3]
    console, out = screen(100)
    render_job(console, detail)
    text = out.getvalue()
    assert "attempt 1 failed (attempt 1, error" in text
    assert "attempt 2 failed (attempt 2, error" in text
    assert "error (attempt 3, error" in text
    assert text.count("Traceback (most recent call last)") == 3


def test_workers_table_fits_80_columns() -> None:
    now = time.time()
    workers = [
        WorkerInfo(
            id=f"worker-host-{i}.example.internal.1234{i}.abcdef",
            host=f"worker-host-{i}.example.internal",
            pid=12340 + i,
            queues=["billing", "reports"],
            concurrency=64,
            in_flight=i,
            started_at=now - 3600,
            heartbeat_at=now - 2,
            version="0.1.0",
        )
        for i in range(2)
    ]
    console, out = screen(80)
    render_workers(console, "shop", workers)
    text = out.getvalue()
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "12341" in text
    assert "1/64" in text
    assert "1.0h ago" in text
    console, out = screen(80)
    render_workers(console, "shop", [])
    assert "no live workers of app 'shop'" in out.getvalue()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--limit", "-1"], "--limit must be between 0 and 1000"),
        # Never a silent 1,000 for 20,000 asked (issue 29).
        (["--limit", "20000", "--json"], "--limit must be between 0 and 1000 (the most jobs"),
        (["--workers", "--retry", "x"], "--workers cannot be combined with --retry"),
        (["--job", "x", "--workers"], "--job cannot be combined with --workers"),
        (["--job", "nope"], "no job 'nope' in app 'x'"),
    ],
)
def test_inspect_view_errors_are_one_clear_line(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "typedq", "inspect", "--app", "x", "--broker", "memory://", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "typedq: error" in line]
    assert len(errors) == 1, result.stderr
    assert message in errors[0]


def test_trimmed_jobs_are_shown_under_the_counts() -> None:
    overview = Overview(
        app="shop",
        broker="memory://",
        counts={"billing": {JobState.COMPLETED: 10_000}},
        state=JobState.FAILED,
        jobs=[],
        trimmed={"billing": {JobState.COMPLETED: 2_500, JobState.FAILED: 3}},
    )
    console, out = screen(80)
    render_overview(console, overview)
    assert "queue billing: 2500 completed, 3 failed trimmed (deleted by retention)" in (
        out.getvalue()
    )
