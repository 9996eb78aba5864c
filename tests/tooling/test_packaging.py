"""Packaging: the installed metadata (classifiers, extras, version), and the Makefile's
Python-version guard and interpreter list agreeing with it."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from trove_classifiers import classifiers as known_classifiers

import typedq

ROOT = Path(__file__).resolve().parents[2]
SUPPORTED = ("3.11", "3.12", "3.13")
OLD_PYTHON = Path.home() / ".pyenv/versions/3.10.13/bin/python3.10"


def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        project = tomllib.load(file)["project"]
    assert isinstance(project, dict)
    return project


def metadata() -> importlib.metadata.PackageMetadata:
    return importlib.metadata.metadata("typedq")


def test_version_is_one_string() -> None:
    """pyproject, the installed distribution and typedq.__version__ name the same version."""
    assert pyproject()["version"] == typedq.__version__
    assert importlib.metadata.version("typedq") == typedq.__version__


def test_classifiers_exist_and_name_the_supported_pythons() -> None:
    classifiers = metadata().get_all("Classifier") or []
    unknown = [c for c in classifiers if c not in known_classifiers]
    assert not unknown, f"not trove classifiers: {unknown}"
    pythons = {
        c.removeprefix("Programming Language :: Python :: ")
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    }
    assert pythons == set(SUPPORTED)
    for needed in (
        "Typing :: Typed",
        "Framework :: AnyIO",
        "Framework :: AsyncIO",
        "Framework :: Trio",
        "Programming Language :: Python :: 3 :: Only",
    ):
        assert needed in classifiers
    assert metadata()["Requires-Python"] == f">={SUPPORTED[0]}"


def test_license_is_an_spdx_expression() -> None:
    # PEP 639: the expression replaces the "License ::" classifier (setuptools refuses both).
    assert metadata()["License-Expression"] == "MIT"
    assert not [c for c in metadata().get_all("Classifier") or [] if c.startswith("License ::")]


def test_package_data_ships_every_lua_file() -> None:
    """The wheel carries every Lua file the Redis broker builds its library from (the
    scripts and the shared parts in lua/common/): setuptools ships the files the
    package-data globs match, with glob's rules (``*`` stops at ``/``)."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        globs = tomllib.load(file)["tool"]["setuptools"]["package-data"]["typedq"]
    package = ROOT / "typedq"
    shipped = {path for pattern in globs for path in package.glob(pattern)}
    lua = set((package / "broker" / "redis" / "lua").rglob("*.lua"))
    assert any(p.parent.name == "common" for p in lua)
    assert lua <= shipped, sorted(str(p.relative_to(package)) for p in lua - shipped)


def test_extras() -> None:
    """`redis` names the same requirement as the core dependency; `dev` has the tools."""
    requires = [Requirement(r) for r in metadata().get_all("Requires-Dist") or []]
    assert set(metadata().get_all("Provides-Extra") or []) >= {"redis", "dev"}

    def for_extra(extra: str) -> dict[str, Requirement]:
        return {r.name: r for r in requires if r.marker and r.marker.evaluate({"extra": extra})}

    core = {r.name: r for r in requires if r.marker is None}
    redis_extra, dev = for_extra("redis"), for_extra("dev")
    assert str(redis_extra["redis"].specifier) == str(core["redis"].specifier)
    assert redis_extra["redis"].extras == core["redis"].extras == {"hiredis"}
    assert {"mypy", "pytest", "ruff", "trio"} <= set(dev)


def test_no_invented_project_urls() -> None:
    """Any project URL names a real address of ours; placeholders are refused."""
    for entry in metadata().get_all("Project-URL") or []:
        url = entry.partition(", ")[2]
        assert url.startswith("https://"), entry
        assert not re.search(r"example\.(com|org|net)|your-?(org|name|user)|\bTODO\b", url), entry


def test_makefile_tests_the_classified_pythons() -> None:
    """`make test` (CI) runs pytest on exactly the interpreters the classifiers promise."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^PYTHONS \?= (.+)$", makefile, re.MULTILINE)
    assert match is not None
    assert tuple(match.group(1).split()) == SUPPORTED


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"^(make \S+)\s+#", readme, re.MULTILINE)
    assert "make test" in commands
    ci = (ROOT / ".ci/run").read_text().strip().splitlines()
    assert ci[-1] == "make test"


def test_changelog_states_the_versioning_policy() -> None:
    changelog = (ROOT / "docs/CHANGELOG.md").read_text()
    assert "## Versioning" in changelog
    assert changelog.index("## Versioning") < changelog.index("## Unreleased")


def make_check_python(python: str) -> subprocess.CompletedProcess[str]:
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        [make, "--no-print-directory", "-C", str(ROOT), "check-python", f"PYTHON={python}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_makefile_accepts_this_python() -> None:
    result = make_check_python(sys.executable)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


@pytest.mark.parametrize("python", [str(OLD_PYTHON), "/nonexistent/python3"])
def test_makefile_refuses_an_old_or_missing_python_in_one_line(python: str) -> None:
    if python == str(OLD_PYTHON) and not OLD_PYTHON.exists():
        pytest.skip(f"{OLD_PYTHON} is not installed")
    result = make_check_python(python)
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert first.startswith("typedq needs Python 3.11+; set PYTHON="), result.stderr
    assert f"PYTHON={python}: " in first
    assert ("Python 3.10" in first) if python == str(OLD_PYTHON) else ("not found" in first)
    assert "Traceback" not in result.stderr
    assert "AssertionError" not in result.stderr
