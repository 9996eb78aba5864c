"""The ``typedq`` command line (also ``python -m typedq``).

This module holds the parser, the options and ``main``; ``typedq worker MODULE:APP``
(a worker process: connecting, signals, shutdown) is :mod:`typedq.cli.worker`, ``typedq
inspect`` is :mod:`typedq.cli.inspect` (its tables :mod:`typedq.cli.render`), ``typedq
stubs`` is :mod:`typedq.cli.stubs`, and loading ``MODULE:APP`` is :mod:`typedq.cli.common`. ``typedq dashboard`` is the dashboard's own
(:mod:`typedq.dashboard.cli`), found through :data:`PROVIDERS`.

``typedq stubs MODULE:APP --out stubs/NAME.py`` writes typed producer stubs (without
``--out``, or with ``--out -``, it prints them; ``--check`` exits 1 with a diff when the
file is stale; ``typedq stubs [--check] FILE...`` regenerates files from the command in
their header). ``typedq schema MODULE:APP`` prints each task's JSON Schemas. ``typedq
inspect`` shows counts, failed jobs, and retries, cancels or purges jobs (see
:mod:`typedq.inspector`). ``typedq verify MODULE:APP`` checks the app's models against
the schemas the broker still holds (:mod:`typedq.cli.verify`, docs/deploys.md).
``typedq jobs`` finds jobs by filter and retries, cancels or
removes every match (:mod:`typedq.cli.jobs`, :mod:`typedq.bulk`). ``typedq migrate``
brings a PostgreSQL broker's schema to this release (:mod:`typedq.cli.migrate`).

``--log-level`` and ``--broker`` go before or after the subcommand. Options without a
flag fall back on ``TYPEDQ_*`` environment variables (see ``typedq --help``): the flag
wins over the variable, the variable over the built-in default.

Every error is one line on stderr and exit status 2; ``--check``, inspect actions
that left some job untouched and ``verify`` finding an incompatible schema exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from .. import __version__
from ..broker.base import JobState
from ..client import DEFAULT_BROKER_ENV
from ..errors import ConfigError, TypedqError
from ..schema import app_schema as schema_of
from .common import load_app
from .inspect import inspect_command
from .jobs import add_jobs_parser, jobs_command
from .migrate import add_migrate_parser, migrate_command
from .stubs import stubs_command
from .verify import verify_command
from .worker import exit_past_threads, worker_command

__all__ = ["PROVIDERS", "load_app", "main"]

#: Modules that add a subcommand of their own, imported when the parser is built (so
#: this package imports none of them, and they may import :mod:`typedq.cli.common`).
#: Each has ``COMMAND`` (the subcommand's name), ``add_parser(subparsers, parents)``,
#: which adds it, and ``run(args) -> int``, which runs it (a :class:`TypedqError` is one
#: line and exit status 2, as for the built-in subcommands).
PROVIDERS: tuple[str, ...] = ("typedq.dashboard.cli",)


def _providers() -> dict[str, ModuleType]:
    """The subcommand providers by command name, in :data:`PROVIDERS` order."""
    found = {}
    for name in PROVIDERS:
        module = importlib.import_module(name)
        found[module.COMMAND] = module
    return found


# -- options ----------------------------------------------------------------------------


def seconds(raw: str) -> float:
    """A number of seconds >= 0, or ``forever`` (also ``inf``): infinity."""
    if raw.strip().lower() == "forever":
        return math.inf
    value = float(raw)
    if not value >= 0:  # also NaN
        raise ValueError(raw)
    return value


#: Options that fall back on an environment variable: dest -> (variable, parse, default).
#: Precedence: the flag, then the variable, then the default.
_ENV_DEFAULTS: dict[str, tuple[str, Callable[[str], Any], Any]] = {
    "log_level": ("TYPEDQ_LOG_LEVEL", str, "INFO"),
    "concurrency": ("TYPEDQ_CONCURRENCY", int, 16),
    "prefetch": ("TYPEDQ_PREFETCH", int, 0),
    "queues": ("TYPEDQ_QUEUES", str, ""),
    "grace": ("TYPEDQ_GRACE", float, 10.0),
    # Forever: a worker that starts during an outage waits like a running one rides it
    # out (see docs/workers.md: under systemd or Kubernetes, exiting would only trade
    # the wait for restart backoff, or a unit given up after its start limit).
    "wait_for_broker": ("TYPEDQ_WAIT_FOR_BROKER", seconds, math.inf),
    "log_format": ("TYPEDQ_LOG_FORMAT", str, "text"),
    "heartbeat": ("TYPEDQ_HEARTBEAT", float, 10.0),
    "processes": ("TYPEDQ_PROCESSES", int, 1),
}


def _env_help(dest: str, text: str) -> str:
    variable, _, default = _ENV_DEFAULTS[dest]
    shown = "forever" if default == math.inf else default if default != "" else "all"
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
            kind = {int: "an integer", seconds: "a number of seconds >= 0 or forever"}.get(
                parse, "a number"
            )
            raise ConfigError(
                f"{variable}={raw!r} is not {kind}; fix or unset it (or give the flag)"
            ) from None
    if args.broker and args.command not in (
        "worker",
        "inspect",
        "jobs",
        "dashboard",
        "verify",
        "migrate",
    ):
        raise ConfigError(
            f"--broker is for worker, inspect, jobs, verify, migrate and dashboard, not "
            f"{args.command}"
        )
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
  TYPEDQ_PREFETCH          worker --prefetch
  TYPEDQ_QUEUES            worker --queues
  TYPEDQ_GRACE             worker --grace
  TYPEDQ_WAIT_FOR_BROKER   worker --wait-for-broker
  TYPEDQ_LOG_FORMAT        --log-format
  TYPEDQ_HEARTBEAT         worker --heartbeat
  TYPEDQ_PROCESSES         worker --processes
"""


