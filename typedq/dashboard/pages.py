"""The dashboard's pages and actions: request handlers rendering Jinja2 templates.

:class:`Dashboard` holds the :class:`~typedq.dashboard.source.Source` it reads and the
:class:`~typedq.dashboard.security.Guard` that decides who may act; :func:`create_app`
(``typedq.dashboard.app``) routes requests to it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
import msgspec
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from ..broker import redact_url
from ..broker.base import JobState
from ..bulk import BULK_ACTIONS, BulkQuery, JobFilter, describe_filter, parse_since
from ..durable.types import Signal, known_signals
from ..errors import ConfigError, TypedqError
from ..inspector import ACTIONS, RUN_ENTRY_LABELS, RunView, run_detail, run_waiting
from ..schema import model_schema
from .chart import throughput_svg
from .forms import form_fields, parse_form
from .security import COOKIE, Guard
from .source import Source

__all__ = ["Dashboard", "Handler"]

#: A request handler.
Handler = Callable[[Request], Awaitable[Response]]


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
        sep = "&" if "?" in path else "?"
        return RedirectResponse(f"{base}{path}{sep}{urlencode({'done': done})}", status_code=303)

    # -- pages -----------------------------------------------------------------------

    async def overview(self, request: Request) -> Response:
        rows = await self.source.overview()
        return self.render(request, "overview.html", rows=rows, refresh=5)

    async def queue(self, request: Request) -> Response:
        queue = request.path_params["queue"]
        params = request.query_params
        try:
            state = JobState(params.get("state", "waiting"))
            at = max(0, int(params.get("at", "0")))
        except ValueError:
            return self.problem(request, 400, "state must be a job state and at a number")
        task = params.get("task", "")
        cursor = params.get("cursor") or None
        try:
            page = await self.source.queue_page(queue, state, cursor=cursor, at=at, task=task)
        except ValueError:
            return self.problem(request, 400, "cursor must be one the previous page linked to")
        (stats,) = await self.source.client.broker.queue_stats([queue])
        tasks = sorted(t.name for t in self.source.tasks.values() if t.queue == queue)
        flow = await self.source.flow_sections(queue)
        return self.render(
            request,
            "queue.html",
            page=page,
            stats=stats,
            flow=flow,
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
        try:
            start = max(0, int(request.query_params.get("start", "0")))
        except ValueError:
            return self.problem(request, 400, "start must be a member number")
        flow = await self.source.flow(job_id, start=start)
        if flow is None:
            return self.render(request, "flows.html", 404, flow=None, asked=job_id)
        return self.render(
            request, "flows.html", flow=flow, asked=job_id, refresh=5 if flow.running else 0
        )

    async def runs(self, request: Request) -> Response:
        wanted = request.query_params.get("id", "").strip()
        if wanted:
            base = request.scope.get("root_path", "")
            return RedirectResponse(f"{base}/runs/{quote(wanted, safe=':')}", status_code=303)
        return self.render(request, "run.html", run=None, asked="")

    async def run(self, request: Request, *, status: int = 200, problem: str = "") -> Response:
        run_id = request.path_params["run_id"]
        view = await self.source.run(run_id)
        if view is None:
            return self.render(request, "run.html", 404, run=None, asked=run_id)
        running = not view.state.is_final
        signals = _signal_forms(view) if running else []
        # A page with signal forms for an operator does not refresh itself: a refresh
        # would wipe a half-filled form (the action's redirect shows the new state).
        acting = signals and self.guard.session(request.cookies.get(COOKIE)) is not None
        return self.render(
            request,
            "run.html",
            status,
            run=view,
            asked=run_id,
            problem=problem,
            waiting=run_waiting(view, _when),
            rows=[
                (e, RUN_ENTRY_LABELS.get(e.kind, e.kind), run_detail(e, _when))
                for e in view.entries
            ],
            signals=signals,
            refresh=2 if running and not acting else 0,
        )

    async def run_json(self, request: Request) -> Response:
        """``GET /api/runs/{run_id}``: the run as JSON (:class:`~typedq.inspector.RunView`,
        what ``typedq inspect --run ID --json`` prints); 404 with ``{"error": ...}``."""
        run_id = request.path_params["run_id"]
        if not self.source.client.connected:
            return _json_response({"error": "the dashboard's app is not connected"}, 503)
        try:
            view = await self.source.run(run_id)
        except TypedqError as exc:
            return _json_response({"error": str(exc)}, 400)
        if view is None:
            return _json_response({"error": f"no durable run {run_id!r}"}, 404)
        return _json_response(view, 200)

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
        client = request.client.host if request.client else ""
        wait = self.guard.login_wait(client)
        if wait > 0:
            response = self.problem(
                request, 429, f"too many failed logins: try again in {math.ceil(wait)} s"
            )
            response.headers["Retry-After"] = str(math.ceil(wait))
            return response
        form = await request.form()
        token, target = _field(form, "token"), _field(form, "next")
        if not self.guard.check_token(token):
            self.guard.login_failed(client)
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
        # Revoked here, not only forgotten by the browser: a copy of the cookie is dead.
        self.guard.revoke(request.cookies.get(COOKIE))
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

    async def cancel_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        tool = self.source.inspector(self.source.declared_queues or ["default"])
        cancelled = await tool.cancel_run(run_id)
        done = "run cancelled" if cancelled else "cancel: the run had already ended"
        return self.back(request, f"/runs/{quote(run_id, safe=':')}", done)

    async def signal_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        form = request.state.form
        name = _field(form, "signal")
        signal = known_signals().get(name)
        if signal is None:
            return await self.run(
                request,
                status=400,
                problem=f"no signal {name!r} is defined in the dashboard's process: it sends "
                "only signals whose model it knows (run it on the app's MODULE:APP)",
            )
        fields = form_fields(model_schema(signal.codec), None)
        try:
            data = parse_form(fields, {k: v for k, v in form.items() if isinstance(v, str)})
            payload = signal.codec.encode(signal.codec.decode(msgspec.msgpack.encode(data)))
        except (ValueError, TypedqError) as exc:
            return await self.run(request, status=400, problem=f"not sent: {exc}")
        tool = self.source.inspector(self.source.declared_queues or ["default"])
        outcome = await tool.signal_run(run_id, signal.name, payload)
        return self.back(
            request, f"/runs/{quote(run_id, safe=':')}", f"signal {name}: {outcome.value}"
        )

    # -- bulk actions by filter (typedq.bulk; ``typedq jobs`` on the command line) ------

    async def _bulk_query(self, fields: Mapping[str, str]) -> BulkQuery:
        """The BulkQuery of a bulk form's fields (ConfigError: one line on a bad one)."""
        return BulkQuery(
            self.source.client,
            await self.source.queues(),
            _bulk_filter(fields),
            tasks=self.source.tasks,
        )

    async def bulk(self, request: Request) -> Response:
        """The bulk page: the filter form; once asked, the count, the first matches and
        (logged in) the action form, which sends the count back to be confirmed."""
        fields = _bulk_fields(request.query_params)
        preview = None
        problem = ""
        if request.query_params.get("go"):
            try:
                preview = await (await self._bulk_query(fields)).preview(limit=BULK_SHOWN)
            except ConfigError as exc:
                problem = str(exc)
        state = None if preview is None else preview.filter.state
        return self.render(
            request,
            "bulk.html",
            400 if problem else 200,
            form=fields,
            tasks=sorted(self.source.tasks),
            preview=preview,
            problem=problem,
            described=describe_filter(preview.filter) if preview is not None else "",
            actions=[a for a, states in BULK_ACTIONS.items() if state in states],
        )

    async def bulk_count(self, request: Request) -> Response:
        """``GET /bulk/count?state=&task=&error_type=&since=&where=``: how many jobs the
        filter matches now, as JSON (``{"count": N, "examined": M}``; 400 with
        ``{"error": ...}`` for a bad filter)."""
        try:
            query = await self._bulk_query(_bulk_fields(request.query_params))
            preview = await query.preview(limit=0)
        except ConfigError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        return JSONResponse(
            {"count": preview.total, "examined": preview.examined, "queues": preview.queues},
            headers={"cache-control": "no-store"},
        )

    async def bulk_apply(self, request: Request) -> Response:
        """Apply an action to every job the posted filter matches, once the posted
        ``expected`` count equals the count now (else 409: look again first)."""
        form = request.state.form
        fields = _bulk_fields(form)
        action = _field(form, "action")
        try:
            expected = int(_field(form, "expected"))
        except ValueError:
            return self.problem(request, 400, "expected must be the count the page showed")
        if action not in BULK_ACTIONS:
            return self.problem(request, 400, "action must be retry, cancel or remove")
        try:
            query = await self._bulk_query(fields)
            now = await query.count()
            if now != expected:
                return self.problem(
                    request,
                    409,
                    f"the filter matches {now} jobs now, not the {expected} you confirmed: "
                    "look at them again before acting",
                )
            report = await query.apply(action)
        except ConfigError as exc:
            return self.problem(request, 400, str(exc))
        done = f"{action}: {report.done} of {report.matched} matching jobs"
        return self.back(request, f"/bulk?{urlencode({**fields, 'go': '1'})}", done)

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


