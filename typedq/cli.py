"""The ``typedq`` command line (also ``python -m typedq``).

``typedq worker MODULE:APP`` runs a worker process. It connects first: an unreachable
broker is one line and exit status 2, or, with ``--wait-for-broker SECONDS``, retried
with a logged backoff until then. Without a broker (no ``--broker``, no
``$TYPEDQ_BROKER``) it warns that ``memory://`` is private to the process. The first
SIGTERM or SIGINT starts a graceful shutdown (stop claiming, let in-flight jobs finish
within ``--grace``, then cancel and hand them back; sync handlers' threads get at most
one lease more, then are abandoned); the second names the jobs still held and skips
the waits; the third exits at once with status 130 (the jobs come back by lease
expiry). The process exits even when a sync handler's thread never returns: threads
cannot be stopped, so the worker command ends the process with ``os._exit`` once logs
are flushed.

``typedq stubs MODULE:APP --out stubs/NAME.py`` writes typed producer stubs (without
``--out``, or with ``--out -``, it prints them; ``--check`` exits 1 with a diff when the
file is stale; ``typedq stubs [--check] FILE...`` regenerates files from the command in
their header). ``typedq schema MODULE:APP`` prints each task's JSON Schemas. ``typedq
inspect`` shows counts, failed jobs, and retries, cancels or purges jobs (see
:mod:`typedq.inspector`).

``--log-level`` and ``--broker`` go before or after the subcommand. Options without a
flag fall back on ``TYPEDQ_*`` environment variables (see ``typedq --help``): the flag
wins over the variable, the variable over the built-in default.

Every error is one line on stderr and exit status 2; ``--check`` and inspect actions
that left some job untouched exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from . import __version__, stubgen
from .app import App
from .broker import redact_url
from .broker.base import JobState
from .client import DEFAULT_BROKER_ENV, Client
from .errors import BrokerUnavailable, ConfigError, TypedqError
from .schedule import Schedule
from .schema import app_schema as schema_of
from .supervisor import SUPERVISOR_ENV, stop_with_parent, watch_parent, write_metrics_port
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
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise ConfigError(f"cannot import module {module_name!r}: {exc}") from exc
        raise ConfigError(_import_failure(module_name, exc)) from exc
    except TypedqError:
        raise
    except Exception as exc:
        # The module itself is broken: say where, in one line, instead of a traceback.
        raise ConfigError(_import_failure(module_name, exc)) from exc
    app: Any = module
    for part in attribute.split("."):
        app = getattr(app, part, None)
        if app is None:
            raise ConfigError(f"module {module_name!r} has no attribute {attribute!r}")
    if not isinstance(app, App):
        raise ConfigError(f"{target} is a {type(app).__qualname__}, not a typedq.App")
    return app


def _import_failure(module_name: str, exc: BaseException) -> str:
    """``cannot import M: FILE:LINE: Type: message``, FILE:LINE where it was raised.

    The innermost frame of the user's project (under the current directory, outside
    typedq) is the useful one; failing that, the innermost real file.
    """
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_shown_path(exc.filename)}:{exc.lineno}: "
    else:
        frames = [
            f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")
        ]
        here = os.getcwd() + os.sep
        package = str(Path(__file__).resolve().parent) + os.sep
        own = [
            f for f in frames if f.filename.startswith(here) and not f.filename.startswith(package)
        ]
        chosen = own or frames
        frame = chosen[-1] if chosen else None
        if frame is not None:
            where = f"{_shown_path(frame.filename)}:{frame.lineno}: "
    message = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    return f"cannot import {module_name}: {where}{type(exc).__name__}: {message}"


def _shown_path(filename: str) -> str:
    """A path relative to the current directory when it is inside it."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


# -- the worker command ----------------------------------------------------------------


def _worker(args: argparse.Namespace) -> int:
    try:
        app = load_app(args.app)
        if args.broker:
            app.use_broker(args.broker)
        url = app.client.url
        chosen = args.broker or os.environ.get(DEFAULT_BROKER_ENV)
        if url.startswith("memory:") and not chosen:
            log.warning(
                "no broker given: this worker uses memory://, the embedded broker inside "
                "this process, so no other process can enqueue jobs for it. Give "
                "--broker redis://HOST:PORT/DB or set %s (--broker memory:// silences "
                "this warning)",
                DEFAULT_BROKER_ENV,
            )
        if args.processes > 1:
            return _supervise(args, url)
        log.info("app %r on %s", app.name, redact_url(url))
        return anyio.run(_run_worker, app, args)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = _single(exc)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if not isinstance(error, TypedqError):
            raise
        print(f"typedq: error: {error}", file=sys.stderr)
        return 2


