"""The web dashboard: queues, jobs, flows, schedules and workers in a browser.

``create_app(app, token=...)`` is an ASGI app (Starlette, server-rendered Jinja2 pages)
that a FastAPI or Starlette service mounts under a prefix; ``typedq dashboard
MODULE:app`` serves it on its own. Read-only unless a token is configured. Needs the
``dashboard`` extra: ``pip install 'typedq[dashboard]'``. See docs/dashboard.md.

The web framework is imported on first use of :func:`create_app`, so the CLI can offer
the command (and say which extra is missing) without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .app import create_app as create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    if name != "create_app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        from .app import create_app
    except ImportError as exc:
        package = (exc.name or "").partition(".")[0]
        if package not in _EXTRA:
            raise
        raise ConfigError(
            f"the dashboard needs {package}, which is not installed: "
            "pip install 'typedq[dashboard]'"
        ) from None
    return create_app


#: The packages of the ``dashboard`` extra that the dashboard imports.
_EXTRA = {"starlette", "jinja2", "multipart", "python_multipart", "uvicorn"}
