"""The tables of ``typedq inspect``: :mod:`typedq.inspector`'s structures drawn with ``rich``.

Only the command line draws (``--json`` prints the same structures as JSON); the
dashboard renders its own HTML from the same queries, so neither it nor the inspector
imports ``rich``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import msgspec
from rich import box
from rich.console import Console
from rich.table import Table

from ..broker.base import JobState, WorkerInfo
from ..bulk import BULK_DONE, BulkPreview, BulkReport, describe_filter
from ..errors import FailureRecord
from ..inspector import (
    DONE_OUTCOMES,
    RUN_ENTRY_LABELS,
    ActionReport,
    FlowView,
    JobDetail,
    Overview,
    RunView,
    ScheduleView,
    partition_of,
    partition_totals,
    run_detail,
    run_waiting,
)
from ..verify import Report as VerifyReport

__all__ = [
    "render_action",
    "render_bulk_preview",
    "render_bulk_report",
    "render_flow",
    "render_job",
    "render_overview",
    "render_run",
    "render_schedules",
    "render_verify",
    "render_workers",
]


def _when(epoch: float, *, short: bool = False) -> str:
    if not epoch or not math.isfinite(epoch):
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime(
        "%m-%d %H:%M:%S" if short else "%Y-%m-%d %H:%M:%S"
    )


def _clip(job_id: str, width: int) -> str:
    """``job_id`` cut to ``width`` from the left: the end of an id (a ULID's random
    part, a key-derived id's key) tells jobs apart; ``--json`` shows ids in full."""
    if len(job_id) <= width:
        return job_id
    return "…" + job_id[-(width - 1) :]


def _short_type(error_type: str) -> str:
    """``pkg.module.CardDeclined`` -> ``CardDeclined``."""
    return error_type.rpartition(".")[2] or error_type


def _error_text(error: FailureRecord) -> str:
    """The error in one cell: the short type name, then the message, without saying the
    type twice when the message already starts with it."""
    short = _short_type(error.error_type)
    message = error.message
    for name in (error.error_type, short):
        if message == name or message.startswith((f"{name}:", f"{name}(")):
            return message
    return f"{short}: {message}" if message else short


#: What the jobs table shows as the job's time, per state: (column title, field).
_WHEN: dict[JobState, tuple[str, str]] = {
    JobState.WAITING: ("enqueued", "enqueued_at"),
    JobState.SCHEDULED: ("due", "run_at"),
    JobState.ACTIVE: ("started", "started_at"),
}


def render_overview(console: Console, overview: Overview, *, limit: int | None = None) -> None:
    """Draw the counts table and the jobs table (ids in full, to copy into ``--retry``;
    the other columns shrink to fit). ``limit`` is how many jobs were asked for (0: none
    listed)."""
    counts = Table(title=f"app {overview.app!r} on {overview.broker}", title_justify="left")
    counts.add_column("queue", style="bold")
    for state in JobState:
        counts.add_column(state.value, justify="right")
    totals = partition_totals(overview.counts)
    for queue, by_state in sorted(overview.counts.items()):
        counts.add_row(queue, *(str(by_state.get(s, 0)) for s in JobState))
        parent = partition_of(queue)
        if parent is not None and parent[0] in totals and queue == totals[parent[0]][2]:
            n, summed, _ = totals[parent[0]]
            counts.add_row(
                f"{parent[0]} ({n} partitions)",
                *(str(summed.get(s, 0)) for s in JobState),
                style="italic",
            )
    console.print(counts)
    for queue, by_state in sorted(overview.trimmed.items()):
        gone = ", ".join(f"{n} {s.value}" for s, n in by_state.items() if n)
        console.print(f"queue {queue}: {gone} trimmed (deleted by retention)")
    if overview.schedules:
        render_schedules(console, overview.schedules)
    wanted = overview.state.value
    total = sum(by_state.get(overview.state, 0) for by_state in overview.counts.values())
    if limit == 0:
        console.print(
            f"{wanted} jobs: {total}; none listed (--limit 0): raise --limit to list them"
        )
        return
    if not overview.jobs:
        console.print(f"no {wanted} jobs")
        return
    title, field = _WHEN.get(overview.state, ("finished", "finished_at"))
    shown = f"{wanted} jobs"
    if len(overview.jobs) < total:
        shown += f" ({len(overview.jobs)} of {total})"
    wide = console.width >= 120
    # Ids in full, never cut: they are copied into --retry, --cancel and --job. When the
    # longest leaves too little room for the other columns, each job is an id line
    # followed by an indented line of the rest.
    id_width = max(len(job.id) for job in overview.jobs)
    if console.width - id_width < _ROOM:
        _render_stacked(console, shown, overview, title, field)
        return
    jobs = Table(title=shown, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    jobs.add_column("id", no_wrap=True, min_width=id_width)
    jobs.add_column("task", no_wrap=True, overflow="ellipsis", max_width=24 if wide else 12)
    if len(overview.counts) > 1:
        jobs.add_column("queue", no_wrap=True, overflow="ellipsis", max_width=16 if wide else 8)
    jobs.add_column("try", justify="right", no_wrap=True)
    jobs.add_column(title, no_wrap=True)
    show_errors = any(job.error is not None for job in overview.jobs)
    if show_errors:
        if wide:
            jobs.add_column("reason", no_wrap=True)
        jobs.add_column("error", overflow="fold", ratio=1)
    for job in overview.jobs:
        cells = [job.id, job.task]
        if len(overview.counts) > 1:
            cells.append(job.queue)
        cells += [str(job.attempt), _when(getattr(job, field), short=not wide)]
        if show_errors:
            error = job.error
            if wide:
                cells += ["-", "-"] if error is None else [error.reason.value, _error_text(error)]
            else:
                cells.append(
                    "-" if error is None else f"{error.reason.value}: {_error_text(error)}"
                )
        jobs.add_row(*cells)
    console.print(jobs)


#: Columns the jobs table needs beside the ids (task, try, time and some of the error).
_ROOM = 50


def _render_stacked(
    console: Console, shown: str, overview: Overview, title: str, field: str
) -> None:
    """The jobs, each as its full id on a line of its own, then its other cells."""
    console.print(shown, highlight=False)
    many = len(overview.counts) > 1
    for job in overview.jobs:
        console.print(job.id, style="bold", highlight=False, soft_wrap=True)
        cells = [job.task]
        if many:
            cells.append(job.queue)
        cells += [f"try {job.attempt}", f"{title} {_when(getattr(job, field), short=True)}"]
        if job.error is not None:
            cells.append(f"{job.error.reason.value}: {_error_text(job.error)}")
        console.print("    " + "  ".join(cells), highlight=False, markup=False)


def render_flow(console: Console, flow: FlowView) -> None:
    """Draw a workflow: its fan-out members per state, then each step."""
    where = "running" if flow.running else "ended"
    state = "-" if flow.state is None else flow.state.value
    console.print(f"flow {flow.id}: {state} ({where})")
    if flow.members:
        counts = ", ".join(f"{n} {s.value}" for s, n in sorted(flow.member_states.items()))
        if not counts:
            whole = flow.members <= len(flow.member_page)
            counts = "gone" if whole or flow.running else "all settled"
        pending = f"; {flow.members_pending} not settled" if flow.members_pending >= 0 else ""
        console.print(f"fan-out: {flow.members} members ({counts}{pending})")
    table = Table(title="steps", title_justify="left")
    for column in ("#", "id", "task", "state", "attempt", "error"):
        table.add_column(column, overflow="fold")
    for k, step in enumerate(flow.steps):
        if step is None:
            table.add_row(str(k), "-", "-", "gone", "-", "-")
            continue
        error = step.error
        table.add_row(
            str(k),
            step.id,
            step.task,
            step.state.value + (f" ({step.waits_for})" if step.waits_for else ""),
            str(step.attempt),
            "-" if error is None else f"{error.reason.value}: {error.message}",
        )
    console.print(table)
    for member in flow.failed_members:
        error = member.error
        message = "-" if error is None else f"{error.reason.value}: {error.message}"
        console.print(f"member {member.id}: {member.state.value}: {message}")
    if flow.members > len(flow.member_page):
        shown = f"{flow.members_start}-{flow.members_start + len(flow.member_page) - 1}"
        console.print(f"(failed members among members {shown} of {flow.members})")


def render_schedules(console: Console, schedules: Sequence[ScheduleView]) -> None:
    """Draw the schedules table: next and last fire times (UTC), counts, status."""
    table = Table(title="schedules", title_justify="left")
    for column in ("name", "task", "spec", "next fire", "last fired", "fired", "skipped"):
        table.add_column(column, overflow="fold")
    table.add_column("status")
    for s in schedules:
        if s.cron is not None:
            spec = f"cron {s.cron}" + (f" ({s.tz})" if s.tz and s.tz != "UTC" else "")
        elif s.every is not None:
            spec = f"every {s.every:g}s"
        else:
            spec = "-"
        table.add_row(
            s.name,
            s.task or "-",
            spec,
            _when(s.next_fire or 0.0),
            _when(s.last_fired or 0.0),
            str(s.fired),
            str(s.skipped),
            s.status,
        )
    console.print(table)


def render_action(console: Console, report: ActionReport) -> None:
    """Draw the outcome of retry / cancel / purge."""
    what = f"all {report.state.value} jobs" if report.state is not None else "jobs by id"
    console.print(f"{report.action} {what}: {report.done} of {len(report.outcomes)} done")
    shown = {i: o for i, o in report.outcomes.items() if o not in DONE_OUTCOMES}
    if report.state is None:
        shown = report.outcomes
    if not shown:
        return
    table = Table()
    table.add_column("id")
    table.add_column("outcome")
    for job_id, outcome in shown.items():
        table.add_row(job_id, outcome)
    console.print(table)


def render_job(console: Console, detail: JobDetail) -> None:
    """Draw one job in full: its facts, payload, result, progress and error record."""
    from rich.syntax import Syntax

    job = detail.job
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    rows: list[tuple[str, str]] = [
        ("id", job.id),
        ("task", job.task),
        ("queue", job.queue),
        (
            "state",
            job.state.value
            + (" (cancel requested)" if detail.cancel_requested else "")
            + (f" ({job.waits_for})" if job.waits_for else ""),
        ),
        ("attempt", str(job.attempt) + (f" ({detail.stalls} stalls)" if detail.stalls else "")),
        ("priority", str(job.priority)),
        ("enqueued", _when(job.enqueued_at)),
    ]
    if job.run_at and not job.waits_for:
        rows.append(("due", _when(job.run_at)))
    if job.started_at:
        rows.append(("started", _when(job.started_at)))
    if job.finished_at:
        rows.append(("finished", _when(job.finished_at)))
    if detail.worker_id:
        rows.append(("worker", detail.worker_id))
    for name, value in rows:
        facts.add_row(name, value)
    console.print(facts)
    for name, value in (
        ("payload", detail.payload),
        ("result", detail.result),
        ("progress", detail.progress),
    ):
        if value is not None:
            console.print(f"[bold]{name}[/bold]")
            console.print(_json_text(value), soft_wrap=True, markup=False, highlight=False)
    # Earlier attempts first (the last one is the job's error, drawn below).
    earlier = detail.attempts
    if job.error is not None and earlier and earlier[-1] == job.error:
        earlier = earlier[:-1]
    records = [(f"attempt {e.attempt} failed", e) for e in earlier]
    if job.error is not None:
        records.append(("error", job.error))
    for title, error in records:
        console.print(
            f"[bold]{title}[/bold] (attempt {error.attempt}, {error.reason.value}, "
            f"{_when(error.failed_at)})"
        )
        console.print(_error_text(error), soft_wrap=True, markup=False, highlight=False)
        if error.domain_type:
            console.print(f"domain error: {error.domain_type}", markup=False, highlight=False)
        if error.traceback:
            console.print(Syntax(error.traceback.rstrip(), "pytb", word_wrap=True))


def render_run(console: Console, run: RunView) -> None:
    """Draw a durable run: its facts, input, timeline (one row per log entry) and its
    result or failure."""
    from rich.syntax import Syntax

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold", no_wrap=True)
    facts.add_column(overflow="fold")
    rows = [
        ("run", run.id),
        ("durable", run.name),
        ("queue", run.queue),
        ("state", run.state.value),
        ("created", _when(run.created_at)),
    ]
    if run.finished_at:
        rows.append(("finished", _when(run.finished_at)))
    if waiting := run_waiting(run, _when):
        rows.append(("waits for", waiting))
    if run.inbox:
        rows.append(("inbox", ", ".join(f"{n} ({c})" for n, c in run.inbox.items())))
    if run.unlogged_steps:
        rows.append(("ended steps", ", ".join(run.unlogged_steps) + " (not logged yet)"))
    for name, value in rows:
        facts.add_row(name, value)
    console.print(facts)
    console.print("[bold]input[/bold]")
    console.print(_json_text(run.input), soft_wrap=True, markup=False, highlight=False)
    if run.entries:
        table = Table(box=box.SIMPLE_HEAD, title="timeline", title_justify="left")
        table.add_column("#", justify="right", no_wrap=True)
        table.add_column("entry", no_wrap=True)
        table.add_column("name", overflow="fold")
        table.add_column("detail", overflow="fold")
        for entry in run.entries:
            table.add_row(
                str(entry.position),
                RUN_ENTRY_LABELS.get(entry.kind, entry.kind),
                entry.name,
                run_detail(entry, _when),
            )
        console.print(table)
    else:
        console.print("timeline: no entries yet (its first turn has not run)")
    if run.result is not None:
        console.print("[bold]result[/bold]")
        console.print(_json_text(run.result), soft_wrap=True, markup=False, highlight=False)
    if run.failure is not None:
        console.print(f"[bold]failure[/bold] ({run.failure.reason.value})")
        console.print(_error_text(run.failure), soft_wrap=True, markup=False, highlight=False)
        if run.failure.traceback:
            console.print(Syntax(run.failure.traceback.rstrip(), "pytb", word_wrap=True))


def _json_text(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def _ago(epoch: float, now: float) -> str:
    if not epoch or not math.isfinite(epoch):
        return "-"
    seconds = max(0.0, now - epoch)
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.1f}d ago"


def render_workers(console: Console, app: str, workers: Sequence[WorkerInfo]) -> None:
    """Draw the live workers (ids truncated to fit: ``--json`` has them in full)."""
    if not workers:
        console.print(f"no live workers of app {app!r}")
        return
    now = time.time()
    wide = console.width >= 120
    table = Table(
        title=f"live workers of app {app!r}",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("id", no_wrap=True)
    table.add_column("host", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("queues", overflow="fold", ratio=1)
    table.add_column("busy", justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("beat", no_wrap=True)
    if wide:
        table.add_column("version", no_wrap=True)
    for worker in workers:
        cells = [
            _clip(worker.id, 40 if wide else 14),
            _clip(worker.host, 24 if wide else 10),
            str(worker.pid),
            ", ".join(worker.queues),
            f"{worker.in_flight}/{worker.concurrency}",
            _ago(worker.started_at, now),
            _ago(worker.heartbeat_at, now),
        ]
        if wide:
            cells.append(worker.version)
        table.add_row(*cells)
    console.print(table)


_VERDICT_STYLE = {"compatible": "green", "incompatible": "bold red", "unknown": "yellow"}


def render_verify(console: Console, report: VerifyReport, *, sample: int) -> None:
    """Draw ``typedq verify``'s table: task, fingerprint, jobs, verdict, reason (jobs
    "at least N" when the scan that counted them stopped at ``--sample``), then how the
    jobs were counted: exactly by the broker, or a sample read."""
    table = Table(
        title=f"app {report.app!r}: task schemas against the broker",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("task", no_wrap=True)
    table.add_column("fingerprint", no_wrap=True)
    table.add_column("seen", no_wrap=True)
    table.add_column("jobs", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("reason", overflow="fold", ratio=1)
    for row in report.rows:
        jobs = "-" if row.source == "stub" else str(row.jobs)
        if row.at_least:
            jobs = f"at least {row.jobs}"
        seen = {"current": "current", "stub": "stub", "jobs": "jobs only", "runs": "in runs"}.get(
            row.source, _when(row.first_seen, short=True)
        )
        style = _VERDICT_STYLE.get(row.verdict, "")
        table.add_row(
            row.task,
            row.fingerprint,
            seen,
            jobs,
            f"[{style}]{row.verdict}[/]" if style else row.verdict,
            row.reason,
        )
    console.print(table)
    if report.exact:
        scanned = f"counted {report.scanned} jobs, every one (exact counts, by the broker)"
    else:
        scanned = f"read {report.scanned} jobs (a sample scan: this broker does not count)"
    if report.runs:
        scanned += f" and {report.runs} running durable runs (their rows count runs)"
    if report.capped:
        scanned += f"; stopped at --sample {sample}: counts marked 'at least' are lower bounds"
    console.print(scanned)
    if report.note:
        console.print(report.note)


# -- typedq jobs (bulk actions by filter, typedq.bulk) ------------------------------------


def render_bulk_preview(console: Console, preview: BulkPreview) -> None:
    """Draw the matches of a filter: the count, then the first of them."""
    what = describe_filter(preview.filter)
    console.print(f"{preview.total} matching {what} (examined {preview.examined})")
    if not preview.jobs:
        return
    title, field = _WHEN.get(preview.filter.state, ("finished", "finished_at"))
    shown = f"first {len(preview.jobs)}" if len(preview.jobs) < preview.total else "all"
    table = Table(title=shown, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("id", no_wrap=True)
    table.add_column("task", no_wrap=True, overflow="ellipsis", max_width=24)
    if len(preview.queues) > 1:
        table.add_column("queue", no_wrap=True, overflow="ellipsis", max_width=16)
    table.add_column("try", justify="right", no_wrap=True)
    table.add_column(title, no_wrap=True)
    errors = any(job.error is not None for job in preview.jobs)
    if errors:
        table.add_column("error", overflow="fold", ratio=1)
    for job in preview.jobs:
        cells = [job.id, job.task]
        if len(preview.queues) > 1:
            cells.append(job.queue)
        cells += [str(job.attempt), _when(getattr(job, field))]
        if errors:
            cells.append("-" if job.error is None else _error_text(job.error))
        table.add_row(*cells)
    console.print(table)


#: The past tense of each bulk action, for the report line.
_DONE_WORDS = {"retry": "retried", "cancel": "cancelled", "remove": "removed"}


def render_bulk_report(console: Console, report: BulkReport) -> None:
    """Draw what a bulk action did (or, dry run, would do)."""
    what = describe_filter(report.filter)
    if report.dry_run:
        console.print(
            f"dry run: would {report.action} {report.matched} matching {what} "
            f"(examined {report.examined}; nothing changed)"
        )
        return
    console.print(
        f"{_DONE_WORDS[report.action]} {report.done} of {report.matched} matching {what} "
        f"(examined {report.examined})"
    )
    others = {o: n for o, n in report.outcomes.items() if o not in BULK_DONE}
    if others:
        console.print("left unchanged: " + ", ".join(f"{n} {o}" for o, n in sorted(others.items())))
