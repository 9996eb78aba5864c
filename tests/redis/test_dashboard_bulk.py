"""The dashboard's bulk actions by filter over HTTP (httpx's ASGI transport), on the
embedded broker and on a real redis-server: the page and its count, the JSON count
endpoint, and the action behind the token, the session's CSRF and the confirmed
count (typedq.bulk; ``typedq jobs`` on the command line)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.dash_app import Charge, app, charge
from tests.redis_harness import RedisProcess, flushall
from typedq import JobFailed, JobState
from typedq.dashboard import create_app

pytestmark = [pytest.mark.anyio, pytest.mark.asyncio_only]

TOKEN = "s3cret-token"  # noqa: S105 - a test token


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def dash_broker(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    server: RedisProcess = request.getfixturevalue("redis_server")
    flushall(server.port)
    return server.url


@pytest.fixture
async def failed(dash_broker: str, tmp_path: Path) -> AsyncIterator[list[str]]:
    """Six failed charges (orders 1 to 6: their tickets do not exist)."""
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            jobs = [
                await charge.enqueue(Charge(order=n, ticket=str(tmp_path / f"t{n}")))
                for n in range(1, 7)
            ]
            async with app.worker(concurrency=4, queues=["billing"]):
                for job in jobs:
                    with pytest.raises(JobFailed):
                        await job.result(timeout=10)
            yield [job.id for job in jobs]


def client(token: str | None = None) -> httpx.AsyncClient:
    dash = create_app(app, token=token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=dash), base_url="http://dash")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


async def test_the_bulk_page_and_count_read_only(failed: list[str]) -> None:
    async with client() as http:
        r = await http.get("/bulk")
        assert r.status_code == 200
        assert "matching jobs" not in r.text  # nothing asked yet
        r = await http.get("/bulk", params={"go": "1", "task": "charge"})
        assert r.status_code == 200
        assert "6 matching jobs" in r.text
        assert "failed jobs, of task charge" in r.text
        assert all(job_id in r.text for job_id in failed)
        assert '<form method="post" action="/bulk"' not in r.text  # read-only: no action

        r = await http.get("/bulk/count", params={"task": "charge", "where": "order=3"})
        assert r.status_code == 200
        assert r.json()["count"] == 1
        assert r.headers["cache-control"] == "no-store"
        r = await http.get("/bulk/count", params={"error_type": "RuntimeError", "since": "1h"})
        assert r.json()["count"] == 6
        r = await http.get("/bulk/count", params={"state": "waiting"})
        assert r.json()["count"] == 0

        r = await http.get("/bulk/count", params={"task": "charge", "where": "nope=1"})
        assert r.status_code == 400
        assert "has no field 'nope'; its fields: order, ticket, note, express" in r.json()["error"]
        r = await http.get("/bulk", params={"go": "1", "where": "order=1"})
        assert r.status_code == 400
        assert "--where needs exactly one --task" in r.text
        r = await http.get("/bulk/count", params={"since": "soon"})
        assert r.status_code == 400
        assert "is not a duration" in r.json()["error"]

        form = {"state": "failed", "action": "retry", "expected": "6", "csrf": "0" * 64}
        assert (await http.post("/bulk", data=form)).status_code == 403
        counts = await app.client.broker.counts("billing")
        assert counts[JobState.FAILED] == 6


async def test_the_bulk_action_needs_the_session_and_the_confirmed_count(
    failed: list[str],
) -> None:
    async with client(TOKEN) as http:
        r = await http.post("/login", data={"token": TOKEN, "next": "/"})
        assert r.status_code == 303
        page = await http.get("/bulk", params={"go": "1", "task": "charge", "where": "order=3"})
        assert "1 matching jobs" in page.text
        assert "Apply to 1 jobs" in page.text
        assert '<option value="retry">' in page.text
        assert '<option value="cancel">' not in page.text  # not for failed jobs
        csrf = csrf_of(page.text)
        form = {"state": "failed", "task": "charge", "where": "order=3", "action": "retry"}

        # Without the session's CSRF token: refused.
        assert (await http.post("/bulk", data={**form, "expected": "1"})).status_code == 403
        # A count that is not the count now: refused, nothing changed.
        r = await http.post("/bulk", data={**form, "expected": "2", "csrf": csrf})
        assert r.status_code == 409
        assert "the filter matches 1 jobs now, not the 2 you confirmed" in r.text
        assert await charge.job(failed[2]).status() is JobState.FAILED
        bad = await http.post("/bulk", data={**form, "expected": "x", "csrf": csrf})
        assert bad.status_code == 400
        bad = await http.post(
            "/bulk", data={**form, "action": "purge", "expected": "1", "csrf": csrf}
        )
        assert bad.status_code == 400

        r = await http.post("/bulk", data={**form, "expected": "1", "csrf": csrf})
        assert r.status_code == 303
        done = await http.get(r.headers["location"])
        assert "retry: 1 of 1 matching jobs" in done.text
        assert await charge.job(failed[2]).status() is JobState.WAITING

        # Every other failed charge, by error type: removed.
        rest = {"state": "failed", "error_type": "RuntimeError", "action": "remove"}
        r = await http.post("/bulk", data={**rest, "expected": "5", "csrf": csrf})
        assert r.status_code == 303
        assert "remove: 5 of 5 matching jobs" in (await http.get(r.headers["location"])).text
        counts = await app.client.broker.counts("billing")
        assert (counts[JobState.FAILED], counts[JobState.WAITING]) == (0, 1)
