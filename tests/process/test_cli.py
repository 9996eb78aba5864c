"""The ``typedq`` command line, run as real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import typedq
from tests.cli_process import TypedqProcess

ROOT = Path(__file__).resolve().parents[2]


def _typedq(
    *args: str, timeout: float = 30, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TYPEDQ_BROKER": "", **(env or {})},
        check=False,
    )


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module:app", "cannot import module 'no_such_module'"),
        ("examples.quickstart:nope", "has no attribute 'nope'"),
        ("examples.quickstart", "expected MODULE:APP"),
        ("examples.quickstart:SendInvoice", "not a typedq.App"),
    ],
)
def test_worker_bad_target_is_one_clear_line(target: str, message: str) -> None:
    result = _typedq("worker", target)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_the_worker_command() -> None:
    result = _typedq("--help")
    assert result.returncode == 0
    assert "worker" in result.stdout


def test_sigterm_shuts_an_idle_worker_down_gracefully() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "typedq", "worker", "examples.quickstart:app", "-c", "4"],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TYPEDQ_BROKER": ""},
    )
    assert proc.stderr is not None
    # Wait for the "started" log line instead of sleeping a guessed time.
    deadline = time.monotonic() + 20
    seen = ""
    while "started" not in seen and time.monotonic() < deadline:
        seen += proc.stderr.readline()
    assert "started" in seen, seen
    proc.send_signal(signal.SIGTERM)
    with proc.stderr:
        rest = proc.stderr.read()
    assert proc.wait(timeout=20) == 0
    assert "SIGTERM: shutting down gracefully" in rest
    assert "stopped" in rest


def _worker_start_line(*args: str, env: dict[str, str] | None = None) -> str:
    """The "started" line of a worker on the embedded broker, stopped right after."""
    process = TypedqProcess("worker", "examples.quickstart:app", *args, env=env)
    try:
        line = process.wait_for("started")
        process.proc.send_signal(signal.SIGTERM)
        assert process.wait() == 0
        return line
    finally:
        process.close()


@pytest.mark.parametrize(
    "command", [["-m", "typedq"], ["-c", "from typedq.cli import main; raise SystemExit(main())"]]
)
def test_version(command: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, *command, "--version"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert result.stdout.strip() == f"typedq {typedq.__version__}"


@pytest.mark.parametrize(
    "args",
    [
        ("--log-level", "warning", "schema", "examples.quickstart:app"),
        ("schema", "examples.quickstart:app", "--log-level", "warning"),
    ],
    ids=["before", "after"],
)
def test_log_level_before_or_after_the_subcommand(args: tuple[str, ...]) -> None:
    result = _typedq(*args)
    assert result.returncode == 0, result.stderr
    assert '"tasks"' in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ("--log-level", "bogus", "schema", "examples.quickstart:app"),
            {},
            "typedq: error: --log-level 'bogus' is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL",
        ),
        (
            ("schema", "examples.quickstart:app"),
            {"TYPEDQ_LOG_LEVEL": "loud"},
            "typedq: error: TYPEDQ_LOG_LEVEL 'loud' is not a log level; use DEBUG, INFO, WARNING, ERROR or CRITICAL",
        ),
        (
            ("worker", "examples.quickstart:app"),
            {"TYPEDQ_CONCURRENCY": "many"},
            "typedq: error: TYPEDQ_CONCURRENCY='many' is not an integer; fix or unset it (or give the flag)",
        ),
        (
            ("schema", "examples.quickstart:app", "--broker", "redis://x"),
            {},
            None,  # argparse's own usage error: --broker is not an option of schema
        ),
    ],
    ids=["flag", "env", "env-int", "broker-on-schema"],
)
def test_bad_option_is_one_line_exit_2(
    args: tuple[str, ...], env: dict[str, str], message: str | None
) -> None:
    result = _typedq(*args, env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    if message is not None:
        assert result.stderr.strip() == message


@pytest.mark.parametrize(
    "args",
    [
        ("--broker", "memory://", "inspect", "--app", "x", "--json"),
        ("inspect", "--app", "x", "--json", "--broker", "memory://"),
    ],
    ids=["before", "after"],
)
def test_broker_before_or_after_the_subcommand(args: tuple[str, ...]) -> None:
    result = _typedq(*args)
    assert result.returncode == 0, result.stderr
    assert "memory:// is this process's own embedded broker" in result.stderr


def test_help_shows_defaults_and_environment_variables() -> None:
    main = _typedq("--help")
    assert main.returncode == 0
    for variable in ("TYPEDQ_BROKER", "TYPEDQ_LOG_LEVEL", "TYPEDQ_CONCURRENCY", "TYPEDQ_GRACE"):
        assert variable in main.stdout
    assert "a flag wins over the" in main.stdout
    worker = _typedq("worker", "--help")
    assert worker.returncode == 0
    text = " ".join(worker.stdout.split())
    assert "(default: 16; env TYPEDQ_CONCURRENCY)" in text
    assert "(default: 10.0; env TYPEDQ_GRACE)" in text
    assert "--wait-for-broker SECONDS" in text
    assert "--log-level" in text


def test_env_defaults_and_the_flag_wins() -> None:
    assert "concurrency=3" in _worker_start_line(env={"TYPEDQ_CONCURRENCY": "3"})
    assert "concurrency=5" in _worker_start_line("-c", "5", env={"TYPEDQ_CONCURRENCY": "3"})
    assert "queues=['bulk']" in _worker_start_line(env={"TYPEDQ_QUEUES": "bulk"})


def test_a_queue_no_task_uses_is_refused_in_one_line() -> None:
    """A typo'd queue would idle quietly (issue 29, item 3): refused before the worker
    starts or touches a broker, naming the app's queues and how to insist."""
    for args, env in [
        (("-q", "defualt"), {}),
        (("-q", "default,defualt", "--processes", "2", "--broker", "redis://127.0.0.1:1/0"), {}),
        ((), {"TYPEDQ_QUEUES": "defualt"}),
    ]:
        result = _typedq("worker", "examples.quickstart:app", *args, env=env)
        assert result.returncode == 2, result.stderr
        (line,) = result.stderr.splitlines()
        assert line == (
            "typedq: error: queue 'defualt' is used by no task of app 'billing' (its "
            "queues: bulk, default); check the spelling, or pass --allow-unknown-queue to "
            "take jobs from it anyway"
        )


