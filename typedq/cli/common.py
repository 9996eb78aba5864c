"""Loading ``MODULE:APP`` for the ``typedq`` commands (:mod:`typedq.cli`,
:mod:`typedq.cli.worker`, :mod:`typedq.cli.inspect`, :mod:`typedq.dashboard.cli`): an
import that fails is one line naming the file and line where the error was raised, never
a traceback.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from ..app import App
from ..errors import ConfigError, TypedqError

__all__ = ["load_app"]


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
        package = str(Path(__file__).resolve().parent.parent) + os.sep  # typedq/
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


def metrics_module() -> ModuleType:
    """:mod:`typedq.metrics`, or one line saying that ``--metrics-port`` needs the extra."""
    try:
        import prometheus_client  # type: ignore[import-not-found, unused-ignore]  # noqa: F401
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus-client: pip install 'typedq[metrics]'"
        ) from None
    from .. import metrics

    return metrics