def _supervise(args: argparse.Namespace, url: str) -> int:
    """``--processes N``: run N copies of this worker command under a supervisor."""
    from .supervisor import Supervisor, child_command

    if url.startswith("memory:"):
        raise ConfigError(
            "--processes needs a broker the processes share, and memory:// lives inside one "
            "process: give --broker redis://HOST:PORT/DB (or set TYPEDQ_BROKER)"
        )
    command = child_command(
        args.app,
        [
            ("--broker", args.broker),
            ("--concurrency", args.concurrency),
            ("--queues", args.queues or None),
            ("--grace", args.grace),
            ("--wait-for-broker", args.wait_for_broker),
            ("--heartbeat", args.heartbeat),
            ("--log-level", args.log_level),
            ("--log-format", args.log_format),
        ],
    )
    log.info("app %r on %s: %d worker processes", args.app, redact_url(url), args.processes)
    supervisor = Supervisor(
        command,
        args.processes,
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
    )
    return anyio.run(supervisor.run)


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _run_worker(app: App, args: argparse.Namespace) -> int:
    queues = [q for q in args.queues.split(",") if q] if args.queues else None
    worker = app.worker(concurrency=args.concurrency, queues=queues, grace=args.grace)
    worker.heartbeat = args.heartbeat
    server = _serve_metrics(worker, args) if args.metrics_port is not None else None
    try:
        return await _run_until_signalled(app, worker, args)
    finally:
        if server is not None:
            server.shutdown()


def _serve_metrics(worker: Worker[Any, Any], args: argparse.Namespace) -> Any:
    """Serve ``/metrics`` for ``worker`` on ``--metrics-port`` (see :mod:`typedq.metrics`)."""
    try:
        from prometheus_client import CollectorRegistry, ProcessCollector
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'typedq[metrics]'"
        ) from None
    from .metrics import Metrics

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    metrics = Metrics(registry)
    metrics.attach(worker)
    try:
        port, server = metrics.serve(args.metrics_port, args.metrics_addr)
    except OSError as exc:
        raise ConfigError(
            f"cannot serve metrics on {args.metrics_addr}:{args.metrics_port}: {exc.strerror}; "
            "choose another --metrics-port"
        ) from None
    log.info("serving metrics on http://%s:%d/metrics", args.metrics_addr, port)
    write_metrics_port(port)
    return server


async def _run_until_signalled(app: App, worker: Worker[Any, Any], args: argparse.Namespace) -> int:
    signals = _Signals(worker)
    async with anyio.create_task_group() as tg:
        signals.scope = tg.cancel_scope
        tg.start_soon(signals.listen)
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and not stop_with_parent(int(supervisor)):
            tg.start_soon(watch_parent, int(supervisor), lambda: signals.on_signal("orphaned"))
        async with _connected(app.client, args.wait_for_broker):
            # No await between these two lines: a signal handled after this sees a
            # worker whose stop() takes effect (run() sets itself up before awaiting).
            signals.running = True
            await worker.run()  # returns once the shutdown is complete
        tg.cancel_scope.cancel()  # stop listening for signals
    return signals.code


@contextlib.asynccontextmanager
async def _connected(client: Client, wait: float) -> AsyncIterator[None]:
    """Connect ``client``; while the broker is unreachable, retry for ``wait`` seconds
    (one line per try), then give up with one line naming the broker and the fix."""
    deadline = time.monotonic() + wait
    delay = 0.5
    tries = 0
    async with contextlib.AsyncExitStack() as stack:
        while True:
            tries += 1
            try:
                await stack.enter_async_context(client)
                break
            except BrokerUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnavailable(_unreachable(client.url, exc, wait, tries)) from None
                pause = min(delay, left)
                log.warning(
                    "try %d: %s; retrying in %.1fs (--wait-for-broker: %.0fs left)",
                    tries,
                    str(exc).rstrip("."),
                    pause,
                    left,
                )
                await anyio.sleep(pause)
                delay = min(delay * 2, 5.0)
        if tries > 1:
            log.info("reached the broker %s on try %d", redact_url(client.url), tries)
        yield


