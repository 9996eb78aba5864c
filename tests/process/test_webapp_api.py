"""``examples/webapp/api.py``, the web tier as a FastAPI service: it enqueues through
the generated stubs, answers with job ids, serves results and errors, and mounts the
dashboard. In-process (httpx's ASGI transport, the embedded broker shared with a
billing worker) and as real processes on Redis (uvicorn, ``typedq worker``)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import anyio
import httpx
import msgspec
import pytest

from tests.redis_harness import RedisProcess, flushall, free_port
from tests.support import ROOT, TEST_DEADLINE, spawn_worker, stop_workers
from typedq import App, BrokerUnavailable
from typedq.broker.base import BrokerSettings
from typedq.broker.memory import MemoryBroker


async def poll(http: httpx.AsyncClient, job: str) -> dict[str, Any]:
    while True:
        r = await http.get(f"/jobs/{job}")
        assert r.status_code == 200
        view: dict[str, Any] = r.json()
        if view["state"] in ("completed", "failed", "cancelled"):
            return view
        await anyio.sleep(0.05)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_service_enqueues_serves_results_and_mounts_the_dashboard() -> None:
    import stubs.billing as stub
    from examples.billing.tasks import app
    from examples.webapp.api import create_service

    broker = MemoryBroker(BrokerSettings(namespace="billing"))
    app.use_broker(broker)
    stub.app.use_broker(broker)
    service = create_service(dashboard_token=None)
    transport = httpx.ASGITransport(app=service)
    try:
        with anyio.fail_after(TEST_DEADLINE):
            async with (
                service.router.lifespan_context(service),
                app,
                app.worker(concurrency=4),
                httpx.AsyncClient(transport=transport, base_url="http://svc") as http,
            ):
                r = await http.post("/invoices", json={"customer_id": 1, "invoice_id": 7})
                assert r.status_code == 202
                ok = r.json()["job"]
                view = await poll(http, ok)
                assert view["state"] == "completed"
                assert view["result"] == {"receipt_id": "R-1-7", "total_cents": 1007}

                r = await http.post("/invoices", json={"customer_id": 13, "invoice_id": 8})
                declined = await poll(http, r.json()["job"])
                assert declined["state"] == "failed"
                assert declined["domain_error"] == {
                    "customer_id": 13,
                    "decline_code": "insufficient_funds",
                }
                r = await http.post("/statements", json={"customer_id": 1, "month": "2024-05"})
                statement = await poll(http, r.json()["job"])
                assert statement["result"]["lines"] == 11

                assert (await http.get("/jobs/no-such-job")).status_code == 404
                bad = await http.post("/invoices", json={"customer_id": "x"})
                assert bad.status_code == 422

                page = await http.get("/dashboard/")
                assert page.status_code == 200
                assert 'href="/dashboard/queues/billing"' in page.text
                page = await http.get(f"/dashboard/jobs/{ok}")
                assert "customer_id" in page.text  # the payload, by the stub's schema
                assert "R-1-7" in page.text
    finally:
        app.use_broker("memory://")
        stub.app.use_broker("memory://")


class Note(msgspec.Struct, frozen=True):
    text: str


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_typedq_errors_are_http_statuses_not_bare_500s() -> None:
    """Issue 29: PayloadTooLarge through FastAPI was a bare 500. With the recipe
    (examples/webapp/errors.py) each error a request can meet has its status."""
    from fastapi import FastAPI

    from examples.webapp.errors import RETRY_AFTER, install_error_handlers

    broker = MemoryBroker(BrokerSettings(namespace="notes", max_queue_length=1))
    app = App("notes", broker=broker, max_payload_bytes=64)

    @app.task
    async def note(x: Note) -> None:
        return None

    service = FastAPI()
    install_error_handlers(service)

    @service.post("/notes", status_code=202)
    async def post_note(text: str, job_id: str | None = None, delay: float = 0) -> dict[str, str]:
        job = await note.enqueue(Note(text), job_id=job_id, delay=delay)
        return {"job": job.id}

    @service.get("/notes/{job_id}")
    async def get_note(job_id: str) -> dict[str, str]:
        return {"status": (await note.job(job_id).status()).value}

    @service.get("/down")
    async def down() -> None:
        raise BrokerUnavailable("Redis at 10.0.0.7:6379 is unreachable (get): Error 111")

    @service.get("/slow/{job_id}")
    async def slow(job_id: str) -> None:
        await note.job(job_id).result(timeout=0)

    transport = httpx.ASGITransport(app=service, raise_app_exceptions=False)
    with anyio.fail_after(TEST_DEADLINE):
        async with app, httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
            big = await http.post("/notes", params={"text": "x" * 100})
            assert big.status_code == 413
            assert big.json()["error"] == "PayloadTooLarge"
            assert "over the limit of 64 bytes" in big.json()["detail"]

            bad = await http.post("/notes", params={"text": "a", "job_id": "no spaces"})
            assert (bad.status_code, bad.json()["error"]) == (422, "InvalidName")
            bad = await http.post("/notes", params={"text": "a", "delay": "inf"})
            assert (bad.status_code, bad.json()["error"]) == (422, "InvalidOption")

            ok = await http.post("/notes", params={"text": "a"})
            assert ok.status_code == 202
            full = await http.post("/notes", params={"text": "b"})  # max_queue_length=1
            assert full.status_code == 503
            assert full.headers["retry-after"] == str(RETRY_AFTER)
            assert full.json()["error"] == "QueueFull"

            gone = await http.get("/down")
            assert gone.status_code == 503
            assert gone.headers["retry-after"] == str(RETRY_AFTER)
            # A 5xx does not tell clients the broker's address.
            assert "10.0.0.7" not in gone.text

            missing = await http.get("/notes/nope")
            assert (missing.status_code, missing.json()["error"]) == (404, "JobNotFound")
            late = await http.get(f"/slow/{ok.json()['job']}")
            assert (late.status_code, late.json()["error"]) == (504, "ResultTimeout")


@pytest.mark.redis
def test_service_and_worker_processes_on_redis(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    port = free_port()
    service = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "examples.webapp.api",
            "--broker",
            redis_server.url,
            "--port",
            str(port),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TYPEDQ_DASHBOARD_TOKEN": "t"},
    )
    worker = spawn_worker("examples.billing.tasks:app", redis_server.url, concurrency=4)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + TEST_DEADLINE
        while True:
            try:
                r = httpx.post(base + "/invoices", json={"customer_id": 1, "invoice_id": 7})
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the service did not start"
                assert service.poll() is None, "the service exited"
                time.sleep(0.1)
        assert r.status_code == 202
        job = r.json()["job"]
        while (view := httpx.get(f"{base}/jobs/{job}").json())["state"] != "completed":
            assert time.monotonic() < deadline, view
            time.sleep(0.05)
        assert view["result"]["receipt_id"] == "R-1-7"
        page = httpx.get(f"{base}/dashboard/jobs/{job}")
        assert page.status_code == 200
        assert "Log in to act" in page.text  # a token is configured
        assert httpx.post(f"{base}/dashboard/jobs/{job}/retry").status_code == 403
    finally:
        stop_workers([worker, service])


def test_the_service_never_imports_the_handlers() -> None:
    code = (
        "import sys, examples.webapp.api\n"
        "print([m for m in ('examples.billing.tasks', 'examples.billing.payments') "
        "if m in sys.modules])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
