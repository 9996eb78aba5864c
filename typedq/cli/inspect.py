"""``typedq inspect``: counts, jobs, workflows, durable runs and workers, and retry / cancel / purge
(the parser is in :mod:`typedq.cli`; the queries in :mod:`typedq.inspector`, the tables in
:mod:`typedq.cli.render`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ..broker.base import JobState
from ..broker.flowviews import FLOW_KINDS, FlowKind
from ..client import DEFAULT_BROKER_ENV, Client
from ..errors import ConfigError, Unsupported
from ..schedule import Schedule
from ..task import expand_queues
from .common import load_app

if TYPE_CHECKING:
    from rich.console import Console

    from .. import inspector

__all__ = ["inspect_command"]

log = logging.getLogger("typedq.cli")

#: The largest ``--limit``: a broker lists at most this many ids per call
#: (:meth:`Broker.list_jobs <typedq.broker.base.Broker.list_jobs>`).
MAX_LIMIT = 1000


def inspect_command(args: argparse.Namespace) -> int:
    """``typedq inspect``: show or act on jobs as ``args`` asks; the exit status."""
    from rich.console import Console

    from .. import inspect_flow, inspector  # imported here: rich loads only for inspect
    from . import render

    if args.target:
        app = load_app(args.target)
        if args.app_name and args.app_name != app.name:
            raise ConfigError(f"--app {args.app_name!r} differs from {args.target}'s {app.name!r}")
        queues = expand_queues(app.tasks.values(), args.queue) if args.queue else app.queues
        name, settings = app.name, app.settings
        broker = args.broker or app.client.url
        schedules: list[Schedule[Any]] | None = list(app.schedules.values())
    else:
        if not args.app_name:
            raise ConfigError("give MODULE:APP, or --app NAME with --broker URL")
        # No queues given: the broker's queue registry names them (in `run` below).
        name, settings, queues = args.app_name, None, list(args.queue)
        schedules = None
        broker = args.broker or os.environ.get(DEFAULT_BROKER_ENV) or ""
        if not broker:
            raise ConfigError(f"give --broker URL (or set {DEFAULT_BROKER_ENV}) with --app")
    chosen = [a for a in inspector.ACTIONS if getattr(args, a) is not None]
    state = JobState(args.state) if args.state else None
    if not 0 <= args.limit <= MAX_LIMIT:
        raise ConfigError(
            f"--limit must be between 0 and {MAX_LIMIT} (the most jobs a broker lists per "
            f"queue in one call), got {args.limit}"
        )
    views = [
        flag
        for flag, on in (
            ("--job", args.job),
            ("--workers", args.workers),
            ("--flow", args.flow),
            ("--run", args.run),
            ("--fair", args.flow_fair),
            ("--debounced", args.flow_debounce),
            ("--unique", args.flow_unique),
            ("--streams", args.flow_stream),
        )
        if on
    ]
    flow_kind: FlowKind | None = next(
        (k for k in FLOW_KINDS if getattr(args, f"flow_{k}") is not None), None
    )
    if args.cursor is not None and flow_kind is None:
        raise ConfigError("--cursor goes with --fair, --debounced, --unique or --streams")
    if len(views) > 1 or (views and (chosen or state is not None)):
        others = views[1:] + [f"--{a}" for a in chosen] + (["--state"] if state else [])
        raise ConfigError(f"{views[0]} cannot be combined with {', '.join(others)}")
    if chosen and not getattr(args, chosen[0]) and state is None:
        raise ConfigError(f"--{chosen[0]} needs job ids, or --state STATE for every job in it")
    if chosen and getattr(args, chosen[0]) and state is not None:
        raise ConfigError(f"--{chosen[0]} takes job ids or --state, not both")
    if broker.startswith("memory:"):
        log.warning("memory:// is this process's own embedded broker: it holds no other jobs")

    out = Console(soft_wrap=False)
    err = Console(stderr=True)

    def show(value: object, render: Callable[[], None]) -> int:
        """Print ``value`` as JSON (``--json``) or as ``render`` draws it; exit status 0."""
        if args.json:
            print(msgspec.json.format(msgspec.json.encode(value), indent=2).decode())
        else:
            render()
        return 0

    async def run() -> int:
        client = Client(broker, name=name, settings=settings)
        async with client:
            tool = inspector.Inspector(
                client, queues or await _discover_queues(client), schedules=schedules
            )
            if args.flow is not None:
                flow = await tool.flow(args.flow)
                if flow is None:
                    raise ConfigError(f"job {args.flow!r} belongs to no workflow")
                return show(flow, lambda: render.render_flow(out, flow))
            if args.job:
                detail = await tool.job(args.job)
                if detail is None:
                    raise ConfigError(f"no job {args.job!r} in app {name!r} (finished jobs "
                                      "expire by the app's retention)")  # fmt: skip
                return show(detail, lambda: render.render_job(out, detail))
            if args.run:
                run_view = await tool.run(args.run)
                if run_view is None:
                    raise ConfigError(f"no durable run {args.run!r} in app {name!r} (finished "
                                      "runs expire by the app's retention)")  # fmt: skip
                return show(run_view, lambda: render.render_run(out, run_view))
            if flow_kind is not None:
                keys = await inspect_flow.flow_keys_view(
                    client.broker,
                    getattr(args, f"flow_{flow_kind}"),
                    flow_kind,
                    limit=args.limit,
                    cursor=args.cursor,
                )
                return show(keys, lambda: inspect_flow.render_flow_keys(out, keys))
            if args.workers:
                workers = await tool.workers()
                return show(workers, lambda: render.render_workers(out, name, workers))
            if not chosen:
                overview = await tool.overview(state or JobState.FAILED, limit=args.limit)
                return show(
                    overview, lambda: render.render_overview(out, overview, limit=args.limit)
                )
            action = chosen[0]
            if state is None:
                report = await tool.act(action, getattr(args, action))
            else:
                report = await _with_progress(tool, action, state, err, quiet=args.json)
            show(report, lambda: render.render_action(out, report))
            return 0 if inspector.all_done(report) else 1

    return anyio.run(run)


async def _discover_queues(client: Client) -> list[str]:
    """Every queue the broker's queue registry knows (``default`` when it knows none)."""
    try:
        found = await client.broker.list_queues()
    except Unsupported:
        found = []
    return found or ["default"]


async def _with_progress(
    tool: inspector.Inspector,
    action: inspector.Action,
    state: JobState,
    console: Console,
    *,
    quiet: bool,
) -> inspector.ActionReport:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=quiet or not console.is_terminal,
    )
    with progress:
        bar = progress.add_task(f"{action} {state.value} jobs", total=None)

        def update(done: int, total: int) -> None:
            progress.update(bar, completed=done, total=total)

        return await tool.act_on_state(action, state, progress=update)
