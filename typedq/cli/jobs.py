"""``typedq jobs``: find jobs by filter, and retry, cancel or remove all of them
(the parser is in :mod:`typedq.cli`; the walk in :mod:`typedq.bulk`, the tables in
:mod:`typedq.cli.render`).

Without an action it lists the matching jobs (the first ``--limit``) and their count;
with ``--retry``, ``--cancel`` or ``--remove`` it acts on every match, a page at a time,
with a progress bar on a terminal; ``--dry-run`` counts what the action would touch.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ..broker.base import JobState
from ..client import DEFAULT_BROKER_ENV, Client
from ..errors import ConfigError
from ..task import TaskBase, expand_queues
from .common import load_app
from .inspect import MAX_LIMIT, _discover_queues

if TYPE_CHECKING:
    from rich.console import Console

    from ..bulk import BulkAction, BulkQuery, BulkReport

__all__ = ["add_jobs_parser", "jobs_command"]

log = logging.getLogger("typedq.cli")

_ACTIONS: tuple[BulkAction, ...] = ("retry", "cancel", "remove")


def add_jobs_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``typedq jobs`` to the subcommands."""
    jobs: argparse.ArgumentParser = sub.add_parser(
        "jobs",
        parents=parents,
        help="find jobs by filter; retry / cancel / remove every match",
        description="List the jobs of one state that match a filter (task, error type, "
        "age, payload fields), with their count; with --retry, --cancel or --remove, act "
        "on every match in bounded batches (safe to run again: it acts only on what still "
        "matches).",
    )
    jobs.add_argument("target", nargs="?", help="MODULE:APP (its name, tasks, queues and broker)")
    jobs.add_argument("--app", dest="app_name", default=None, help="app name, without MODULE:APP")
    jobs.add_argument(
        "--queue", "-q", action="append", default=[], help="queue (repeatable; default: the app's)"
    )
    jobs.add_argument(
        "--state",
        default=JobState.FAILED.value,
        choices=[s.value for s in JobState],
        help="the jobs' state (default: failed)",
    )
    jobs.add_argument("--task", default=None, help="only jobs of this task")
    jobs.add_argument(
        "--error-type",
        default=None,
        metavar="TYPE",
        help="only jobs whose last error is of this type (qualified, or its last part)",
    )
    jobs.add_argument(
        "--since",
        default=None,
        metavar="DURATION",
        help="only jobs finished (final states) or enqueued (others) within it: 90s, 30m, "
        "1h, 2d, 1w",
    )
    jobs.add_argument(
        "--where",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="only jobs whose payload field equals VALUE (typed by the task's input model; "
        "a.b for a nested field; repeatable, all must hold; needs --task)",
    )
    actions = jobs.add_mutually_exclusive_group()
    for action in _ACTIONS:
        actions.add_argument(
            f"--{action}", action="store_true", help=f"{action} every matching job"
        )
    jobs.add_argument(
        "--dry-run", action="store_true", help="with an action: count what it would touch"
    )
    jobs.add_argument("--limit", type=int, default=20, help="matching jobs listed (0 to 1000)")
    jobs.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return jobs


def jobs_command(args: argparse.Namespace) -> int:
    """``typedq jobs``: list or act on the jobs matching the filter; the exit status
    (0; 1 when an action left some matching job unchanged)."""
    from rich.console import Console

    from .. import bulk
    from . import render

    tasks: dict[str, TaskBase[Any, Any]] = {}
    if args.target:
        app = load_app(args.target)
        if args.app_name and args.app_name != app.name:
            raise ConfigError(f"--app {args.app_name!r} differs from {args.target}'s {app.name!r}")
        queues = expand_queues(app.tasks.values(), args.queue) if args.queue else app.queues
        name, settings = app.name, app.settings
        broker = args.broker or app.client.url
        tasks = dict(app.tasks)
    else:
        if not args.app_name:
            raise ConfigError("give MODULE:APP, or --app NAME with --broker URL")
        name, settings, queues = args.app_name, None, list(args.queue)
        broker = args.broker or os.environ.get(DEFAULT_BROKER_ENV) or ""
        if not broker:
            raise ConfigError(f"give --broker URL (or set {DEFAULT_BROKER_ENV}) with --app")
    chosen: list[BulkAction] = [a for a in _ACTIONS if getattr(args, a)]
    if args.dry_run and not chosen:
        raise ConfigError("--dry-run goes with --retry, --cancel or --remove")
    if not 0 <= args.limit <= MAX_LIMIT:
        raise ConfigError(f"--limit must be between 0 and {MAX_LIMIT}, got {args.limit}")
    flt = bulk.JobFilter(
        state=JobState(args.state),
        task=args.task,
        error_type=args.error_type,
        since=None if args.since is None else bulk.parse_since(args.since),
        where=tuple(args.where),
    )
    if chosen:
        bulk.check_action(chosen[0], flt.state)
    if broker.startswith("memory:"):
        log.warning("memory:// is this process's own embedded broker: it holds no other jobs")
    out = Console(soft_wrap=False)
    err = Console(stderr=True)

    def show(value: object) -> None:
        print(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())

    async def run() -> int:
        client = Client(broker, name=name, settings=settings)
        async with client:
            looked_in = queues or await _discover_queues(client)
            query = bulk.BulkQuery(client, looked_in, flt, tasks=tasks)
            if not chosen:
                preview = await query.preview(limit=args.limit)
                if args.json:
                    show(preview)
                else:
                    render.render_bulk_preview(out, preview)
                return 0
            report = await _with_progress(
                query, chosen[0], err, dry_run=args.dry_run, quiet=args.json
            )
            if args.json:
                show(report)
            else:
                render.render_bulk_report(out, report)
            return 0 if args.dry_run or report.done == report.matched else 1

    return anyio.run(run)


async def _with_progress(
    query: BulkQuery,
    action: BulkAction,
    console: Console,
    *,
    dry_run: bool,
    quiet: bool,
) -> BulkReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from ..bulk import describe_filter

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("examined; {task.fields[done]} {task.fields[verb]}"),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    )
    verb = (
        "matched" if dry_run else {"retry": "retried", "cancel": "cancelled"}.get(action, "removed")
    )
    with progress:
        bar = progress.add_task(
            f"{'dry run: ' if dry_run else ''}{action} {describe_filter(query.filter)}",
            total=None,
            done=0,
            verb=verb,
        )

        def update(report: BulkReport, bound: int) -> None:
            done = report.matched if dry_run else report.done
            progress.update(bar, completed=report.examined, total=bound, done=done)

        return await query.apply(action, dry_run=dry_run, progress=update)
