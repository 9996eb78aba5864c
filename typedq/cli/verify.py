"""``typedq verify MODULE:APP``: may this release deploy against what the broker holds
(the parser is in :mod:`typedq.cli`; the checks in :mod:`typedq.verify`, the table in
:mod:`typedq.cli.render`).

Exit status: 0 every schema compatible, 1 some incompatible, 2 it could not check
(the broker unreachable or without a schema registry, a fingerprint jobs carry with no
recorded schema, a schema the rules cannot compare). It connects without recording the
app's own schemas: the release being checked is not deployed yet.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec

from ..client import Client
from ..errors import ConfigError, TypedqError, Unsupported
from ..producer import Producer
from .common import load_app

__all__ = ["load_stubs", "verify_command"]


def verify_command(args: argparse.Namespace) -> int:
    """``typedq verify``: check, print the table (or ``--json``); the exit status."""
    from rich.console import Console

    from .. import verify
    from . import render

    app = load_app(args.app)
    against = load_stubs(args.against) if args.against else None
    if args.sample < 1:
        raise ConfigError(f"--sample must be at least 1, got {args.sample}")
    forget = [_fingerprint_key(raw) for raw in args.forget]
    url = args.broker or app.client.url
    if url.startswith("memory:"):
        raise ConfigError(
            "memory:// is this process's own embedded broker: it holds no other process's "
            "jobs or schemas; give --broker redis://HOST:PORT/DB"
        )

    async def run() -> verify.Report:
        # A bare client: connecting records nothing (the app's own schemas are not live).
        client = Client(url, name=app.name, settings=app.settings)
        async with client:
            if forget:
                await client.broker.forget_schemas(forget)
            return await verify.verify(app, client.broker, against=against, sample=args.sample)

    try:
        report = anyio.run(run)
    except Unsupported as exc:
        raise ConfigError(f"cannot verify on this broker: {exc}") from None
    if args.json:
        document: dict[str, Any] = msgspec.to_builtins(report)
        document["exit_code"] = report.exit_code
        print(msgspec.json.format(msgspec.json.encode(document), indent=2).decode())
    else:
        render.render_verify(Console(soft_wrap=False), report, sample=args.sample)
    return report.exit_code


def _fingerprint_key(raw: str) -> tuple[str, str]:
    task, sep, fingerprint = raw.rpartition(":")
    if not sep or not task or not fingerprint:
        raise ConfigError(f"--forget takes TASK:FINGERPRINT (as the table shows), got {raw!r}")
    return task, fingerprint


def load_stubs(target: str) -> Producer:
    """The Producer of a stub module (``typedq stubs`` writes them): a file
    (``stubs/orders.py``) or a module (``stubs.orders``), ``:ATTR`` to pick one of
    several Producers."""
    where, _, attribute = target.partition(":") if not os.path.exists(target) else (target, "", "")
    try:
        module = _import(where)
    except TypedqError:
        raise
    except Exception as exc:
        raise ConfigError(f"cannot import the stubs {where}: {type(exc).__name__}: {exc}") from exc
    if attribute:
        found: Any = getattr(module, attribute, None)
        if not isinstance(found, Producer):
            raise ConfigError(f"{target} is not a typedq.Producer")
        return found
    producers = [v for v in vars(module).values() if isinstance(v, Producer)]
    if len(producers) != 1:
        raise ConfigError(
            f"the stubs {where} hold {len(producers)} typedq.Producer objects; name one as "
            f"{where}:NAME"
        )
    return producers[0]


def _import(where: str) -> Any:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: the current project is importable
    path = Path(where)
    if where.endswith(".py") or path.exists():
        if not path.is_file():
            raise ConfigError(f"no stub file {where}")
        name = f"_typedq_stubs_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"cannot import the stub file {where}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise ConfigError(f"cannot import the stubs module {where!r}: {exc}") from exc
