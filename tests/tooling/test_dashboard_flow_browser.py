"""The dashboard's flow-control sections in a real headless Chromium (see
test_dashboard_browser.py): a queue with a fair task, a debounced job and a unique key
shows a section for each, keys escaped; a queue without flow control shows none."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.dash_flow_app import Work, app, once, settle, share
from tests.dash_support import dashboard_process
from tests.redis_harness import RedisProcess, flushall
from tests.tooling.test_dashboard_browser import ARTIFACTS, browser, check_a11y

pytestmark = pytest.mark.redis

__all__ = ["browser"]  # the fixture, imported for this module's test

HOSTILE = "<b>evil</b>"


def seed(url: str) -> dict[str, str]:
    async def run() -> dict[str, str]:
        with app.using_broker(url), anyio.fail_after(30):
            async with app:
                for tenant in ("acme", "acme", "globex", HOSTILE):
                    await share.enqueue(Work(tenant))
                debounced = await settle.enqueue(Work("acme"))
                held = await once.enqueue(Work("acme"))
                return {"debounced": debounced.id, "held": held.id}

    return anyio.run(run)


@pytest.fixture
def seeded(redis_server: RedisProcess) -> dict[str, str]:
    """The jobs (seeded before the browser starts: Playwright's loop then runs)."""
    flushall(redis_server.port)
    return seed(redis_server.url)


def test_queue_page_shows_fair_debounced_and_unique_sections(
    seeded: dict[str, str], browser: Any, redis_server: RedisProcess
) -> None:
    ids = seeded
    ARTIFACTS.mkdir(exist_ok=True)
    with dashboard_process("tests.dash_flow_app:app", "--broker", redis_server.url) as base:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(base + "/queues/tenants")
        fair = page.locator("#flow-fair")
        assert fair.locator("h2").inner_text() == "Fair keys with jobs waiting"
        acme = fair.locator("tr", has=page.locator("td", has_text="acme"))
        assert acme.locator("td.num").first.inner_text() == "2"
        debounce = page.locator("#flow-debounce")
        assert debounce.locator("h2").inner_text() == "Debounced jobs waiting"
        assert ids["debounced"] in debounce.inner_text()
        unique = page.locator("#flow-unique")
        assert unique.locator("h2").inner_text() == "Unique keys held"
        assert unique.locator("code").first.inner_text() == "acme"
        # Keys are shown as text, never parsed as markup.
        assert page.locator("section.flow-keys b").count() == 0
        assert ids["held"] in unique.inner_text()
        assert "after the job finishes" in unique.inner_text()
        check_a11y(page)
        page.screenshot(path=str(ARTIFACTS / "dashboard-flow-control.png"), full_page=True)
        # A queue without flow control shows no such section.
        page.goto(base + "/queues/elsewhere")
        assert page.locator("section.flow-keys").count() == 0
