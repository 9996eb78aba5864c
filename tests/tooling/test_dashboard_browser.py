"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by
Playwright; never a downloaded browser), against ``typedq dashboard`` and a worker
process on a real redis-server.

Proves: the overview shows the queues with jobs in several states; a failed job's page
shows its error message and traceback; without logging in no action is offered and a
forged POST is refused (403); logged in with the token, the Retry button (reached with
the keyboard) retries the job and the page, refreshing itself, shows it completed. Plus
an accessibility sanity check on every page: labelled inputs, one h1, headings in order,
and actions reachable with Tab. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dash_support import Seeded, dashboard_process, seed
from tests.redis_harness import RedisProcess, flushall
from tests.support import ROOT, spawn_worker, stop_workers

pytestmark = pytest.mark.redis

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
TOKEN = "browser-token"  # noqa: S105 - a test token
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Every labelable control has a label; exactly one h1; no heading level skipped.
A11Y = """() => {
  const problems = [];
  for (const el of document.querySelectorAll('input, select, textarea')) {
    if (el.type === 'hidden') continue;
    if (!(el.labels && el.labels.length) && !el.getAttribute('aria-label')) {
      problems.push('unlabelled ' + el.tagName + ' ' + (el.name || el.id));
    }
  }
  const hs = [...document.querySelectorAll('h1, h2, h3, h4, h5, h6')].map(h => +h.tagName[1]);
  if (hs.filter(l => l === 1).length !== 1) problems.push('h1 count ' + hs.filter(l => l === 1).length);
  if (hs[0] !== 1) problems.push('first heading is h' + hs[0]);
  for (let i = 1; i < hs.length; i++) {
    if (hs[i] > hs[i - 1] + 1) problems.push('heading h' + hs[i - 1] + ' then h' + hs[i]);
  }
  for (const b of document.querySelectorAll('button, a')) {
    if (b.tabIndex < 0) problems.push('not focusable: ' + b.textContent.trim());
  }
  return problems;
}"""


@pytest.fixture
def browser() -> Iterator[Any]:
    if shutil.which("chromium") is None and not Path(CHROMIUM).exists():
        pytest.fail("chromium is not installed; `make test` installs it (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is not installed; it is in the dev extra (make .venv)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def check_a11y(page: Any) -> None:
    problems = page.evaluate(A11Y)
    assert problems == [], f"{page.url}: {problems}"


def tab_to(page: Any, text: str, most: int = 60) -> None:
    """Press Tab until the focused element's text is ``text`` (keyboard reachability)."""
    for _ in range(most):
        page.keyboard.press("Tab")
        if page.evaluate("() => document.activeElement.textContent.trim()") == text:
            return
    raise AssertionError(f"{text!r} is not reachable with Tab on {page.url}")


@pytest.fixture
def seeded(redis_server: RedisProcess, tmp_path: Path) -> tuple[Seeded, Path]:
    """The jobs (seeded before the browser starts: Playwright's loop then runs)."""
    flushall(redis_server.port)
    ticket = tmp_path / "ticket"
    return seed(redis_server.url, ticket), ticket


def test_operator_sees_a_failure_and_retries_it(
    seeded: tuple[Seeded, Path], browser: Any, redis_server: RedisProcess
) -> None:
    jobs, ticket = seeded
    ARTIFACTS.mkdir(exist_ok=True)
    env = {"TYPEDQ_DASHBOARD_TOKEN": TOKEN}
    worker = None
    with dashboard_process("tests.dash_app:app", "--broker", redis_server.url, env=env) as base:
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(base + "/")
            assert page.locator("h1").inner_text() == "Queues"
            row = page.locator("tr", has=page.locator("th", has_text="billing"))
            assert row.locator("td.state-failed").inner_text() == "1"
            row = page.locator("tr", has=page.locator("th", has_text="reports"))
            assert row.locator("td.state-completed").inner_text() == "1"
            assert row.locator("td.state-waiting").inner_text() == "1"
            assert row.locator("td.state-scheduled").inner_text() == "1"
            assert page.locator("svg.chart").count() == 2
            check_a11y(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-overview.png"), full_page=True)

            # From the overview to the failed job, by links.
            page.get_by_role("link", name="1 failed jobs in billing").click()
            page.get_by_role("link", name=jobs.failed).click()
            assert "card declined for order 7" in page.locator(".failure").first.inner_text()
            assert (
                "Traceback (most recent call last)"
                in page.locator("pre.traceback").first.inner_text()
            )
            check_a11y(page)
            # Not logged in: no action offered, and a forged post is refused.
            assert page.get_by_role("button", name="Retry").count() == 0
            forged = page.evaluate(
                """async (url) => (await fetch(url, {method: 'POST',
                    headers: {'Content-Type': 'application/x-www-form-urlencoded'},
                    body: 'csrf=' + 'a'.repeat(64)})).status""",
                f"{base}/jobs/{jobs.failed}/retry",
            )
            assert forged == 403
            for path in ("/flows", "/schedules", "/workers", "/queues/reports?state=waiting"):
                page.goto(base + path)
                check_a11y(page)

            # Log in with the token; back on the job page, Retry is offered.
            page.goto(f"{base}/jobs/{jobs.failed}")
            page.get_by_role("link", name="Log in to act").click()
            # The click does not wait for the login page: its form does (the check below
            # once read the page while it was still empty, on a loaded box).
            page.get_by_label("Dashboard token").wait_for()
            check_a11y(page)
            page.get_by_label("Dashboard token").fill(TOKEN)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(f"{base}/jobs/{jobs.failed}")
            check_a11y(page)
            page.screenshot(path=str(ARTIFACTS / "dashboard-job.png"), full_page=True)
            # Forged again, now with the session cookie but no CSRF token of it: refused.
            forged = page.evaluate(
                "async (url) => (await fetch(url, {method: 'POST'})).status",
                f"{base}/jobs/{jobs.failed}/retry",
            )
            assert forged == 403

            ticket.touch()
            worker = spawn_worker(
                "tests.dash_app:app", redis_server.url, concurrency=1,
                env={"TYPEDQ_QUEUES": "billing"},
            )  # fmt: skip
            page.locator("body").focus()
            tab_to(page, "Retry")
            page.keyboard.press("Enter")
            page.wait_for_url(f"{base}/jobs/{jobs.failed}?done=*")
            assert "retry: retried" in page.get_by_role("status").inner_text()
            # The page refreshes itself (no reload) until the worker completed the job.
            page.locator("dd.state-completed").wait_for(timeout=20_000)
            result = page.locator("h2:has-text('Result') + pre").inner_text()
            assert '"order": 7' in result
        finally:
            if worker is not None:
                stop_workers([worker])
