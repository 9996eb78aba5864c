"""The web dashboard: queues, jobs, flows, schedules and workers in a browser.

``create_app(app, token=...)`` is an ASGI app (Starlette, server-rendered Jinja2 pages)
that a FastAPI or Starlette service mounts under a prefix; ``typedq dashboard
MODULE:app`` serves it on its own. Read-only unless a token is configured. Needs the
``dashboard`` extra: ``pip install 'typedq[dashboard]'``. See docs/dashboard.md.
"""

from __future__ import annotations

from ..errors import ConfigError

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by an install without the extra
    raise ConfigError(f"the dashboard needs {exc.name}: pip install 'typedq[dashboard]'") from None

from .app import create_app as create_app

__all__ = ["create_app"]
