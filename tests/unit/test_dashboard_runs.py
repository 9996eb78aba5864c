"""The dashboard's durable run pages over HTTP (httpx's ASGI transport, in process), on
the embedded broker with a run driven on virtual time: the run page and its JSON, and
cancel and signal (a typed form from the Signal's model) behind the token and CSRF."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import anyio
import httpx
import msgspec
import pytest

from tests.support import TEST_DEADLINE
from typedq import App
from typedq.broker.runs import RunRecord
from typedq.dashboard import create_app
from typedq.durable import Run, Signal
from typedq.durable.types import known_signals
from typedq.testing import FakeClock, run_worker

pytestmark = [pytest.mark.anyio, pytest.mark.asyncio_only]

TOKEN = "s3cret-token"  # noqa: S105 - a test token
EPOCH = 1_700_000_000.0


class Order(msgspec.Struct, frozen=True):
    n: int


class Receipt(msgspec.Struct, frozen=True):
    id: str


class Review(msgspec.Struct, frozen=True):
    ok: bool
    level: int
    by: str = "ops"


class Shipped(msgspec.Struct, frozen=True):
    receipt: str
    approved: bool
    level: int


review = Signal("dash-review", Review)


def runs_app() -> App:
    app = App("dashruns")

    @app.task
    async def charge(order: Order) -> Receipt:
        return Receipt(id=f"r-{order.n}")

    @app.durable
    async def ship(run: Run, order: Order) -> Shipped:
        receipt = await run.step(charge, order)
        await run.sleep(timedelta(minutes=5))
        answer = await run.wait_for(review, timeout=timedelta(days=2))
        return Shipped(receipt=receipt.id, approved=answer.ok, level=answer.level)

    return app


async def until(app: App, run_id: str, predicate: Callable[[RunRecord], bool]) -> None:
    with anyio.fail_after(TEST_DEADLINE):
        while True:
            [record] = await app.broker.get_runs([run_id])
            if record is not None and predicate(record):
                return
            await anyio.sleep(0.005)


def client(app: App, token: str | None = None) -> httpx.AsyncClient:
    dash = create_app(app, token=token)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=dash), base_url="http://dash")


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, "no CSRF field on the page"
    return found.group(1)


def waiting_for_review(record: RunRecord) -> bool:
    return record.wait_signal == "dash-review"


async def test_a_run_page_shows_the_timeline_and_its_json_read_only() -> None:
    app = runs_app()
    with anyio.fail_after(TEST_DEADLINE):
        async with run_worker(app, clock=FakeClock(EPOCH)) as harness, client(app) as http:
            await app.durables["ship"].start(Order(n=3), run_id="order-3")
            await until(app, "order-3", lambda r: r.wake_at is not None)
            await harness.advance(300)
            await until(app, "order-3", waiting_for_review)

            r = await http.get("/runs", params={"id": "order-3"})
            assert r.status_code == 303
            assert r.headers["location"] == "/runs/order-3"
            r = await http.get("/runs/order-3")
            assert r.status_code == 200
            page = r.text
            for shown in (
                "Run order-3",
                "running",
                "step scheduled",
                "step completed",
                "wait for signal",
                "signal &#39;dash-review&#39; until 2023-11-16",
                'href="/jobs/order-3:0"',
                "{&#34;id&#34;:&#34;r-3&#34;}",
            ):
                assert shown in page, shown
            assert '<form method="post"' not in page  # read-only: no cancel, no signal
            assert 'data-refresh="2"' in page  # running: the page refreshes itself
            assert 'href="/runs"' in page  # in the navigation

            r = await http.get("/api/runs/order-3")
            assert r.status_code == 200
            assert r.headers["content-type"] == "application/json"
            data = r.json()
            assert data["state"] == "running"
            assert data["wait_signal"] == "dash-review"
            assert [e["kind"] for e in data["entries"]] == [
                "step", "step_ok", "sleep", "wait",
            ]  # fmt: skip
            r = await http.get("/api/runs/nope")
            assert r.status_code == 404
            assert r.json() == {"error": "no durable run 'nope'"}
            r = await http.get("/runs/nope")
            assert r.status_code == 404
            assert "No durable run nope" in r.text
            r = await http.post("/runs/order-3/cancel", data={"csrf": "x"})
            assert r.status_code == 403


async def test_signal_and_cancel_need_the_token_and_the_form_is_typed() -> None:
    app = runs_app()
    assert known_signals()["dash-review"] is review
    with anyio.fail_after(TEST_DEADLINE):
        async with (
            run_worker(app, clock=FakeClock(EPOCH)) as harness,
            client(app, TOKEN) as http,
        ):
            ship = app.durables["ship"]
            handle = await ship.start(Order(n=4), run_id="order-4")
            other = await ship.start(Order(n=5), run_id="order-5")
            await until(app, "order-4", lambda r: r.wake_at is not None)
            await until(app, "order-5", lambda r: r.wake_at is not None)
            await harness.advance(300)
            await until(app, "order-4", waiting_for_review)

            r = await http.post("/login", data={"token": TOKEN, "next": "/"})
            assert r.status_code == 303
            page = (await http.get("/runs/order-4")).text
            csrf = csrf_of(page)
            assert "Send dash-review" in page
            assert "(the run waits for it)" in page
            assert 'name="field.level"' in page
            assert "Cancel run" in page
            assert "data-refresh" not in page  # a refresh would wipe a half-filled form

            r = await http.post(
                "/runs/order-4/signal",
                data={"signal": "dash-review", "field.ok": "on", "field.level": "2"},
            )
            assert r.status_code == 403  # no CSRF token
            r = await http.post(
                "/runs/order-4/signal",
                data={"csrf": csrf, "signal": "dash-review", "field.level": "high"},
            )
            assert r.status_code == 400
            assert "not sent: field &#39;level&#39;: &#39;high&#39; is not an integer" in r.text, (
                re.findall(r"role=.alert.>[^<]*", r.text)
            )
            r = await http.post(
                "/runs/order-4/signal", data={"csrf": csrf, "signal": "nope", "field.level": "1"}
            )
            assert r.status_code == 400
            assert "no signal &#39;nope&#39; is defined" in r.text
            r = await http.post(
                "/runs/order-4/signal",
                data={"csrf": csrf, "signal": "dash-review", "field.ok": "on", "field.level": "2"},
            )
            assert r.status_code == 303
            assert r.headers["location"] == "/runs/order-4?done=signal+dash-review%3A+delivered"
            assert await handle.result(timeout=TEST_DEADLINE) == Shipped("r-4", True, 2)

            r = await http.post("/runs/order-5/cancel", data={"csrf": csrf})
            assert r.status_code == 303
            assert "run+cancelled" in r.headers["location"]
            r = await http.post("/runs/order-5/cancel", data={"csrf": csrf})
            assert "already+ended" in r.headers["location"]
            assert (await other.record()).state.value == "cancelled"
            page = (await http.get("/runs/order-5")).text
            assert "cancelled" in page
            assert "Cancel run" not in page
            assert "Send dash-review" not in page
