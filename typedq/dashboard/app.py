"""The dashboard's ASGI app: Starlette routes rendering Jinja2 templates.

:func:`create_app` builds it for an App (or a Client of its broker). Mount it under a
prefix in a FastAPI or Starlette service (``service.mount("/dashboard", dash)``): links
follow the mount's ``root_path``. The service must connect the App (``async with app``
in its lifespan); run on its own (``typedq dashboard``), the dashboard connects it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import msgspec
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..app import App
from ..broker import redact_url
from ..broker.base import JobState
from ..client import Client
from ..errors import TypedqError
from ..inspector import ACTIONS
from ..producer import Producer
from .chart import throughput_svg
from .forms import form_fields, parse_form
from .security import COOKIE, Guard
from .source import Source

__all__ = ["create_app"]

Handler = Callable[[Request], Awaitable[Response]]

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


def _when(epoch: float) -> str:
    if not epoch:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(epoch))


def _ago(seconds: float) -> str:
    if seconds <= 0:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def _json(value: Any) -> str:
    return msgspec.json.format(msgspec.json.encode(value), indent=2).decode()


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("typedq.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.filters["json"] = _json
    env.filters["q"] = lambda s: quote(str(s), safe=":")
    env.globals["STATES"] = list(JobState)
    env.globals["chart"] = throughput_svg
    return env


class Dashboard:
    """The request handlers of one dashboard (see :func:`create_app`)."""

    def __init__(self, source: Source, guard: Guard, title: str) -> None:
        self.source = source
        self.guard = guard
        self.title = title
        self.env = _environment()

    # -- rendering -------------------------------------------------------------------

    def render(
        self, request: Request, template: str, status: int = 200, **context: Any
    ) -> Response:
        session = self.guard.session(request.cookies.get(COOKIE))
        base = request.scope.get("root_path", "")
        html = self.env.get_template(template).render(
            base=base,
            app_name=self.source.name,
            title=self.title,
            broker=redact_url(self.source.client.url),
            read_only=self.guard.read_only,
            can_act=session is not None,
            csrf=self.guard.csrf(session) if session else "",
            notice=request.query_params.get("done", ""),
            partial=request.headers.get("x-partial") == "1",
            here=request.url.path,
            **context,
        )
        return HTMLResponse(html, status_code=status, headers={"cache-control": "no-store"})

    def problem(self, request: Request, status: int, message: str) -> Response:
        return self.render(
            request, "problem.html", status, message=message, heading=_REASON[status]
        )

    def guarded(self, handler: Handler) -> Handler:
        """Wrap a page handler: a broker or input problem is one message, never a trace."""

        async def page(request: Request) -> Response:
            if not self.source.client.connected:
                return self.problem(
                    request,
                    503,
                    "the dashboard's app is not connected: enter `async with app` in the "
                    "service's lifespan (typedq dashboard does it for you)",
                )
            try:
                return await handler(request)
            except TypedqError as exc:
                return self.problem(request, 400, str(exc))

        return page

    def action(self, handler: Handler) -> Handler:
        """Wrap an action: 403 unless logged in with the token and the form's CSRF token
        matches the session's."""

        async def act(request: Request) -> Response:
            form = await request.form()
            csrf = form.get("csrf")
            if not self.guard.allows(
                request.cookies.get(COOKIE), csrf if isinstance(csrf, str) else None
            ):
                return self.problem(
                    request,
                    403,
                    "this dashboard is read-only (no token configured)"
                    if self.guard.read_only
                    else "log in with the dashboard token, and act from the dashboard's own pages",
                )
            request.state.form = form
            return await handler(request)

        return self.guarded(act)

    def back(self, request: Request, path: str, done: str) -> Response:
        base = request.scope.get("root_path", "")
        return RedirectResponse(f"{base}{path}?{urlencode({'done': done})}", status_code=303)

    # -- pages -----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        rows = await self.source.overview()
        return self.render(request, "overview.html", rows=rows, refresh=5)

    async def queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        params = request.query_params
        try:
            state = JobState(params.get("state", "waiting"))
            offset = max(0, int(params.get("offset", "0")))
        except ValueError:
            return self.problem(request, 400, "state must be a job state and offset a number")
        task = params.get("task", "")
        page = await self.source.queue_page(queue, state, offset=offset, task=task)
        (stats,) = await self.source.client.broker.queue_stats([queue])
        tasks = sorted(t.name for t in self.source.tasks.values() if t.queue == queue)
        return self.render(
            request,
            "queue.html",
            page=page,
            stats=stats,
            tasks=tasks,
            refresh=5,
            purgeable=[s for s in JobState if stats.counts.get(s, 0)],
        )

    async def job(self, request: Request, *, status: int = 200, problem: str = "") -> Response:
        job_id = request.path_params["job_id"]
        page = await self.source.job(job_id)
        if page is None:
            return self.problem(
                request, 404, f"no job {job_id!r} (finished jobs expire by the app's retention)"
            )
        fields = form_fields(page.schema, page.payload)
        record = page.record
        timeline = [(record.enqueued_at, "enqueued")]
        timeline += [
            (a.failed_at, f"attempt {a.attempt} failed: {a.error_type}") for a in page.attempts
        ]
        if record.run_at:
            timeline.append((record.run_at, "due"))
        if record.started_at:
            timeline.append((record.started_at, f"attempt {record.attempt} started"))
        if record.finished_at:
            timeline.append((record.finished_at, record.state.value))
        timeline.sort(key=lambda item: item[0])
        return self.render(
            request,
            "job.html",
            status,
            page=page,
            record=record,
            fields=fields,
            timeline=timeline,
            problem=problem,
            refresh=0 if record.state.is_final else 2,
            retryable=record.state in ACTIONS["retry"],
            cancellable=record.state in ACTIONS["cancel"],
            rerunnable=page.schema is not None,
        )

    async def flows(self, request: Request) -> Response:
        wanted = request.query_params.get("id", "").strip()
        if wanted:
            base = request.scope.get("root_path", "")
            return RedirectResponse(f"{base}/flows/{quote(wanted, safe=':')}", status_code=303)
        return self.render(request, "flows.html", flow=None, asked="")

    async def flow(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        flow = await self.source.flow(job_id)
        if flow is None:
            return self.render(request, "flows.html", 404, flow=None, asked=job_id)
        return self.render(
            request, "flows.html", flow=flow, asked=job_id, refresh=5 if flow.running else 0
        )

    async def schedules(self, request: Request) -> Response:
        views = await self.source.schedule_views()
        return self.render(request, "schedules.html", schedules=views)

    async def workers(self, request: Request) -> Response:
        workers = await self.source.workers()
        return self.render(request, "workers.html", workers=workers, now=time.time(), refresh=5)

    async def login_page(self, request: Request) -> Response:
        if self.guard.read_only:
            return self.problem(request, 404, "this dashboard is read-only: it has no login")
        return self.render(
            request, "login.html", next=request.query_params.get("next", ""), failed=False
        )

    async def login(self, request: Request) -> Response:
        if self.guard.read_only:
            return self.problem(request, 403, "this dashboard is read-only (no token configured)")
        form = await request.form()
        token, target = _field(form, "token"), _field(form, "next")
        if not self.guard.check_token(token):
            return self.render(request, "login.html", 403, next=target, failed=True)
        base = request.scope.get("root_path", "")
        # Only a path of this dashboard: never an open redirect.
        if not (target.startswith(f"{base}/") and not target.startswith("//")):
            target = f"{base}/"
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            self.guard.new_session(),
            httponly=True,
            samesite="strict",
            path=f"{base}/",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        if self.guard.read_only:
            return self.problem(request, 403, "this dashboard is read-only (no token configured)")
        base = request.scope.get("root_path", "")
        response = RedirectResponse(f"{base}/", status_code=303)
        response.delete_cookie(COOKIE, path=f"{base}/")
        return response

    # -- actions -----------------------------------------------------------------------

    async def retry(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        report = await self.source.inspector(await self.source.queues()).act("retry", [job_id])
        return self.back(
            request, f"/jobs/{quote(job_id, safe=':')}", f"retry: {report.outcomes[job_id]}"
        )

    async def cancel(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        report = await self.source.inspector(await self.source.queues()).act("cancel", [job_id])
        return self.back(
            request, f"/jobs/{quote(job_id, safe=':')}", f"cancel: {report.outcomes[job_id]}"
        )

    async def purge(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        try:
            state = JobState(_field(request.state.form, "state"))
        except ValueError:
            return self.problem(request, 400, "choose the state whose jobs to purge")
        report = await self.source.inspector([queue]).act_on_state("purge", state)
        return self.back(
            request, f"/queues/{quote(queue, safe=':')}", f"purged {report.done} {state.value} jobs"
        )

    async def rerun(self, request: Request) -> Response:
        job_id = request.path_params["job_id"]
        page = await self.source.job(job_id)
        if page is None:
            return self.problem(request, 404, f"no job {job_id!r}")
        task = self.source.tasks.get(page.record.message.task)
        if task is None:
            return self.problem(
                request, 400, f"task {page.record.message.task!r} is not in this app"
            )
        fields = form_fields(page.schema, page.payload)
        try:
            data = parse_form(
                fields, {k: v for k, v in request.state.form.items() if isinstance(v, str)}
            )
            value = task.input.decode(msgspec.msgpack.encode(data))
        except (ValueError, TypedqError) as exc:
            return await self.job(request, status=400, problem=f"not re-run: {exc}")
        job = await task.enqueue(value)
        return self.back(request, f"/jobs/{quote(job.id, safe=':')}", f"re-run of {job_id}")


_REASON = {400: "Bad request", 403: "Forbidden", 404: "Not found", 503: "Not connected"}


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


def create_app(
    target: App | Producer | Client,
    *,
    token: str | None = None,
    queues: list[str] | None = None,
    title: str | None = None,
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
    """
    source = Source(target, queues=queues or ())
    board = Dashboard(source, Guard(token), title or f"typedq: {source.name}")
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
        Route("/schedules", g(board.schedules)),
        Route("/workers", g(board.workers)),
        Route("/login", board.login_page),
        Route("/login", board.login, methods=["POST"]),
        Route("/logout", board.logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    return app
