"""docs/first-app.md is tested: every code block is a file of examples/first_app/ (kept
identical here) or is run by a test of this module named in the comment above it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import mypy.api
import pytest

from tests.redis_harness import RedisProcess, flushall

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "first-app.md"
BIN = Path(sys.executable).parent

# `<!-- tested: file PATH -->` or `<!-- tested: TEST_NAME -->`, then one fenced block.
_BLOCK = re.compile(
    r"<!-- tested: (?:file (?P<file>\S+)|(?P<test>\w+)) -->\n"
    r"```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.DOTALL | re.MULTILINE,
)


def _blocks() -> list[re.Match[str]]:
    return list(_BLOCK.finditer(DOC.read_text()))


def _bodies(test: str) -> list[str]:
    return [m["body"] for m in _blocks() if m["test"] == test]


def test_every_block_is_tested_and_every_file_block_matches_its_file() -> None:
    text = DOC.read_text()
    fences = len(re.findall(r"^```", text, re.MULTILINE))
    blocks = _blocks()
    # Each block has an opening and a closing fence, and each is marked.
    assert fences == 2 * len(blocks), "a code block without a `<!-- tested: ... -->` line"
    for block in blocks:
        if block["file"]:
            path = ROOT / block["file"]
            assert block["body"] == path.read_text(), f"the block differs from {path}"
        else:
            assert block["test"] in globals(), f"no test named {block['test']}"


def test_install_commands_are_the_makefiles() -> None:
    """The install block is what `make` runs to set up (exercised by every `make test`)."""
    (block,) = _bodies("test_install_commands_are_the_makefiles")
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("$(STAMP): pyproject.toml\n", 1)[1].split("\n\n", 1)[0]
    made = [
        line.strip()
        .replace("$(PYTHON)", "python3")
        .replace("$(BIN)", ".venv/bin")
        .replace("$(VENV)", ".venv")
        .replace(" -q", "")
        for line in recipe.splitlines()
    ]
    for command in block.splitlines():
        assert command in made


@pytest.mark.redis
def test_worker_and_producer_commands(redis_server: RedisProcess) -> None:
    worker_block, producer_block, output = _bodies("test_worker_and_producer_commands")
    flushall(redis_server.port)

    def command(block: str) -> tuple[dict[str, str], list[str]]:
        env = {**os.environ}
        argv: list[str] = []
        for line in block.splitlines():
            if line.startswith("export "):
                name, _, value = line.removeprefix("export ").partition("=")
                env[name] = value.replace("redis://localhost:6379/0", redis_server.url)
            else:
                program, *args = line.split()
                argv = [str(BIN / program.removeprefix(".venv/bin/")), *args]
        return env, argv

    env, argv = command(worker_block)
    worker = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        env, argv = command(producer_block)
        produced = subprocess.run(
            argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert produced.returncode == 0, produced.stderr
        assert produced.stdout == output
    finally:
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert "opened resources mailer" in stderr


@pytest.fixture(scope="module")
def plugin_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One mypy cache for the runs with the doc's configuration (its plugins): the
    project's own .mypy_cache is left alone (a run with another configuration, or its
    plugins, rechecks every module and would overwrite it)."""
    return tmp_path_factory.mktemp("first-app-mypy-cache")


def _mypy(cache: Path, *args: str) -> tuple[str, int]:
    stdout, stderr, status = mypy.api.run([*args, "--cache-dir", str(cache), "--no-error-summary"])
    return stdout + stderr, status


def test_mypy_command(plugin_cache: Path) -> None:
    (block,) = _bodies("test_mypy_command")
    program, *args = block.split()
    assert program == ".venv/bin/mypy"
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        output, status = _mypy(plugin_cache, *args)
    finally:
        os.chdir(cwd)
    assert status == 0, output


_BAD_KEY = """
from examples.first_app.models import Signup
from typedq import App

app = App("bad-key")

@app.task(key=lambda signup: signup.user)
async def welcome(signup: Signup) -> None: ...
"""


@pytest.mark.parametrize("config", ["mypy.ini", "pyproject-mypy.toml"])
def test_key_is_checked_only_with_the_plugin(config: str, plugin_cache: Path) -> None:
    (expected,) = _bodies("test_key_is_checked_only_with_the_plugin")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        with_plugin, _ = _mypy(
            plugin_cache, "--config-file", f"examples/first_app/{config}", "-c", _BAD_KEY
        )
    finally:
        os.chdir(cwd)
    assert expected.strip() in with_plugin


def test_key_is_unchecked_without_the_plugin(tmp_path: Path) -> None:
    """The doc's warning: without typedq's plugin the bad key passes (one mypy run; it
    does not depend on which of the two configurations above a project uses)."""
    without = tmp_path / "mypy.ini"
    without.write_text("[mypy]\nstrict = True\nplugins = pydantic.mypy\n")
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        without_plugin, status = _mypy(
            tmp_path / "cache", "--config-file", str(without), "-c", _BAD_KEY
        )
    finally:
        os.chdir(cwd)
    assert status == 0, without_plugin


def test_pytest_command() -> None:
    (block,) = _bodies("test_pytest_command")
    program, *args = block.split()
    result = subprocess.run(
        [str(BIN / program.removeprefix(".venv/bin/")), *args, "-q"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "TYPEDQ_BROKER": ""},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed" in result.stdout
    assert "failed" not in result.stdout
