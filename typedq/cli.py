"""The ``typedq`` command line (also ``python -m typedq``).

``typedq worker MODULE:APP`` runs a worker process. SIGTERM or SIGINT start a graceful
shutdown (stop claiming, let in-flight jobs finish within ``--grace``, then cancel and
hand them back; sync handlers' threads get at most one lease more, then are abandoned);
a second signal cancels at once. The process exits even when a sync handler's thread
never returns: threads cannot be stopped, so the worker command ends the process with
``os._exit`` once logs are flushed (the abandoned jobs come back by lease expiry).

``typedq stubs MODULE:APP --out stubs/NAME.py`` writes typed producer stubs
(``--check`` exits 1 with a diff when the file is stale; ``typedq stubs [--check]
FILE...`` regenerates files from the command in their header). ``typedq schema
MODULE:APP`` prints each task's JSON Schemas. ``typedq inspect`` shows counts, failed
jobs, and retries, cancels or purges jobs (see :mod:`typedq.inspector`).

Every error is one line on stderr and exit status 2; ``--check`` and inspect actions
that left some job untouched exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from . import stubgen
from .app import App
from .broker import redact_url
from .broker.base import JobState
from .client import DEFAULT_BROKER_ENV, Client
from .errors import ConfigError, TypedqError
from .schema import app_schema as schema_of
from .worker import Worker

if TYPE_CHECKING:
    from rich.console import Console

    from . import inspector

__all__ = ["load_app", "main"]

log = logging.getLogger("typedq.cli")


def load_app(target: str) -> App:
    """Import ``module:attribute`` (from the command line, never from broker data)."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"expected MODULE:APP (e.g. examples.quickstart:app), got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current project is importable
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import module {module_name!r}: {exc}") from exc
    except TypedqError:
        raise
    except Exception as exc:
        # The module itself is broken: say where, in one line, instead of a traceback.
        raise ConfigError(
            f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    app: Any = module
    for part in attribute.split("."):
        app = getattr(app, part, None)
        if app is None:
            raise ConfigError(f"module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(app, App):
        raise ConfigError(f"{target} is a {type(app).__qualname__}, not a typedq.App")
    return app


async def _run_worker(app: App, args: argparse.Namespace) -> None:
    queues = [q for q in args.queues.split(",") if q] if args.queues else None
    worker = app.worker(concurrency=args.concurrency, queues=queues, grace=args.grace)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_handle_signals, worker)
            await worker.run()  # returns once a graceful shutdown is complete
            tg.cancel_scope.cancel()  # stop listening for signals
    except ExceptionGroup as group:
        # A worker that could not start (a resource failed to open, say) raises one error
        # of typedq's: report that error itself, as one line, not the task group's wrapper.
        if len(group.exceptions) == 1 and isinstance(group.exceptions[0], TypedqError):
            raise group.exceptions[0] from None
        raise


async def _handle_signals(worker: Worker[Any, Any]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        stopping = False
        async for signum in signals:
            name = signal.Signals(signum).name
            if stopping:
                log.warning(
                    "second %s: cancelling in-flight jobs, handing back what can be handed "
                    "back and abandoning sync handlers' threads",
                    name,
                )
                worker.stop(force=True)
            else:
                log.info("%s: shutting down gracefully (grace %.1fs)", name, worker.grace)
                worker.stop()
                stopping = True


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="typedq", description="typedq: a typed task queue")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser("worker", help="run a worker for every task of an app")
    worker.add_argument("app", help="MODULE:APP, e.g. examples.quickstart:app")
    worker.add_argument("--concurrency", "-c", type=int, default=16, help="jobs run at once")
    worker.add_argument("--queues", "-q", default="", help="comma-separated queues (default: all)")
    worker.add_argument("--grace", type=float, default=10.0, help="shutdown grace, seconds")
    worker.add_argument("--broker", default=None, help="broker URL (default: the app's)")

    stubs = sub.add_parser(
        "stubs",
        help="generate typed producer stubs (or check them with --check)",
        description="Write a module that declares an app's tasks for producers, importing "
        "only the model modules. Without --out, each FILE is regenerated from the command "
        "recorded in its header.",
    )
    stubs.add_argument("targets", nargs="+", metavar="MODULE:APP | FILE")
    stubs.add_argument("--out", "-o", default=None, help="where to write the stub module")
    stubs.add_argument("--task", action="append", default=[], help="only this task (repeatable)")
    stubs.add_argument(
        "--check", action="store_true", help="exit 1 with a diff if the file on disk is stale"
    )

    schema = sub.add_parser("schema", help="print each task's input/output JSON Schema")
    schema.add_argument("app", help="MODULE:APP")
    schema.add_argument("--task", action="append", default=[], help="only this task")

    inspect = sub.add_parser(
        "inspect",
        help="counts, failed jobs, and retry / cancel / purge",
        description="Show counts per state per queue and the jobs of one state (failed by "
        "default); with --retry, --cancel or --purge, act on the given job ids, or on every "
        "job in --state.",
    )
    inspect.add_argument("target", nargs="?", help="MODULE:APP (its name, queues and broker)")
    inspect.add_argument("--broker", default=None, help="broker URL (default: the app's)")
    inspect.add_argument(
        "--app", dest="app_name", default=None, help="app name, without MODULE:APP"
    )
    inspect.add_argument(
        "--queue", "-q", action="append", default=[], help="queue (repeatable; default: the app's)"
    )
    inspect.add_argument(
        "--state", default=None, choices=[s.value for s in JobState], help="jobs to list or act on"
    )
    inspect.add_argument("--limit", type=int, default=20, help="jobs listed per queue")
    actions = inspect.add_mutually_exclusive_group()
    for action in ("retry", "cancel", "purge"):
        actions.add_argument(
            f"--{action}",
            nargs="*",
            default=None,
            metavar="ID",
            help=f"{action} these jobs, or with --state every job in that state",
        )
    inspect.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def _stubs(args: argparse.Namespace) -> int:
    # Each job: (target, out as the header records it, tasks, the file to write or check).
    if args.out is not None:
        if len(args.targets) != 1:
            raise ConfigError("with --out, give exactly one MODULE:APP")
        jobs = [(args.targets[0], args.out, list(args.task), args.out)]
    else:
        if args.task:
            raise ConfigError("--task needs --out (a FILE is regenerated as its header says)")
        jobs = [(*_from_header(path), path) for path in args.targets]
    status = 0
    for target, out, tasks, file in jobs:
        text = stubgen.generate(load_app(target), target=target, out=out, tasks=tasks)
        path = Path(file)
        current = path.read_text() if path.exists() else None
        command = stubgen.command_of(target, out, tasks)
        if args.check:
            if current is None:
                print(f"{file} does not exist; run: {command}")
                status = 1
            elif current != text:
                sys.stdout.write(stubgen.diff(file, current, text))
                print(f"{file} is stale; run: {command}")
                status = 1
            continue
        if current != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(text)
            tmp.replace(path)
            print(f"wrote {file}", file=sys.stderr)
    return status


def _from_header(path: str) -> tuple[str, str, list[str]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror}; to create a stub, give MODULE:APP and --out"
        ) from exc
    words = stubgen.header_command(text)
    if not words:
        raise ConfigError(
            f"{path} has no 'Generated by `typedq stubs ...`' header; give MODULE:APP and --out"
        )
    sub = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    sub.add_argument("target")
    sub.add_argument("--out", default=path)
    sub.add_argument("--task", action="append", default=[])
    try:
        ns, extra = sub.parse_known_args(words)
    except argparse.ArgumentError as exc:
        raise ConfigError(f"{path}: unreadable header command: {exc}") from exc
    if extra:
        raise ConfigError(f"{path}: unreadable header command: unexpected {' '.join(extra)}")
    return ns.target, ns.out, list(ns.task)


