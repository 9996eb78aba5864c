"""Layers point down: the dashboard and the inspection queries draw nothing with ``rich``
(the command line's tables are :mod:`typedq.cli.render`), serde knows no broker, and the
``cli`` package and the dashboard's subcommand do not import each other.

Read from the import statements (those inside functions too), so a lazy import that
reaches sideways fails here as well as a top-level one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import typedq
from typedq import cli

PACKAGE = Path(typedq.__file__).resolve().parent
ROOT = PACKAGE.parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, as absolute dotted names (relative ones resolved)."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = ".".join(parts[:-1])  # what ``from . import`` names, in a module or __init__
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            # ``from . import inspector`` imports a module named by the alias.
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def _reaches(path: Path, prefix: str) -> list[str]:
    return sorted(m for m in _imports(path) if m == prefix or m.startswith(prefix + "."))


@pytest.mark.parametrize(
    "path",
    [
        *sorted((PACKAGE / "dashboard").glob("*.py")),
        PACKAGE / "inspector.py",
        *sorted((PACKAGE / "views").glob("*.py")),
        PACKAGE / "bulk.py",
    ],
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_the_dashboard_and_the_queries_import_no_rich(path: Path) -> None:
    assert _reaches(path, "rich") == []


def test_the_dashboard_loads_without_rich() -> None:
    pytest.importorskip("starlette")
    pytest.importorskip("jinja2")
    code = (
        "import sys; import typedq.dashboard.app, typedq.dashboard.cli, typedq.inspector, "
        "typedq.views.flowkeys; "
        "loaded = sorted(m for m in sys.modules if m == 'rich' or m.startswith('rich.')); "
        "print(loaded); sys.exit(1 if loaded else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    "path",
    sorted(
        p
        for p in PACKAGE.rglob("*.py")
        if p.parent.name not in ("cli", "dashboard") and p != PACKAGE / "__main__.py"
    ),
    ids=lambda p: str(p.relative_to(PACKAGE)),
)
def test_only_the_tools_import_the_cli(path: Path) -> None:
    # The runtime (worker, supervisor, brokers) sits below the command line; ``python -m
    # typedq`` (typedq/__main__.py, left out) is the one entry point into it.
    assert _reaches(path, "typedq.cli") == []


def test_serde_knows_no_broker() -> None:
    assert _reaches(PACKAGE / "serde.py", "typedq.broker") == []


@pytest.mark.parametrize(
    "path", sorted((PACKAGE / "cli").glob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_the_cli_imports_no_dashboard(path: Path) -> None:
    # The dashboard's subcommand is found by name (typedq.cli.PROVIDERS), on demand.
    assert _reaches(path, "typedq.dashboard") == []


def test_the_dashboard_subcommand_uses_only_the_cli_helpers() -> None:
    reached = _reaches(PACKAGE / "dashboard" / "cli.py", "typedq.cli")
    assert reached, "typedq.dashboard.cli loads MODULE:APP with typedq.cli.common"
    assert all(m.startswith("typedq.cli.common") for m in reached), reached


@pytest.mark.parametrize("name", cli.PROVIDERS)
def test_each_subcommand_provider_has_the_hook(name: str) -> None:
    module = __import__(name, fromlist=["COMMAND"])
    assert isinstance(module.COMMAND, str)
    assert callable(module.add_parser)
    assert callable(module.run)
