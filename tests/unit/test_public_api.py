"""The public namespace: ``typedq.__all__`` is honest, and the normative names exist.

Like httpx's ``tests/test_exported_members.py``: a name users import from ``typedq`` is
in ``__all__``, and every name in ``__all__`` is re-exported with the explicit
``from .x import Y as Y`` form, which is what strict mypy and ``pyright --verifytypes``
read as exported.
"""

from __future__ import annotations
import __future__

import ast
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import msgspec
import pytest

import typedq

INIT = Path(typedq.__file__)


def _isort_key(name: str) -> tuple[int, str]:
    """ruff's RUF022 "isort-style" order: CONSTANTS, then Classes, then everything else."""
    if name.isupper():
        return 0, name
    if name[:1].isupper():
        return 1, name
    return 2, name


def _explicit_reexports() -> dict[str, str]:
    """``{name: module}`` for every ``from .module import name as name`` in __init__.py."""
    tree = ast.parse(INIT.read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            for alias in node.names:
                if alias.asname == alias.name:
                    found[alias.name] = node.module or ""
    return found


def test_all_is_sorted_and_unique() -> None:
    assert len(typedq.__all__) == len(set(typedq.__all__)), "a name is listed twice"
    assert typedq.__all__ == sorted(typedq.__all__, key=_isort_key)


def test_every_name_in_all_is_importable() -> None:
    namespace: dict[str, Any] = {}
    exec("from typedq import *", namespace)  # noqa: S102  # a fixed string: the star import is the test
    assert set(namespace) - {"__builtins__"} == set(typedq.__all__)
    for name in typedq.__all__:
        assert getattr(typedq, name) is namespace[name]


def test_every_name_in_all_is_an_explicit_reexport() -> None:
    """``from .job import Job as Job``: plain ``from .job import Job`` is private to mypy."""
    reexports = _explicit_reexports()
    missing = sorted(set(typedq.__all__) - set(reexports))
    assert not missing, f"export these with `from .module import Name as Name`: {missing}"
    unlisted = sorted(set(reexports) - set(typedq.__all__))
    assert not unlisted, f"re-exported but missing from __all__: {unlisted}"


def test_no_public_name_outside_all() -> None:
    """Every public attribute of the package is in ``__all__`` (submodules aside)."""
    public = {
        name
        for name, value in vars(typedq).items()
        if not name.startswith("_")
        and not isinstance(value, ModuleType)
        and value is not getattr(__future__, name, None)  # `from __future__ import annotations`
    }
    assert public == set(typedq.__all__)


# Normative names (the documented API): acceptance checks rely on them.
@pytest.mark.parametrize(
    ("owner", "method", "is_async"),
    [
        ("App", "task", False),
        ("App", "worker", False),
        ("Task", "enqueue", True),
        ("Task", "enqueue_many", True),
        ("Job", "result", True),
        ("Job", "cancel", True),
        ("Job", "status", True),
        ("App", "durable", False),
        ("RunHandle", "send", True),
        ("RunHandle", "result", True),
        ("RunHandle", "cancel", True),
        ("Run", "step", False),
        ("Run", "sleep", True),
        ("Run", "wait_for", True),
        ("Run", "do", True),
        ("Run", "gather", True),
        ("Run", "emit", True),
        ("Run", "patched", False),
    ],
)
def test_spec_methods(owner: str, method: str, is_async: bool) -> None:
    function = getattr(getattr(typedq, owner), method)
    assert inspect.isfunction(function)
    assert inspect.iscoroutinefunction(function) is is_async


@pytest.mark.parametrize(
    ("name", "type_parameters"),
    [
        ("Task", 2),
        ("Job", 1),
        ("Worker", 2),
        ("App", 0),
        ("RunHandle", 1),
        ("Signal", 1),
        ("Debounce", 1),
        ("Fair", 1),
    ],
)
def test_spec_classes(name: str, type_parameters: int) -> None:
    """``Task[TIn, TOut]``, ``Job[TOut]``, ``Worker[TIn, TOut]``: generic classes."""
    cls = getattr(typedq, name)
    assert inspect.isclass(cls)
    assert len(getattr(cls, "__parameters__", ())) == type_parameters


def test_spec_exceptions() -> None:
    assert issubclass(typedq.JobFailed, typedq.TypedqError)
    # Bad numbers are configuration errors (ValueError); a partial enqueue_many is its own.
    assert issubclass(typedq.InvalidOption, typedq.ConfigError)
    assert issubclass(typedq.InvalidOption, ValueError)
    assert issubclass(typedq.PartialEnqueue, typedq.TypedqError)
    assert issubclass(typedq.Retry, Exception)
    assert typedq.Retry(delay=5).delay == 5
    # Durable runs (SPEC section 7): a timed-out wait is a TimeoutError, caught in the run.
    assert issubclass(typedq.RunTimeout, typedq.TypedqError)
    assert issubclass(typedq.RunTimeout, TimeoutError)
    assert issubclass(typedq.NonDeterministic, typedq.TypedqError)


class _Invoice(msgspec.Struct):
    invoice_id: int


def test_app_task_with_and_without_arguments() -> None:
    """``App.task`` is a decorator used bare and with options; both make a Task."""
    app = typedq.App("public-api")

    async def bare(invoice: _Invoice) -> None:
        pass

    def with_options(invoice: _Invoice) -> None:
        pass

    assert isinstance(app.task(bare), typedq.Task)
    made = app.task(retries=2, queue="other")(with_options)
    assert isinstance(made, typedq.Task)
    assert (made.name, made.queue, made.options.retries) == ("with_options", "other", 2)


def test_resources_are_public() -> None:
    """``@app.resource`` returns a typed ``Resource[T]``; ``ResourceError`` is typedq's."""
    assert len(getattr(typedq.Resource, "__parameters__", ())) == 1
    assert issubclass(typedq.ResourceError, typedq.TypedqError)
    assert inspect.isfunction(typedq.App.resource)
    assert inspect.isfunction(typedq.JobContext.get)