def _unreachable(url: str, exc: BrokerUnavailable, wait: float, tries: int) -> str:
    if wait > 0:
        waited = f"gave up after {tries} tries in {wait:g}s: "
        fix = "start it, check the URL (--broker or $TYPEDQ_BROKER), or wait longer"
    else:
        waited = ""
        fix = (
            "start it, check the URL (--broker or $TYPEDQ_BROKER), or pass "
            "--wait-for-broker SECONDS to wait for it"
        )
    return f"cannot reach the broker {redact_url(url)}: {waited}{str(exc).rstrip('.')}; {fix}"


class _Signals:
    """SIGTERM/SIGINT for ``typedq worker``: the first stops gracefully, the second
    skips the grace, the third exits at once (the jobs come back by lease expiry)."""

    def __init__(self, worker: Worker[Any, Any]) -> None:
        self.worker = worker
        self.scope: anyio.CancelScope | None = None
        #: True once worker.run() has been entered; before that a signal just exits.
        self.running = False
        self.count = 0
        self.code = 0

    async def listen(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.on_signal(signal.Signals(signum).name)

    def on_signal(self, name: str) -> None:
        self.count += 1
        worker = self.worker
        if not self.running:
            log.warning("%s: stopped before the worker started (nothing was claimed)", name)
            self.code = 130
            assert self.scope is not None
            self.scope.cancel()
        elif self.count == 1:
            log.info(
                "%s: shutting down gracefully: no new claims; %d running jobs have up to "
                "%.1fs (--grace) to finish. A second signal skips the grace",
                name,
                len(worker.in_flight()),
                worker.grace,
            )
            worker.stop()
        elif self.count == 2:
            jobs = worker.in_flight()
            if jobs:
                log.warning(
                    "second %s: skipping the grace; cancelling and handing back %d jobs "
                    "still running: %s (a sync handler's thread cannot be stopped: its "
                    "job comes back when its lease expires). A third signal exits at once",
                    name,
                    len(jobs),
                    _jobs_text(jobs),
                )
            else:
                log.warning("second %s: skipping the grace; no jobs left to wait for", name)
            worker.stop(force=True)
        else:
            jobs = worker.in_flight()
            log.warning(
                "third %s: exiting now (status 130)%s",
                name,
                f"; {len(jobs)} unsettled jobs come back when their leases expire "
                f"(within {worker.lease:g}s): {_jobs_text(jobs)}"
                if jobs
                else "",
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)


def _jobs_text(jobs: list[tuple[str, str]], most: int = 10) -> str:
    shown = ", ".join(f"{job_id} ({task})" for job_id, task in jobs[:most])
    return shown if len(jobs) <= most else f"{shown} and {len(jobs) - most} more"


# -- options ----------------------------------------------------------------------------

#: Options that fall back on an environment variable: dest -> (variable, parse, default).
#: Precedence: the flag, then the variable, then the default.
_ENV_DEFAULTS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "log_level": ("TYPEDQ_LOG_LEVEL", str, "INFO"),
    "concurrency": ("TYPEDQ_CONCURRENCY", int, 16),
    "queues": ("TYPEDQ_QUEUES", str, ""),
    "grace": ("TYPEDQ_GRACE", float, 10.0),
    "wait_for_broker": ("TYPEDQ_WAIT_FOR_BROKER", float, 0.0),
    "log_format": ("TYPEDQ_LOG_FORMAT", str, "text"),
    "heartbeat": ("TYPEDQ_HEARTBEAT", float, 10.0),
    "processes": ("TYPEDQ_PROCESSES", int, 1),
}


def _env_help(dest: str, text: str) -> str:
    variable, _, default = _ENV_DEFAULTS[dest]
    shown = default if default != "" else "all"
    return f"{text} (default: {shown}; env {variable})"