def _schema(args: argparse.Namespace) -> int:
    document = schema_of(load_app(args.app), args.task)
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console

    from . import inspector  # imported here: rich loads only for inspect

    if args.target:
        app = load_app(args.target)
        if args.app_name and args.app_name != app.name:
            raise ConfigError(f"--app {args.app_name!r} differs from {args.target}'s {app.name!r}")
        name, settings, queues = app.name, app.settings, args.queue or app.queues
        broker = args.broker or app.client.url
    else:
        if not args.app_name:
            raise ConfigError("give MODULE:APP, or --app NAME with --broker URL")
        name, settings, queues = args.app_name, None, args.queue or ["default"]
        broker = args.broker or os.environ.get(DEFAULT_BROKER_ENV) or ""
        if not broker:
            raise ConfigError(f"give --broker URL (or set {DEFAULT_BROKER_ENV}) with --app")
    chosen = [a for a in inspector.ACTIONS if getattr(args, a) is not None]
    state = JobState(args.state) if args.state else None
    if chosen and not getattr(args, chosen[0]) and state is None:
        raise ConfigError(f"--{chosen[0]} needs job ids, or --state STATE for every job in it")
    if chosen and getattr(args, chosen[0]) and state is not None:
        raise ConfigError(f"--{chosen[0]} takes job ids or --state, not both")
    if broker.startswith("memory:"):
        log.warning("memory:// is this process's own embedded broker: it holds no other jobs")

    out = Console(soft_wrap=False)
    err = Console(stderr=True)

    async def run() -> int:
        client = Client(broker, name=name, settings=settings)
        async with client:
            tool = inspector.Inspector(client, queues)
            if not chosen:
                overview = await tool.overview(state or JobState.FAILED, limit=args.limit)
                if args.json:
                    print(msgspec.json.format(msgspec.json.encode(overview), indent=2).decode())
                else:
                    inspector.render_overview(out, overview)
                return 0
            action = chosen[0]
            if state is None:
                report = await tool.act(action, getattr(args, action))
            else:
                report = await _with_progress(tool, action, state, err, quiet=args.json)
            if args.json:
                print(msgspec.json.format(msgspec.json.encode(report), indent=2).decode())
            else:
                inspector.render_action(out, report)
            return 0 if inspector.all_done(report) else 1

    return anyio.run(run)


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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command == "worker":
        return _exit_past_threads(_worker(args))
    try:
        if args.command == "stubs":
            return _stubs(args)
        elif args.command == "schema":
            return _schema(args)
        elif args.command == "inspect":
            return _inspect(args)
    except TypedqError as exc:
        print(f"typedq: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _worker(args: argparse.Namespace) -> int:
    try:
        app = load_app(args.app)
        if args.broker:
            app.use_broker(args.broker)
        log.info("app %r on %s", app.name, redact_url(app.client.url))
        anyio.run(_run_worker, app, args)
    except TypedqError as exc:
        print(f"typedq: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _exit_past_threads(code: int) -> int:
    """Return ``code``, or end the process with it if handler threads still run.

    A sync handler that never returns keeps its (non-daemon) thread alive, and the
    interpreter would wait for it forever at exit. The worker has already abandoned
    those jobs (they come back by lease expiry), so flush the logs and leave.
    """
    deadline = time.monotonic() + 1.0
    lingering = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        # Idle pool threads are told to stop when the event loop ends: let them.
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            lingering.append(thread)
    if not lingering:
        return code
    log.warning(
        "exiting with %d handler threads still running (they cannot be stopped)", len(lingering)
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
