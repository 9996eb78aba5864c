"""tests/xdist_units.py's tables name files and tests that exist, and a split file's
shared fixtures stay within one unit of work."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.xdist_units import COSTS, SPLIT, cost_of, unit_of

ROOT = Path(__file__).resolve().parents[2]


def _functions(path: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse((ROOT / path).read_text())
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


def _scoped_fixtures(functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef]) -> set[str]:
    """Fixtures of the file with a scope wider than a function."""
    scoped = set()
    for name, node in functions.items():
        for decorator in node.decorator_list:
            if isinstance(decorator, ast.Call) and any(
                k.arg == "scope"
                and not (isinstance(k.value, ast.Constant) and k.value.value == "function")
                for k in decorator.keywords
            ):
                scoped.add(name)
    return scoped


def test_every_named_file_and_test_exists() -> None:
    for key in [*SPLIT, *COSTS]:
        path, _, name = key.partition("::")
        assert (ROOT / path).is_file(), key
        groups = SPLIT.get(path, {})
        if name and name not in groups:
            assert name in _functions(path), key
    for path, groups in SPLIT.items():
        functions = _functions(path)
        for names in groups.values():
            assert set(names) <= set(functions), (path, names)


def test_a_split_files_wider_fixtures_are_used_by_one_group_only() -> None:
    """A test of a SPLIT file may run on any process: a module-scoped fixture's tests
    must be one unit (a group), or the fixture is set up once per process."""
    for path, groups in SPLIT.items():
        functions = _functions(path)
        scoped = _scoped_fixtures(functions)
        assert "class Test" not in (ROOT / path).read_text(), path
        grouped = {name for names in groups.values() for name in names}
        for name, node in functions.items():
            uses = {a.arg for a in node.args.args} & scoped
            if uses and name.startswith("test_"):
                assert name in grouped, (path, name, uses)


def test_units_of_work() -> None:
    assert unit_of("tests/contract/test_fair.py::test_x[memory-asyncio]") == (
        "tests/contract/test_fair.py"
    )
    seed = "tests/model/test_model_combined.py::test_brokers_agree_where_features_meet[3]"
    assert unit_of(seed) == seed
    stub = "tests/tooling/test_stubs.py::test_stub_of_emitting_tasks"
    assert unit_of(stub) == "tests/tooling/test_stubs.py::mypy"
    assert cost_of(unit_of(stub)) == COSTS["tests/tooling/test_stubs.py::mypy"]
    assert cost_of(seed) == COSTS[seed.partition("[")[0]]
    assert cost_of("tests/unit/test_names.py") is None