def _apply_env_defaults(args: argparse.Namespace) -> None:
    for dest, (variable, parse, default) in _ENV_DEFAULTS.items():
        if getattr(args, dest, default) is not None:
            continue
        raw = os.environ.get(variable, "")
        if not raw:
            setattr(args, dest, default)
            continue
        try:
            setattr(args, dest, parse(raw))
        except ValueError:
            kind = "an integer" if parse is int else "a number"
            raise ConfigError(
                f"{variable}={raw!r} is not {kind}; fix or unset it (or give the flag)"
            ) from None
    if args.broker and args.command not in ("worker", "inspect"):
        raise ConfigError(f"--broker is for worker and inspect, not {args.command}")
    if args.log_format not in ("text", "json"):
        raise ConfigError(f"log format {args.log_format!r} is not text or json")
    if getattr(args, "processes", 1) < 1:
        raise ConfigError(f"--processes must be >= 1, got {args.processes}")
    if getattr(args, "heartbeat", 1.0) <= 0:
        raise ConfigError(f"--heartbeat must be > 0 seconds, got {args.heartbeat}")
    level = args.log_level
    if logging.getLevelNamesMapping().get(level.upper()) is None:
        source = (
            "--log-level" if os.environ.get("TYPEDQ_LOG_LEVEL") != level else ("TYPEDQ_LOG_LEVEL")
        )
        raise ConfigError(
            f"{source} {level!r} is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )


_EPILOG = f"""\
environment variables (used when the matching flag is not given; a flag wins over the
variable, the variable over the built-in default):
  {DEFAULT_BROKER_ENV}            broker URL for an app that names none (else memory://)
  TYPEDQ_LOG_LEVEL         --log-level
  TYPEDQ_CONCURRENCY       worker --concurrency
  TYPEDQ_QUEUES            worker --queues
  TYPEDQ_GRACE             worker --grace
  TYPEDQ_WAIT_FOR_BROKER   worker --wait-for-broker
  TYPEDQ_LOG_FORMAT        --log-format
  TYPEDQ_HEARTBEAT         worker --heartbeat
  TYPEDQ_PROCESSES         worker --processes
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="typedq",
        description="typedq: a typed task queue",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"typedq {__version__}")
    log_help = _env_help("log_level", "logging level: DEBUG, INFO, WARNING, ERROR")
    broker_help = (
        f"broker URL, e.g. redis://HOST:PORT/DB (default: the app's; env {DEFAULT_BROKER_ENV})"
    )
    format_help = _env_help("log_format", "log line format: text, or json (one object per line)")
    parser.add_argument("--log-level", default=None, help=log_help)
    parser.add_argument("--log-format", default=None, choices=["text", "json"], help=format_help)
    parser.add_argument("--broker", default=None, help=broker_help + "; worker and inspect")
    # The same options after the subcommand; SUPPRESS keeps a value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--log-level", default=argparse.SUPPRESS, help=log_help)
    common.add_argument(
        "--log-format", default=argparse.SUPPRESS, choices=["text", "json"], help=format_help
    )
    with_broker = argparse.ArgumentParser(add_help=False)
    with_broker.add_argument("--broker", default=argparse.SUPPRESS, help=broker_help)
    sub = parser.add_subparsers(dest="command", required=True)

    worker = sub.add_parser(
        "worker",
        help="run a worker for every task of an app",
        parents=[common, with_broker],
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    worker.add_argument("app", help="MODULE:APP, e.g. examples.quickstart:app")
    worker.add_argument(
        "--concurrency",
        "-c",
        type=int,
        default=None,
        help=_env_help("concurrency", "jobs run at once"),
    )
    worker.add_argument(
        "--queues", "-q", default=None, help=_env_help("queues", "comma-separated queues")
    )
    worker.add_argument(
        "--grace", type=float, default=None, help=_env_help("grace", "shutdown grace, seconds")
    )
    worker.add_argument(
        "--wait-for-broker",
        type=float,
        default=None,
        metavar="SECONDS",
        help=_env_help("wait_for_broker", "at start, retry an unreachable broker for this long"),
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://ADDR:PORT/metrics (0: a free port; "
        "needs typedq[metrics])",
    )
    worker.add_argument(
        "--metrics-addr",
        default="0.0.0.0",  # noqa: S104 - a scraper runs elsewhere
        metavar="ADDR",
        help="address the metrics server listens on (default: 0.0.0.0)",
    )
    worker.add_argument(
        "--heartbeat",
        type=float,
        default=None,
        metavar="SECONDS",
        help=_env_help(
            "heartbeat", "seconds between worker-registry heartbeats (expiry: 3 missed)"
        ),
    )

    worker.add_argument(
        "--processes",
        "-p",
        type=int,
        default=None,
        metavar="N",
        help=_env_help(
            "processes",
            "worker processes, each with --concurrency slots, supervised by this one "
            "(signals passed on, crashed ones restarted)",
        ),
    )

    stubs = sub.add_parser(
        "stubs",
        parents=[common],
        help="generate typed producer stubs (or check them with --check)",
        description="Write a module that declares an app's tasks for producers, importing "
        "only the model modules. MODULE:APP without --out (or with --out -) prints it; "
        "each FILE is regenerated from the command recorded in its header.",
    )
    stubs.add_argument("targets", nargs="+", metavar="MODULE:APP | FILE")
    stubs.add_argument(
        "--out", "-o", default=None, help="where to write the stub module (- for stdout)"
    )
    stubs.add_argument("--task", action="append", default=[], help="only this task (repeatable)")
    stubs.add_argument(
        "--check", action="store_true", help="exit 1 with a diff if the file on disk is stale"
    )

    schema = sub.add_parser(
        "schema", help="print each task's input/output JSON Schema", parents=[common]
    )
    schema.add_argument("app", help="MODULE:APP")
    schema.add_argument("--task", action="append", default=[], help="only this task")

    inspect = sub.add_parser(
        "inspect",
        parents=[common, with_broker],
        help="counts, failed jobs, and retry / cancel / purge",
        description="Show counts per state per queue and the jobs of one state (failed by "
        "default); with --retry, --cancel or --purge, act on the given job ids, or on every "
        "job in --state.",
    )
    inspect.add_argument("target", nargs="?", help="MODULE:APP (its name, queues and broker)")
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
    inspect.add_argument(
        "--flow",
        default=None,
        metavar="ID",
        help="show the workflow of job ID (the flow's job, a step or a member)",
    )
    inspect.add_argument(
        "--job", default=None, metavar="ID", help="show one job in full (payload, result, error)"
    )
    inspect.add_argument(
        "--workers", action="store_true", help="list the live workers (the worker registry)"
    )
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
    to_stdout = args.out == "-" or (
        args.out is None and len(args.targets) == 1 and _is_target(args.targets[0])
    )
    if to_stdout:
        if args.check:
            raise ConfigError("--check compares a file: give --out FILE, or the FILE itself")
        target = args.targets[0]
        if len(args.targets) != 1 or not _is_target(target):
            raise ConfigError("to print a stub, give exactly one MODULE:APP")
        tasks = list(args.task)
        sys.stdout.write(stubgen.generate(load_app(target), target=target, out="-", tasks=tasks))
        return 0
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
        # A stub once printed to stdout records `--out -`: regenerate it where it lives.
        command = f"typedq stubs {file}" if out == "-" else stubgen.command_of(target, out, tasks)
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


def _is_target(word: str) -> bool:
    """MODULE:APP rather than a stub FILE (which has no colon, or exists on disk)."""
    return ":" in word and not Path(word).exists()


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
    if args.limit < 0:
        raise ConfigError(f"--limit must be >= 0, got {args.limit}")
    views = [
        flag
        for flag, on in (("--job", args.job), ("--workers", args.workers), ("--flow", args.flow))
        if on
    ]
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
                if args.json:
                    print(msgspec.json.format(msgspec.json.encode(flow), indent=2).decode())
                else:
                    inspector.render_flow(out, flow)
                return 0
            if args.job:
                detail = await tool.job(args.job)
                if detail is None:
                    raise ConfigError(f"no job {args.job!r} in app {name!r} (finished jobs "
                                      "expire by the app's retention)")  # fmt: skip
                if args.json:
                    print(msgspec.json.format(msgspec.json.encode(detail), indent=2).decode())
                else:
                    inspector.render_job(out, detail)
                return 0
            if args.workers:
                workers = await tool.workers()
                if args.json:
                    print(msgspec.json.format(msgspec.json.encode(workers), indent=2).decode())
                else:
                    inspector.render_workers(out, name, workers)
                return 0
            if not chosen:
                overview = await tool.overview(state or JobState.FAILED, limit=args.limit)
                if args.json:
                    print(msgspec.json.format(msgspec.json.encode(overview), indent=2).decode())
                else:
                    inspector.render_overview(out, overview, limit=args.limit)
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


async def _discover_queues(client: Client) -> list[str]:
    """Every queue the broker's queue registry knows (``default`` when it knows none)."""
    try:
        found = await client.broker.list_queues()
    except NotImplementedError:
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        _apply_env_defaults(args)
    except ConfigError as exc:
        print(f"typedq: error: {exc}", file=sys.stderr)
        return 2
    _configure_logging(args.log_level.upper(), args.log_format)
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


def _configure_logging(level: str, style: str) -> None:
    """The root logger's handler: text lines, or one JSON object per line."""
    if style == "json":
        from .logs import JsonFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
