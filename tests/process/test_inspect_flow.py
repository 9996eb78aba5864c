"""``typedq inspect --fair/--debounced/--unique QUEUE`` (typedq/inspect_flow.py) on
Redis, through the CLI: tables, ``--json``, paging with ``--cursor``, and the tables'
rendering of keys as text (never rich markup)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import anyio
import msgspec
import pytest
from rich.console import Console

from tests.redis_harness import RedisProcess, flushall
from typedq import App, Debounce, Fair
from typedq.broker.flowviews import FlowKey
from typedq.inspect_flow import FlowKeysView, render_flow_keys

ROOT = Path(__file__).resolve().parents[2]


class Doc(msgspec.Struct, frozen=True):
    doc: str


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", "inspect", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TYPEDQ_BROKER": "", "COLUMNS": "200"},
        check=False,
    )


@pytest.mark.redis
def test_cli_lists_fair_debounced_and_unique_keys(
    redis_server: RedisProcess, app_name: str
) -> None:
    flushall(redis_server.port)
    url = redis_server.url

    async def fill() -> dict[str, str]:
        app = App(app_name, broker=url)

        @app.task(queue="fq", fair=Fair(key=lambda d: d.doc))
        async def share(d: Doc) -> None:
            pass

        @app.task(queue="fq", debounce=Debounce(key=lambda d: d.doc, wait=600.0))
        async def settle(d: Doc) -> None:
            pass

        @app.task(queue="fq", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def once(d: Doc) -> None:
            pass

        async with app:
            for doc in ("acme", "acme", "globex"):
                await share.enqueue(Doc(doc))
            debounced = await settle.enqueue(Doc("report-7"))
            held = await once.enqueue(Doc("invoice-9"))
            for i in range(5):
                await once.enqueue(Doc(f"extra-{i}"))
        return {"debounced": debounced.id, "held": held.id}

    ids = anyio.run(fill)
    target = ["--broker", url, "--app", app_name]

    fair = json.loads(inspect(*target, "--fair", "fq", "--json").stdout)
    assert fair["kind"] == "fair"
    assert {k["key"]: k["waiting"] for k in fair["keys"]} == {"acme": 2, "globex": 1}

    table = inspect(*target, "--debounced", "fq")
    assert table.returncode == 0, table.stderr
    assert "debounced keys in queue 'fq'" in table.stdout
    assert "report-7" in table.stdout
    assert ids["debounced"] in table.stdout

    unique = inspect(*target, "--unique", "fq")
    assert "invoice-9" in unique.stdout
    assert ids["held"] in unique.stdout
    assert "after the job finishes" in unique.stdout

    # Paging: pages of 2 keys, followed by their cursors, list all 6 unique keys.
    seen: set[str] = set()
    cursor: list[str] = []
    for _ in range(100):
        page = inspect(*target, "--unique", "fq", "--limit", "2", "--json", *cursor)
        assert page.returncode == 0, page.stderr
        data = json.loads(page.stdout)
        assert len(data["keys"]) <= 2
        seen |= {k["key"] for k in data["keys"]}
        if data["cursor"] is None:
            break
        cursor = ["--cursor", data["cursor"]]
    assert seen == {"invoice-9", *(f"extra-{i}" for i in range(5))}

    streams = inspect(*target, "--streams", "fq")
    assert streams.returncode == 0, streams.stderr
    assert "no job streams in queue 'fq'" in streams.stdout

    empty = inspect(*target, "--fair", "elsewhere")
    assert "no fair keys with jobs waiting in queue 'elsewhere'" in empty.stdout

    wrong = inspect(*target, "--cursor", "1|0")
    assert wrong.returncode == 2
    assert "--cursor goes with --fair, --debounced, --unique or --streams" in wrong.stderr
    both = inspect(*target, "--fair", "fq", "--workers")
    assert both.returncode == 2


def test_keys_are_shown_as_text_not_markup() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    key = FlowKey(kind="fair", task="t", key="[bold]x[/bold]", waiting=3, weight=None)
    render_flow_keys(console, FlowKeysView("q", "fair", [key], "7"))
    text = out.getvalue()
    assert "[bold]x[/bold]" in text
    assert "?" in text  # a weight the broker cannot tell
    assert "more: --fair q --cursor 7" in text


def test_streams_table_says_when_readers_are_unknown() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100, force_terminal=False)
    streams = [
        FlowKey(kind="stream", task="", key="", job_id="01JOB", waiting=12, readers=None),
        FlowKey(kind="stream", task="", key="", job_id="02JOB", waiting=3, readers=1),
    ]
    render_flow_keys(console, FlowKeysView("q", "stream", streams, None))
    text = out.getvalue()
    assert "job streams in queue 'q'" in text
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if "JOB" in line}
    assert rows == {"01JOB": ["12", "?"], "02JOB": ["3", "1"]}