_REASON = {
    400: "Bad request",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    429: "Too many requests",
    503: "Not connected",
}


def _signal_forms(view: RunView) -> list[tuple[Signal[Any], list[Any]]]:
    """The signals a running run can be sent from its page, each with its form's fields:
    every signal the process defines, the one the run waits for first."""
    signals = list(known_signals().values())
    signals.sort(key=lambda s: (s.name != view.wait_signal, s.name))
    return [(s, form_fields(model_schema(s.codec), None)) for s in signals]


def _json_response(value: Any, status: int) -> Response:
    return Response(
        msgspec.json.encode(value),
        status_code=status,
        media_type="application/json",
        headers={"cache-control": "no-store"},
    )


def _field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


#: Matching jobs the bulk page lists (the count covers them all).
BULK_SHOWN = 20
_BULK_FIELDS = ("state", "task", "error_type", "since", "where")


def _bulk_fields(params: Mapping[str, Any]) -> dict[str, str]:
    """The bulk form's fields (strings; absent: ''), the state ``failed`` by default."""
    out = {}
    for name in _BULK_FIELDS:
        value = params.get(name)
        out[name] = value.strip() if isinstance(value, str) else ""
    out["state"] = out["state"] or JobState.FAILED.value
    return out


def _bulk_filter(fields: Mapping[str, str]) -> JobFilter:
    """A JobFilter from the bulk form's fields (``where``: one condition a line)."""
    try:
        state = JobState(fields["state"])
    except ValueError:
        raise ConfigError(f"state {fields['state']!r} is not a job state") from None
    return JobFilter(
        state=state,
        task=fields["task"] or None,
        error_type=fields["error_type"] or None,
        since=parse_since(fields["since"]) if fields["since"] else None,
        where=tuple(line.strip() for line in fields["where"].splitlines() if line.strip()),
    )
