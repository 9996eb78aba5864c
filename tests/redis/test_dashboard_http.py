"""The dashboard over HTTP (httpx's ASGI transport, in-process), on the embedded broker
and on a real redis-server: every page, and every action with its guard (token login,
CSRF), including the 403s."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from tests.dash_app import Charge, Report, app, charge, report, summary, total
from tests.redis_harness import RedisProcess, flushall
from typedq import JobFailed, JobState
from typedq.dashboard import create_app
from typedq.dashboard.security import COOKIE
from typedq.testing import FakeClock

pytestmark = [pytest.mark.anyio, pytest.mark.asyncio_only]

TOKEN = "s3cret-token"  # noqa: S105 - a test token


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def dash_broker(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory://"
    server: RedisProcess = request.getfixturevalue("redis_server")
    flushall(server.port)
    return server.url


class Jobs:
    """The jobs the tests look at, in several states."""

    failed: str
    completed: str
    waiting: str
    scheduled: str
    flow: str


@pytest.fixture
async def jobs(dash_broker: str, tmp_path: Path) -> AsyncIterator[Jobs]:
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            out = Jobs()
            bad = await charge.enqueue(Charge(order=7, ticket=str(tmp_path / "ticket")))
            good = await report.enqueue(Report(n=1))
            chain = await report.then(total).enqueue(Report(n=2))
            async with app.worker(concurrency=4, queues=["billing", "reports"]):
                with pytest.raises(JobFailed):
                    await bad.result(timeout=10)
                await good.result(timeout=10)
                await chain.result(timeout=10)
            out.failed, out.completed, out.flow = bad.id, good.id, chain.id
            out.waiting = (await charge.enqueue(Charge(order=8, ticket="none"))).id
            out.scheduled = (await report.enqueue(Report(n=3), delay=3600)).id
            yield out


def client(token: str | None = None) -> httpx.AsyncClient:
    dash = create_app(app, token=token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=dash), base_url="http://dash")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


async def log_in(http: httpx.AsyncClient) -> None:
    r = await http.post("/login", data={"token": TOKEN, "next": "/"})
    assert r.status_code == 303
    assert "httponly" in r.headers["set-cookie"].lower()
    assert "samesite=strict" in r.headers["set-cookie"].lower()


async def test_every_page_renders_read_only(jobs: Jobs) -> None:
    async with client() as http:
        r = await http.get("/")
        assert r.status_code == 200
        html = r.text
        assert html.count("<h1>") == 1
        for queue in ("billing", "reports"):
            assert f'href="/queues/{queue}"' in html
        assert "<svg" in html
        assert "queue billing: 0 completed and 1 failed in the last hour" in html
        assert "queue reports: 3 completed and 0 failed in the last hour" in html
        assert r.headers["x-frame-options"] == "DENY"
        assert "default-src 'self'" in r.headers["content-security-policy"]
        # No action anywhere, no login either: a read-only dashboard.
        assert '<form method="post"' not in html
        assert "read-only" in html

        r = await http.get("/queues/billing", params={"state": "failed"})
        assert r.status_code == 200
        assert jobs.failed in r.text
        r = await http.get("/queues/billing", params={"state": "waiting", "task": "charge"})
        assert jobs.waiting in r.text

        r = await http.get(f"/jobs/{jobs.failed}")
        assert r.status_code == 200
        page = r.text
        assert "card declined for order 7" in page
        assert "Traceback (most recent call last)" in page
        assert "Attempt 1: error" in page
        assert "Attempt 2: error" in page  # every attempt's record, not only the last
        assert "ticket" in page
        assert "order" in page
        assert "Retry" not in page
        assert "Re-run" not in page

        r = await http.get(f"/jobs/{jobs.completed}")
        assert "&#34;n&#34;: 2" in r.text  # the result, as JSON
        r = await http.get(f"/jobs/{jobs.scheduled}")
        assert "due" in r.text

        r = await http.get(f"/jobs/{jobs.flow}")
        assert f'href="/flows/{jobs.flow}"' in r.text
        r = await http.get(f"/flows/{jobs.flow}")
        assert r.status_code == 200
        assert "report" in r.text
        assert "total" in r.text
        assert (await http.get("/flows", params={"id": jobs.flow})).status_code == 303
        assert (await http.get(f"/flows/{jobs.completed}")).status_code == 404

        for path in ("/flows", "/schedules", "/workers"):
            r = await http.get(path)
            assert r.status_code == 200, path
            assert r.text.count("<h1>") == 1
        r = await http.get("/", headers={"X-Partial": "1"})
        assert "<html" not in r.text
        assert "billing" in r.text
        assert (await http.get("/jobs/no-such-job")).status_code == 404
        assert (await http.get("/queues/billing", params={"state": "nope"})).status_code == 400
        assert (await http.get("/login")).status_code == 404


async def test_without_a_token_every_post_is_refused(jobs: Jobs) -> None:
    async with client() as http:
        for path, data in [
            (f"/jobs/{jobs.failed}/retry", {}),
            (f"/jobs/{jobs.waiting}/cancel", {"csrf": "0" * 64}),
            (f"/jobs/{jobs.failed}/rerun", {"field.order": "1"}),
            ("/queues/billing/purge", {"state": "failed"}),
            ("/login", {"token": TOKEN}),
            ("/logout", {}),
        ]:
            r = await http.post(path, data=data)
            assert r.status_code == 403, path
        record = await charge.job(jobs.failed).status()
        assert record is JobState.FAILED


async def test_actions_need_the_token_and_the_session_csrf(jobs: Jobs, tmp_path: Path) -> None:
    async with client(TOKEN) as http:
        page = (await http.get(f"/jobs/{jobs.failed}")).text
        assert "Log in to act" in page
        assert "Retry" not in page
        r = await http.post("/login", data={"token": "wrong", "next": "/"})
        assert r.status_code == 403
        assert "not the dashboard's token" in r.text
        # A forged post: no session.
        assert (await http.post(f"/jobs/{jobs.failed}/retry", data={})).status_code == 403
        await log_in(http)
        page = (await http.get(f"/jobs/{jobs.failed}")).text
        csrf = csrf_of(page)
        assert ">Retry</button>" in page
        # Logged in, but without (or with another session's) CSRF token: refused.
        assert (await http.post(f"/jobs/{jobs.failed}/retry", data={})).status_code == 403
        bad = {"csrf": "f" * 64}
        assert (await http.post(f"/jobs/{jobs.failed}/retry", data=bad)).status_code == 403
        assert await charge.job(jobs.failed).status() is JobState.FAILED

        (tmp_path / "ticket").touch()
        r = await http.post(f"/jobs/{jobs.failed}/retry", data={"csrf": csrf})
        assert r.status_code == 303
        assert "retry: retried" in (await http.get(r.headers["location"])).text
        r = await http.post(f"/jobs/{jobs.waiting}/cancel", data={"csrf": csrf})
        assert r.status_code == 303
        assert await charge.job(jobs.waiting).status() is JobState.CANCELLED

        # Re-run with edited input: invalid input is one clear message.
        rerun = f"/jobs/{jobs.waiting}/rerun"
        r = await http.post(rerun, data={"csrf": csrf, "field.order": "abc", "field.ticket": "t"})
        assert r.status_code == 400
        assert "not re-run: field &#39;order&#39;: &#39;abc&#39; is not an integer" in r.text
        r = await http.post(rerun, data={"csrf": csrf, "field.order": "", "field.ticket": "t"})
        assert r.status_code == 400
        assert "field &#39;order&#39;: &#39;&#39; is not an integer" in r.text
        form = {"csrf": csrf, "field.order": "99", "field.ticket": "edited", "field.express": "on"}
        r = await http.post(rerun, data=form)
        assert r.status_code == 303
        new_id = r.headers["location"].split("/jobs/")[1].split("?")[0]
        assert new_id != jobs.waiting
        (record,) = await app.client.broker.get([new_id])
        assert record is not None
        assert charge.input.decode(record.message.payload) == Charge(
            order=99, ticket="edited", note=None, express=True
        )

        # The retried job runs again (and completes: its ticket exists now).
        async with app.worker(concurrency=1, queues=["billing"]):
            receipt = await charge.job(jobs.failed).result(timeout=10)
        assert receipt.order == 7

        r = await http.post("/queues/billing/purge", data={"csrf": csrf, "state": "cancelled"})
        assert r.status_code == 303
        assert "purged 1 cancelled jobs" in (await http.get(r.headers["location"])).text
        counts = await app.client.broker.counts("billing")
        assert counts[JobState.CANCELLED] == 0

        assert (await http.post("/logout")).status_code == 303
        http.cookies.clear()
        assert (await http.post(f"/jobs/{new_id}/cancel", data={"csrf": csrf})).status_code == 403


async def test_a_held_flow_step_says_what_it_waits_for(dash_broker: str) -> None:
    """A chain's later step is ``scheduled`` while it waits: its page and its flow's say
    for which step of which flow, instead of a due time."""
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            chain = await report.then(total).enqueue(Report(n=5))  # no worker: step 0 waits
            async with client() as http:
                waits = f"waiting for step 0 ({chain.id}.0) of flow {chain.id}"
                r = await http.get(f"/jobs/{chain.id}")
                assert f"scheduled ({waits})" in r.text
                r = await http.get(f"/flows/{chain.id}")
                assert f"({waits})" in r.text


async def test_a_queue_page_pages_without_loading_every_job(dash_broker: str) -> None:
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            await report.enqueue_many([Report(n=i) for i in range(120)])
            await charge.enqueue_many([Charge(order=i, ticket="x") for i in range(3)])
            async with client() as http:
                r = await http.get("/queues/reports", params={"state": "waiting"})
                assert r.text.count('href="/jobs/') == 50
                assert "Next page" in r.text
                assert "First page" not in r.text
                pages, seen = 1, set(re.findall(r'href="/jobs/([^"]+)"', r.text))
                while "Next page" in r.text:
                    link = re.search(
                        r'href="(/queues/reports\?[^"]*cursor=[^"]*)">Next page', r.text
                    )
                    assert link is not None
                    r = await http.get(link.group(1).replace("&amp;", "&"))
                    assert "First page" in r.text
                    ids = re.findall(r'href="/jobs/([^"]+)"', r.text)
                    assert not seen & set(ids)
                    seen |= set(ids)
                    pages += 1
                assert (pages, len(seen)) == (3, 120)
                assert "from #101" in r.text
                assert len(ids) == 20
                r = await http.get("/queues/reports", params={"state": "waiting", "cursor": "x"})
                assert r.status_code == 400
                r = await http.get("/queues/billing", params={"state": "waiting", "task": "report"})
                assert r.text.count('href="/jobs/') == 0
                r = await http.get("/queues/billing", params={"state": "waiting", "task": "charge"})
                assert r.text.count('href="/jobs/') == 3


async def test_a_flow_page_shows_one_page_of_members(dash_broker: str) -> None:
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            flow = await report.map(Report(n=i) for i in range(120)).then(summary).enqueue()
            async with client() as http:
                r = await http.get(f"/flows/{flow.id}")
                assert r.status_code == 200
                members = re.findall(rf'href="/jobs/({flow.id}\.m\d+)"', r.text)
                assert members == [f"{flow.id}.m{i}" for i in range(50)]
                assert "not settled: 120" in r.text
                assert f'href="/flows/{flow.id}?start=50">Next members' in r.text
                r = await http.get(f"/flows/{flow.id}", params={"start": 100})
                members = re.findall(rf'href="/jobs/({flow.id}\.m\d+)"', r.text)
                assert members == [f"{flow.id}.m{i}" for i in range(100, 120)]
                assert "Next members" not in r.text
                assert f'href="/flows/{flow.id}?start=50">Previous members' in r.text
                bad = await http.get(f"/flows/{flow.id}", params={"start": "x"})
                assert bad.status_code == 400


async def test_sessions_expire_logout_revokes_and_logins_are_limited(jobs: Jobs) -> None:
    clock = FakeClock()
    dash = create_app(app, token=TOKEN, session_ttl=3600, clock=clock)
    transport = httpx.ASGITransport(app=dash)
    async with httpx.AsyncClient(transport=transport, base_url="http://dash") as http:
        await log_in(http)
        csrf = csrf_of((await http.get(f"/jobs/{jobs.failed}")).text)
        cookie = http.cookies.get(COOKIE)
        assert cookie is not None
        clock.advance(3599)
        assert ">Retry</button>" in (await http.get(f"/jobs/{jobs.failed}")).text
        clock.advance(2)  # past the session's hour: logged out, actions refused
        assert "Log in to act" in (await http.get(f"/jobs/{jobs.failed}")).text
        r = await http.post(f"/jobs/{jobs.failed}/cancel", data={"csrf": csrf})
        assert r.status_code == 403

        # Logout ends the session on the server: a copy of its cookie no longer acts.
        await log_in(http)
        copy = http.cookies.get(COOKIE)
        assert copy is not None
        csrf = csrf_of((await http.get(f"/jobs/{jobs.failed}")).text)
        assert (await http.post("/logout", data={"csrf": csrf})).status_code == 303
        http.cookies.set(COOKIE, copy)
        assert "Log in to act" in (await http.get(f"/jobs/{jobs.failed}")).text
        r = await http.post(f"/jobs/{jobs.failed}/cancel", data={"csrf": csrf})
        assert r.status_code == 403

        # Five failed logins a minute per client, then 429 until the minute has passed.
        for _ in range(5):
            r = await http.post("/login", data={"token": "wrong", "next": "/"})
            assert r.status_code == 403
        r = await http.post("/login", data={"token": TOKEN, "next": "/"})
        assert r.status_code == 429
        assert r.headers["retry-after"] == "60"
        assert "too many failed logins: try again in 60 s" in r.text
        clock.advance(60)
        await log_in(http)


async def test_mounted_under_a_prefix_links_stay_inside_it(jobs: Jobs) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    service = Starlette(routes=[Mount("/ops/dash", app=create_app(app, token=TOKEN))])
    transport = httpx.ASGITransport(app=service)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc") as http:
        r = await http.get("/ops/dash/")
        assert r.status_code == 200
        assert 'href="/ops/dash/queues/billing"' in r.text
        assert 'href="/ops/dash/static/dashboard.css"' in r.text
        assert (await http.get("/ops/dash/static/dashboard.js")).status_code == 200
        r = await http.post("/ops/dash/login", data={"token": TOKEN, "next": "https://evil/"})
        assert r.status_code == 303
        assert r.headers["location"] == "/ops/dash/"  # never an open redirect
        assert "path=/ops/dash/" in r.headers["set-cookie"].lower()
        page = (await http.get(f"/ops/dash/jobs/{jobs.failed}")).text
        assert f'action="/ops/dash/jobs/{jobs.failed}/retry"' in page


async def test_a_filtered_queue_page_holds_one_page_and_goes_on_after_it(
    dash_broker: str,
) -> None:
    # Filtering reads the state 500 ids at a time; a page still shows 50 jobs, and the
    # next one starts right after its last job (none skipped, none shown twice).
    with app.using_broker(dash_broker), anyio.fail_after(30):
        async with app:
            for i in range(6):
                await report.enqueue_many([Report(n=40 * i + k) for k in range(20)])
                await total.enqueue_many([Report(n=40 * i + k) for k in range(20)])
            async with client() as http:
                params = {"state": "waiting", "task": "report"}
                r = await http.get("/queues/reports", params=params)
                shown, sizes = [], []
                while True:
                    ids = re.findall(r'href="/jobs/([^"]+)"', r.text)
                    shown += ids
                    sizes.append(len(ids))
                    link = re.search(r'href="(/queues/reports\?[^"]*cursor=[^"]*)">Next', r.text)
                    if link is None:
                        break
                    r = await http.get(link.group(1).replace("&amp;", "&"))
                assert sizes == [50, 50, 20]
                assert len(set(shown)) == 120
