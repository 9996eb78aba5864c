"""``typedq dashboard`` as a real process: MODULE:APP or --broker/--app, the token from
the environment, credentials of the broker URL never shown, and one line (not a
traceback) when the extra is missing."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.cli_process import ROOT
from tests.dash_support import dashboard_process, seed
from tests.redis_harness import RedisProcess, flushall, redis_process

pytestmark = pytest.mark.redis


def test_serves_an_app_by_module_with_the_token_from_the_environment(
    redis_server: RedisProcess, tmp_path: Path
) -> None:
    flushall(redis_server.port)
    jobs = seed(redis_server.url, tmp_path / "ticket")
    env = {"TYPEDQ_DASHBOARD_TOKEN": "from-env"}
    with dashboard_process("tests.dash_app:app", "--broker", redis_server.url, env=env) as base:
        page = httpx.get(f"{base}/jobs/{jobs.failed}").text
        assert "card declined for order 7" in page
        assert "Log in to act" in page
        r = httpx.post(f"{base}/login", data={"token": "from-env", "next": "/"})
        assert r.status_code == 303


def test_serves_any_app_by_broker_and_name_without_showing_credentials(tmp_path: Path) -> None:
    with redis_process() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"CONFIG SET requirepass hunter2\r\n")
            assert sock.recv(64).startswith(b"+OK")
        url = f"redis://:hunter2@127.0.0.1:{server.port}/0"
        jobs = seed(url, tmp_path / "ticket")
        with dashboard_process("--broker", url, "--app", "dash") as base:
            overview = httpx.get(base + "/").text
            assert "billing" in overview
            assert "hunter2" not in overview
            page = httpx.get(f"{base}/jobs/{jobs.failed}").text
            assert "card declined for order 7" in page
            assert "hunter2" not in page
            assert "read-only" in page
            assert httpx.post(f"{base}/jobs/{jobs.failed}/retry").status_code == 403


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give MODULE:APP, or --app NAME with --broker URL"),
        (["--app", "dash"], "give --broker URL (or set TYPEDQ_BROKER) with --app"),
        (["tests.dash_app:app", "--port", "70000"], "--port must be 1 to 65535, got 70000"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "typedq", "dashboard", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == f"typedq: error: {message}"


def test_a_missing_extra_is_one_line_naming_it() -> None:
    code = (
        "import sys; sys.modules['starlette'] = None; from typedq.cli import main; "
        "sys.exit(main(['dashboard', 'tests.dash_app:app', '--port', '8080']))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "typedq: error: the dashboard needs starlette, which is not installed: "
        "pip install 'typedq[dashboard]'"
    )