def test_allow_unknown_queue_takes_jobs_from_it() -> None:
    line = _worker_start_line("-q", "other", "--allow-unknown-queue")
    assert "queues=['other']" in line


def test_stubs_without_out_prints_the_stub() -> None:
    result = _typedq("stubs", "examples.billing.tasks:app")
    assert result.returncode == 0, result.stderr
    on_disk = (ROOT / "stubs" / "billing.py").read_text()
    printed = result.stdout.replace("--out -`", "--out stubs/billing.py`", 1)
    assert printed == on_disk


def test_stubs_printed_then_saved_regenerate_from_their_header(tmp_path: Path) -> None:
    stub = tmp_path / "billing_stub.py"
    stub.write_text(_typedq("stubs", "examples.billing.tasks:app").stdout)
    assert _typedq("stubs", "--check", str(stub)).returncode == 0
    stub.write_text(stub.read_text() + "# edited\n")
    stale = _typedq("stubs", "--check", str(stub))
    assert stale.returncode == 1
    assert f"is stale; run: typedq stubs {stub}" in stale.stdout


@pytest.mark.parametrize(
    ("source", "message"),
    [
        (
            "from typedq import App\n\napp = App('broken')\n\n\ndef helper() -> int:\n"
            "    return undefined_name\n\n\nhelper()\n",
            "typedq: error: cannot import brokenpkg: brokenpkg/tasks.py:7: NameError: "
            "name 'undefined_name' is not defined",
        ),
        (
            "from typedq import App\n\napp = App('broken'\n",
            "typedq: error: cannot import brokenpkg: brokenpkg/tasks.py:3: SyntaxError: "
            "'(' was never closed",
        ),
        (
            "import not_installed_dependency\n",
            "typedq: error: cannot import brokenpkg: brokenpkg/tasks.py:1: "
            "ModuleNotFoundError: No module named 'not_installed_dependency'",
        ),
    ],
    ids=["name-error", "syntax-error", "missing-dependency"],
)
def test_import_error_names_file_and_line(tmp_path: Path, source: str, message: str) -> None:
    package = tmp_path / "brokenpkg"
    package.mkdir()
    (package / "__init__.py").write_text("from brokenpkg.tasks import app as app\n")
    (package / "tasks.py").write_text(source)
    result = subprocess.run(
        [sys.executable, "-m", "typedq", "schema", "brokenpkg:app"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "TYPEDQ_BROKER": "", "PYTHONPATH": str(ROOT)},
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == message