def _parser(providers: dict[str, ModuleType]) -> argparse.ArgumentParser:
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
        "--prefetch",
        type=int,
        default=None,
        help=_env_help(
            "prefetch",
            "jobs held beyond --concurrency: claimed ahead, or recorded while the next "
            "runs (for short jobs; a prefetched job waits behind running ones)",
        ),
    )
    worker.add_argument(
        "--queues", "-q", default=None, help=_env_help("queues", "comma-separated queues")
    )
    worker.add_argument(
        "--allow-unknown-queue",
        action="store_true",
        help="take jobs from --queues that no task of the app uses (else refused: a typo)",
    )
    worker.add_argument(
        "--grace", type=float, default=None, help=_env_help("grace", "shutdown grace, seconds")
    )
    worker.add_argument(
        "--wait-for-broker",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help=_env_help(
            "wait_for_broker",
            "at start, wait this long for an unreachable broker (0: exit at once with "
            "status 75; forever: as long as it takes)",
        ),
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on http://HOST:PORT/metrics (0: a free port; "
        "needs typedq[metrics])",
    )
    worker.add_argument(
        "--metrics-host",
        "--metrics-addr",  # its first name, kept working
        dest="metrics_host",
        default="127.0.0.1",
        metavar="HOST",
        help="address the metrics server listens on (default: 127.0.0.1, this machine "
        "only, like the dashboard; 0.0.0.0 for a scraper elsewhere)",
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
    inspect.add_argument("--limit", type=int, default=20, help="jobs listed per queue (0 to 1000)")
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
    inspect.add_argument(
        "--run",
        default=None,
        metavar="ID",
        help="show a durable run: its state, input and timeline (steps, sleeps, signals...)",
    )
    for flag, kind, what in (
        ("--fair", "fair", "the fair keys with jobs waiting (jobs per key, weight, level)"),
        ("--debounced", "debounce", "the debounce keys and the jobs collecting them"),
        ("--unique", "unique", "the unique keys held, their jobs and when windows end"),
        ("--streams", "stream", "the job streams (emits=) and the entries each keeps"),
    ):
        inspect.add_argument(
            flag,
            dest=f"flow_{kind}",
            default=None,
            metavar="QUEUE",
            help=f"list {what} in QUEUE (--limit per page)",
        )
    inspect.add_argument(
        "--cursor",
        default=None,
        help="with --fair, --debounced, --unique or --streams: the next page (the cursor a "
        "page printed)",
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

    verify = sub.add_parser(
        "verify",
        parents=[common, with_broker],
        help="check an app's models against the schemas the broker still holds",
        description="Compare the app's task models with every input schema fingerprint in "
        "the broker: the schema registry (what producers and workers recorded) and the jobs "
        "not completed yet (counted by the broker, exactly; a bounded sample scan on a broker "
        "that cannot). Exit 0 compatible, 1 incompatible, 2 could not check.",
    )
    verify.add_argument("app", help="MODULE:APP, the release to check")
    verify.add_argument(
        "--against",
        default=None,
        metavar="STUBS",
        help="a producer stub module (stubs/x.py or stubs.x[:NAME]): check its models too",
    )
    verify.add_argument(
        "--sample",
        type=int,
        default=10_000,
        metavar="N",
        help="read at most N durable runs, and N jobs where the broker cannot count jobs "
        "itself (default 10000; past it counts are lower bounds)",
    )
    verify.add_argument(
        "--forget",
        action="append",
        default=[],
        metavar="TASK:FINGERPRINT",
        help="first delete this schema from the registry (no producer of it runs any more; "
        "repeatable)",
    )
    verify.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_jobs_parser(sub, [common, with_broker])
    add_migrate_parser(sub, [common, with_broker])
    for provider in providers.values():
        provider.add_parser(sub, [common, with_broker])
    return parser


def _schema(args: argparse.Namespace) -> int:
    document = schema_of(load_app(args.app), args.task)
    print(json.dumps(document, indent=2, sort_keys=True))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    providers = _providers()
    args = _parser(providers).parse_args(argv)
    try:
        _apply_env_defaults(args)
    except ConfigError as exc:
        print(f"typedq: error: {exc}", file=sys.stderr)
        return 2
    _configure_logging(args.log_level.upper(), args.log_format)
    if args.command == "worker":
        return exit_past_threads(worker_command(args))
    try:
        if args.command == "stubs":
            return stubs_command(args)
        elif args.command == "schema":
            return _schema(args)
        elif args.command == "inspect":
            return inspect_command(args)
        elif args.command == "verify":
            return verify_command(args)
        elif args.command == "jobs":
            return jobs_command(args)
        elif args.command == "migrate":
            return migrate_command(args)
        elif args.command in providers:
            return int(providers[args.command].run(args))
    except TypedqError as exc:
        print(f"typedq: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


def _configure_logging(level: str, style: str) -> None:
    """The root logger's handler: text lines, or one JSON object per line."""
    if style == "json":
        from ..logs import JsonFormatter

        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logging.basicConfig(level=level, handlers=[handler])
    else:
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
