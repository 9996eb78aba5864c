"""mypy --strict over typedq's own sources passes without the optional extras (issue 29):
an editable install or a monorepo type-checks typedq's files as its own, and one without
``typedq[otel]`` or ``typedq[metrics]`` must not fail on their imports.

The environment without them is a bare venv whose site-packages holds this one's packages
minus those (symlinks), given to mypy as its ``--python-executable``: mypy reads the
installed packages as it does in a project's own environment (their errors not reported,
not checked as sources: the first version of this test put them on MYPYPATH, where mypy
checked every one, ~170 s on the 2-core box instead of ~35)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import mypy.api
import pytest

from tests.support import ROOT

#: Top-level names of site-packages left out: the optional extras under test, typedq
#: itself (the sources are checked from the worktree), and .pth files (the editable
#: install's path entry among them).
_LEFT_OUT = ("opentelemetry", "prometheus_client", "typedq", "__editable__")


def _venv_without_extras(venv: Path) -> tuple[Path, Path]:
    """A venv at ``venv`` with this environment's packages but the extras: its python
    and its site-packages."""
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "opentelemetry").is_dir(), "the test environment has the otel extra"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    paths = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})
    target = Path(paths["purelib"])
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(_LEFT_OUT) or name.endswith(".pth"):
            continue
        (target / name).symlink_to(entry)
    return venv / "bin" / "python", target


def test_mypy_strict_passes_on_typedq_without_the_optional_extras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, site = _venv_without_extras(tmp_path / "venv")
    config = tmp_path / "mypy.ini"
    # The project's own strictness (mypy.ini), without its plugins and file list.
    config.write_text(
        "[mypy]\n"
        "python_version = 3.11\n"
        "strict = True\n"
        "warn_unreachable = True\n"
        "warn_unused_ignores = True\n"
        "enable_error_code = truthy-bool, mutable-override, ignore-without-code, "
        "redundant-expr\n"
    )
    monkeypatch.chdir(ROOT)
    stdout, stderr, status = mypy.api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--python-executable",
            str(python),
            "--no-color-output",
            "-p",
            "typedq",
        ]
    )
    assert status == 0, stderr + stdout
    # The extras really were missing (else this proves nothing), the rest was there.
    assert not (site / "opentelemetry").exists()
    assert not (site / "prometheus_client").exists()
    assert (site / "redis").exists()
