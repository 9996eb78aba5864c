"""The ``typedq`` command line (also ``python -m typedq``).

``typedq worker MODULE:APP`` runs a worker process. SIGTERM or SIGINT start a graceful
shutdown (stop claiming, let in-flight jobs finish within ``--grace``, then cancel and
hand them back); a second signal cancels at once.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

import anyio

from .app import App
from .broker import redact_url
from .errors import ConfigError, TypedqError
from .worker import Worker

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
    async with anyio.create_task_group() as tg:
        tg.start_soon(_handle_signals, worker)
        await worker.run()  # returns once a graceful shutdown is complete
        tg.cancel_scope.cancel()  # stop listening for signals


async def _handle_signals(worker: Worker[Any, Any]) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        stopping = False
        async for signum in signals:
            name = signal.Signals(signum).name
            if stopping:
                log.warning("second %s: cancelling in-flight jobs and handing them back", name)
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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        if args.command == "worker":
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
