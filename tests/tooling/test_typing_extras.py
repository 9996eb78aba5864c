"""mypy --strict over typedq's own sources passes without the optional extras (issue 29):
an editable install or a monorepo type-checks typedq's files as its own, and one without
``typedq[otel]`` or ``typedq[metrics]`` must not fail on their imports.

The environment without them is this one's site-packages minus those packages, given to
mypy as a search path (``MYPYPATH``, with ``--no-site-packages``)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import mypy.api
import pytest

from tests.support import ROOT

#: Top-level names of site-packages left out: the optional extras under test, typedq
#: itself (the sources are checked from the worktree), and what mypy refuses to see on
#: a search path (its own extension modules, .pth files).
_LEFT_OUT = ("opentelemetry", "prometheus_client", "typedq", "__editable__")
_REFUSED = {"mypy_extensions.py", "typing_extensions.py"}


def _without_extras(target: Path) -> Path:
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "opentelemetry").is_dir(), "the test environment has the otel extra"
    target.mkdir()
    for entry in site.iterdir():
        name = entry.name
        if name.startswith(_LEFT_OUT) or name.endswith(".pth") or name in _REFUSED:
            continue
        (target / name).symlink_to(entry)
    return target


def test_mypy_strict_passes_on_typedq_without_the_optional_extras(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    search = _without_extras(tmp_path / "site")
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
    monkeypatch.setenv("MYPYPATH", str(search))
    monkeypatch.chdir(ROOT)
    stdout, stderr, status = mypy.api.run(
        [
            "--config-file",
            str(config),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--no-site-packages",
            "--no-color-output",
            "-p",
            "typedq",
        ]
    )
    assert status in (0, 1), stderr + stdout
    # Third-party packages on the search path are checked as sources too: only typedq's
    # own files matter.
    ours = [line for line in stdout.splitlines() if line.startswith("typedq")]
    assert ours == [], "\n".join(ours)
    # The extras really were missing (else this proves nothing).
    assert not (search / "opentelemetry").exists()
    assert not (search / "prometheus_client").exists()
