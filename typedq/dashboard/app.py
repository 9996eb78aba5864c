"""The dashboard's ASGI app: Starlette routes to the handlers of :mod:`.pages`.

:func:`create_app` builds it for an App (or a Producer, or a Client of its broker).
Mount it under a prefix in a FastAPI or Starlette service (``service.mount("/dashboard",
dash)``): links follow the mount's ``root_path``. The service must connect the App
(``async with app`` in its lifespan); run on its own (``typedq dashboard``), the
dashboard connects it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from importlib import resources

from starlette.applications import Starlette
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import App
from ..client import Client
from ..producer import Producer
from .pages import Dashboard
from .security import SESSION_TTL, Guard
from .source import Source

__all__ = ["create_app"]

_HEADERS = [
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


class _SecurityHeaders:
    """Adds the headers above to every response (no framing, no foreign scripts)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, send_with)


def create_app(
    target: App | Producer | Client,
    *,
    token: str | None = None,
    queues: list[str] | None = None,
    title: str | None = None,
    session_ttl: float = SESSION_TTL,
    clock: Callable[[], float] = time.time,
) -> Starlette:
    """The dashboard of ``target``'s app as an ASGI app.

    :param target: the App (its tasks' input schemas give payload tables and re-run
        forms), a :class:`~typedq.Producer` of it (a service that enqueues through
        generated stubs: the same, from the stubs' models), or a :class:`~typedq.Client`
        of its broker (``--broker URL --app NAME``: payloads as plain data, no re-run)
    :param token: the operator token; without one the dashboard is read-only (no action
        offered, every POST answers 403)
    :param queues: the queues to show besides those the broker's registry knows
    :param title: the page title (default: ``typedq: <app name>``)
    :param session_ttl: seconds a login's session lasts (default 8 hours)
    :param clock: the wall clock sessions and the login limit read (tests: a FakeClock)
    """
    source = Source(target, queues=queues or ())
    guard = Guard(token, session_ttl=session_ttl, clock=clock)
    board = Dashboard(source, guard, title or f"typedq: {source.name}")
    g, a = board.guarded, board.action

    @contextlib.asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # Run on its own, the dashboard connects the app; mounted, the service does.
        if source.client.connected:
            yield
            return
        async with source.client:
            yield

    static = resources.files("typedq.dashboard").joinpath("static")
    routes = [
        Route("/", g(board.overview)),
        Route("/queues/{queue}", g(board.queue)),
        Route("/queues/{queue}/purge", a(board.purge), methods=["POST"]),
        Route("/jobs/{job_id}", g(board.job)),
        Route("/jobs/{job_id}/retry", a(board.retry), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", a(board.cancel), methods=["POST"]),
        Route("/jobs/{job_id}/rerun", a(board.rerun), methods=["POST"]),
        Route("/flows", g(board.flows)),
        Route("/flows/{job_id}", g(board.flow)),
        Route("/runs", g(board.runs)),
        Route("/runs/{run_id}", g(board.run)),
        Route("/runs/{run_id}/cancel", a(board.cancel_run), methods=["POST"]),
        Route("/runs/{run_id}/signal", a(board.signal_run), methods=["POST"]),
        Route("/api/runs/{run_id}", board.run_json),
        Route("/schedules", g(board.schedules)),
        Route("/workers", g(board.workers)),
        Route("/bulk", g(board.bulk)),
        Route("/bulk/count", g(board.bulk_count)),
        Route("/bulk", a(board.bulk_apply), methods=["POST"]),
        Route("/login", board.login_page),
        Route("/login", board.login, methods=["POST"]),
        Route("/logout", board.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    return app
