"""``typedq dashboard``: serve the dashboard of an app with uvicorn.

``typedq dashboard MODULE:APP --port N`` (the app's tasks give payload tables and
re-run forms), or ``typedq dashboard --broker URL --app NAME`` (any app's broker, no
import of its code). ``--host`` defaults to 127.0.0.1; the operator token comes from
``--token`` or ``$TYPEDQ_DASHBOARD_TOKEN`` (without one the dashboard is read-only).
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from ..app import App
from ..broker import redact_url
from ..client import DEFAULT_BROKER_ENV, Client
from ..errors import ConfigError
from .security import SESSION_TTL

__all__ = ["COMMAND", "TOKEN_ENV", "add_parser", "run"]

#: The subcommand this module adds to ``typedq`` (listed in :data:`typedq.cli.PROVIDERS`).
COMMAND = "dashboard"

#: The environment variable holding the operator token.
TOKEN_ENV = "TYPEDQ_DASHBOARD_TOKEN"  # noqa: S105 - a variable name, not a secret

log = logging.getLogger("typedq.dashboard")


def add_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add the ``dashboard`` subcommand to ``sub`` (the CLI's subparsers)."""
    p = sub.add_parser(
        COMMAND,
        parents=parents,
        help="serve the web dashboard (queues, jobs, flows, schedules, workers)",
        description="Serve the web dashboard of an app. Read-only unless a token is given "
        f"(--token or ${TOKEN_ENV}); with one, actions need a login with it.",
    )
    p.add_argument("target", nargs="?", help="MODULE:APP (its name, tasks, queues and broker)")
    p.add_argument("--app", dest="app_name", default=None, help="app name, without MODULE:APP")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default: 8080)")
    p.add_argument(
        "--token",
        default=None,
        help=f"operator token that allows actions (default: ${TOKEN_ENV}; none: read-only)",
    )
    p.add_argument("--queue", "-q", action="append", default=[], help="queue to show (repeatable)")
    p.add_argument(
        "--session-ttl",
        type=float,
        default=SESSION_TTL,
        metavar="SECONDS",
        help=f"how long a login lasts (default: {SESSION_TTL:.0f} s, 8 hours)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; bad arguments raise ConfigError (one line)."""
    from ..cli.common import load_app

    if not 0 < args.port < 65536:
        raise ConfigError(f"--port must be 1 to 65535, got {args.port}")
    if not args.session_ttl > 0:
        raise ConfigError(f"--session-ttl must be > 0 seconds, got {args.session_ttl:g}")
    target: App | Client
    if args.target:
        app = load_app(args.target)
        if args.app_name and args.app_name != app.name:
            raise ConfigError(f"--app {args.app_name!r} differs from {args.target}'s {app.name!r}")
        if args.broker:
            app.use_broker(args.broker)
        target = app
    else:
        if not args.app_name:
            raise ConfigError("give MODULE:APP, or --app NAME with --broker URL")
        broker = args.broker or os.environ.get(DEFAULT_BROKER_ENV) or ""
        if not broker:
            raise ConfigError(f"give --broker URL (or set {DEFAULT_BROKER_ENV}) with --app")
        target = Client(broker, name=args.app_name)
    url = target.client.url if isinstance(target, App) else target.url
    if url.startswith("memory:"):
        log.warning("memory:// is this process's own embedded broker: it holds no other jobs")
    token = args.token or os.environ.get(TOKEN_ENV) or None
    from . import create_app

    dashboard = create_app(target, token=token, queues=args.queue, session_ttl=args.session_ttl)
    import uvicorn

    log.info(
        "dashboard of app %r (%s) on http://%s:%d/ (%s)",
        target.name,
        redact_url(url),
        args.host,
        args.port,
        "actions need the token" if token else "read-only: no token",
    )
    uvicorn.run(dashboard, host=args.host, port=args.port, log_level="warning")
    return 0
