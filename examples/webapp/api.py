"""The web tier as a real HTTP service (FastAPI): it enqueues billing jobs through the
generated stubs (``stubs/billing.py``, never the handlers), answers with job ids, serves
their results, and mounts the typedq dashboard under ``/dashboard``.

Run a billing worker and the service against the same Redis::

    typedq worker examples.billing.tasks:app --broker redis://localhost:6379/0 &
    TYPEDQ_DASHBOARD_TOKEN=change-me \\
        python -m examples.webapp.api --broker redis://localhost:6379/0 --port 8000

then ``curl -X POST localhost:8000/invoices -H 'content-type: application/json' -d
'{"customer_id": 1, "invoice_id": 7}'`` gives ``{"job": "..."}``; ``GET /jobs/<id>``
its state and result; the dashboard is at http://localhost:8000/dashboard/. typedq's
errors are answered with HTTP statuses (``examples/webapp/errors.py``): a full queue or
Redis restarting is a 503 with ``Retry-After``, not a bare 500.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import msgspec
import pydantic
from fastapi import FastAPI, HTTPException

from stubs.billing import SendInvoice, StatementRequest, app, render_statement, send_invoice
from typedq import JobFailed, JobState
from typedq.dashboard import create_app

from .errors import install_error_handlers

__all__ = ["InvoiceIn", "JobOut", "JobView", "StatementIn", "create_service", "main"]


class InvoiceIn(pydantic.BaseModel):
    """``POST /invoices``: charge a customer for an invoice."""

    customer_id: int
    invoice_id: int


class StatementIn(pydantic.BaseModel):
    """``POST /statements``: render a monthly statement."""

    customer_id: int
    month: str = pydantic.Field(pattern=r"^\d{4}-\d{2}$")


class JobOut(pydantic.BaseModel):
    """The id of an enqueued job (poll ``GET /jobs/{job}``)."""

    job: str


class JobView(pydantic.BaseModel):
    """A job's state and, once it is final, its result or error."""

    id: str
    task: str
    state: str
    result: Any = None
    error: str | None = None
    #: A declared domain error's data (a declined card), when the job failed with one.
    domain_error: Any = None


def create_service(*, dashboard_token: str | None = None) -> FastAPI:
    """The FastAPI app; its lifespan connects the billing producer (``stubs.billing.app``).

    :param dashboard_token: the dashboard's operator token (None: read-only dashboard)
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncGenerator[None]:
        async with app:
            yield

    service = FastAPI(title="billing web tier", lifespan=lifespan)
    # typedq's errors as statuses (413, 422, 503 with Retry-After, ...), not bare 500s.
    install_error_handlers(service)

    @service.post("/invoices", status_code=202)
    async def post_invoice(body: InvoiceIn) -> JobOut:
        job = await send_invoice.enqueue(SendInvoice(body.customer_id, body.invoice_id))
        return JobOut(job=job.id)

    @service.post("/statements", status_code=202)
    async def post_statement(body: StatementIn) -> JobOut:
        job = await render_statement.enqueue(StatementRequest(body.customer_id, body.month))
        return JobOut(job=job.id)

    @service.get("/jobs/{job_id}")
    async def get_job(job_id: str) -> JobView:
        (record,) = await app.client.broker.get([job_id])
        stub = None if record is None else app.tasks.get(record.message.task)
        if record is None or stub is None:
            raise HTTPException(404, f"no billing job {job_id!r}")
        view = JobView(id=job_id, task=stub.name, state=record.state.value)
        if not record.state.is_final:
            return view
        try:
            result = await stub.job(job_id).result(timeout=0)
        except JobFailed as exc:
            view.error = f"{exc.record.error_type}: {exc.record.message}"
            view.domain_error = None if exc.error is None else msgspec.to_builtins(exc.error)
            return view
        if record.state is JobState.COMPLETED:
            view.result = (
                result.model_dump(mode="json")
                if isinstance(result, pydantic.BaseModel)
                else msgspec.to_builtins(result)
            )
        return view

    service.mount("/dashboard", create_app(app, token=dashboard_token))
    return service


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m examples.webapp.api --broker URL --port N``: serve with uvicorn."""
    import uvicorn

    parser = argparse.ArgumentParser(prog="python -m examples.webapp.api")
    parser.add_argument("--broker", default=None, help="broker URL (default: $TYPEDQ_BROKER)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    if args.broker:
        app.use_broker(args.broker)
    token = os.environ.get("TYPEDQ_DASHBOARD_TOKEN") or None
    uvicorn.run(create_service(dashboard_token=token), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
