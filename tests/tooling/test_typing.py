"""mypy checks what typedq promises: snippets that must type-check, and calls that must not.

mypy runs once per session, in process, over every snippet in ``typing_snippets/pass`` and
``typing_snippets/fail`` (strict, with pydantic's and typedq's plugins: see
``typing_snippets/mypy.ini``); then each snippet file is one test that compares mypy's
messages for it with the expectations written inline::

    await send_invoice.enqueue(receipt)  # E: arg-type "Receipt"; expected "SendInvoice"
    reveal_type(job)  # R: typedq.job.Job[snip.Receipt]

The format is described in ``typing_snippets/README.md``. A call that must fail and
starts to type-check fails its test, as ``warn_unused_ignores`` would. ``# P:`` comments are
pyright's expectations (tests/tooling/test_typing.pyright.py); mypy ignores them.
"""

from __future__ import annotations

import configparser
import io
import re
import tokenize
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast

import mypy.api
import pytest

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "tests" / "typing_snippets"
CONFIG = SNIPPETS / "mypy.ini"
PASS = sorted((SNIPPETS / "pass").glob("*.py"))
FAIL = sorted((SNIPPETS / "fail").glob("*.py"))

Kind = Literal["E", "N", "R", "P"]
Severity = Literal["error", "note"]

# `path:line: severity: message  [code]`, as printed with --show-absolute-path.
_MESSAGE = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<severity>error|note): (?P<text>.*?)"
    r"(?:  \[(?P<code>[a-z0-9-]+)\])?$"
)
# One `# E: ...`, `# N: ...`, `# R: ...` or `# P: ...` in a comment; several may follow each
# other.
_EXPECTATION = re.compile(r"#\s*(?P<kind>[ENRP]):\s*(?P<body>.*?)\s*(?=#\s*[ENRP]:|$)")
_ERROR_CODE = re.compile(r"[a-z][a-z0-9-]*")
# A pyright rule (`reportArgumentType`), or `ok` for a line pyright accepts though mypy does not.
_PYRIGHT_RULE = re.compile(r"report[A-Z][A-Za-z]*|ok")
_REVEALED = re.compile(r'^Revealed type is "(?P<type>.*)"$')


@dataclass(frozen=True)
class Message:
    """One line of mypy's output."""

    line: int
    severity: Severity
    text: str
    code: str | None

    def __str__(self) -> str:
        code = f"  [{self.code}]" if self.code else ""
        return f"{self.line}: {self.severity}: {self.text}{code}"


@dataclass(frozen=True)
class Expectation:
    """One inline expectation: an error (code and message fragment), a note, a revealed type.

    ``P`` is pyright's: ``code`` is its rule (or ``ok``), ``text`` a message fragment (or, for
    ``ok``, the reason pyright cannot see the error).
    """

    line: int
    kind: Kind
    code: str | None
    text: str

    def matches(self, message: Message) -> bool:
        if message.line != self.line:
            return False
        if self.kind == "E":
            return (
                message.severity == "error"
                and message.code == self.code
                and self.text in message.text
            )
        if self.kind == "N":
            return message.severity == "note" and self.text in message.text
        if self.kind == "P":
            return False  # pyright's, not mypy's
        revealed = _REVEALED.match(message.text)
        return message.severity == "note" and revealed is not None and revealed["type"] == self.text

    def __str__(self) -> str:
        if self.kind == "E":
            return f"{self.line}: error [{self.code}] containing {self.text!r}"
        if self.kind == "N":
            return f"{self.line}: note containing {self.text!r}"
        if self.kind == "P":
            return f"{self.line}: pyright {self.code} containing {self.text!r}"
        return f'{self.line}: Revealed type is "{self.text}"'


def parse_expectations(source: str) -> list[Expectation]:
    """The expectations in a snippet's comments (only comments starting with E:, N:, R: or P:).

    A trailing comment is about its own line; a comment alone on its line is about the next
    line of code (for messages too long to trail the code without the formatter wrapping it).
    """
    lines = source.splitlines()

    def next_code_line(line: int) -> int:
        while line < len(lines) and (not lines[line].strip() or lines[line].lstrip()[0] == "#"):
            line += 1
        return line + 1

    expectations = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or not re.match(r"#\s*[ENRP]:", token.string):
            continue
        line = token.start[0]
        if not token.line[: token.start[1]].strip():
            line = next_code_line(line)
        for found in _EXPECTATION.finditer(token.string):
            kind = cast(Kind, found["kind"])  # the regex admits only E, N, R
            body = found["body"]
            if kind == "E":
                code, _, fragment = body.partition(" ")
                if not _ERROR_CODE.fullmatch(code):
                    raise ValueError(f"line {line}: `# E:` must start with an error code: {body!r}")
                expectations.append(Expectation(line, kind, code, fragment.strip()))
            elif kind == "P":
                rule, _, fragment = body.partition(" ")
                if not _PYRIGHT_RULE.fullmatch(rule):
                    raise ValueError(
                        f"line {line}: `# P:` must start with a pyright rule or `ok`: {body!r}"
                    )
                if rule == "ok" and not fragment.strip():
                    raise ValueError(f"line {line}: `# P: ok` must say why pyright accepts it")
                expectations.append(Expectation(line, kind, rule, fragment.strip()))
            else:
                if not body:
                    raise ValueError(f"line {line}: empty `# {kind}:` expectation")
                expectations.append(Expectation(line, kind, None, body))
    return expectations


def unmet_and_unexpected(
    expectations: list[Expectation], messages: list[Message]
) -> tuple[list[Expectation], list[Message]]:
    """Expectations no message satisfies, and messages no expectation accounts for.

    Each message satisfies at most one expectation. Errors and revealed types must all be
    expected; other notes (mypy's explanations of an error) may go unmentioned. Pyright's
    expectations are not mypy's business.
    """
    remaining = list(messages)
    unmet = []
    for expectation in (e for e in expectations if e.kind != "P"):
        match = next((m for m in remaining if expectation.matches(m)), None)
        if match is None:
            unmet.append(expectation)
        else:
            remaining.remove(match)
    unexpected = [
        m for m in remaining if m.severity == "error" or _REVEALED.match(m.text) is not None
    ]
    return unmet, unexpected


@dataclass(frozen=True)
class MypyRun:
    messages: dict[Path, list[Message]]
    #: Output lines that are not a message about a snippet file (crashes, other files).
    stray: list[str]
    stderr: str
    status: int


@pytest.fixture(scope="session")
def mypy_run(tmp_path_factory: pytest.TempPathFactory) -> MypyRun:
    """mypy over all snippets, once: about a second with a cold cache."""
    cache = tmp_path_factory.mktemp("mypy-cache")
    stdout, stderr, status = mypy.api.run(
        [
            "--config-file",
            str(CONFIG),
            "--cache-dir",
            str(cache),
            "--show-absolute-path",
            "--no-error-summary",
            "--no-color-output",
            *(str(path) for path in PASS + FAIL),
        ]
    )
    if status not in (0, 1):  # 2: a crash or a bad config; every snippet test would fail
        pytest.fail(f"mypy could not run (exit {status}):\n{stderr}\n{stdout}", pytrace=False)
    snippets = set(PASS + FAIL)
    messages: dict[Path, list[Message]] = defaultdict(list)
    stray = []
    for raw in stdout.splitlines():
        found = _MESSAGE.match(raw)
        path = Path(found["path"]) if found else None
        if found is None or path not in snippets:
            stray.append(raw)
            continue
        messages[path].append(
            Message(
                int(found["line"]),
                cast(Severity, found["severity"]),  # the regex admits only these
                found["text"],
                found["code"],
            )
        )
    return MypyRun(dict(messages), stray, stderr, status)


def test_mypy_ran_cleanly(mypy_run: MypyRun) -> None:
    """mypy did not crash, warn about its config, or report on anything but the snippets."""
    assert mypy_run.stderr == ""
    assert mypy_run.stray == []
    assert mypy_run.status in (0, 1)


def test_snippets_exist_and_names_are_unique() -> None:
    """Both folders hold snippets; mypy checks them in one run, so module names must differ."""
    assert PASS
    assert FAIL
    names = [path.stem for path in PASS + FAIL]
    assert len(names) == len(set(names)), f"two snippets share a name: {sorted(names)}"


def test_snippet_config_mirrors_the_project() -> None:
    """The snippets are checked with the project's strictness and plugins, plus nothing laxer."""
    project = configparser.ConfigParser()
    project.read(ROOT / "mypy.ini")
    snippets = configparser.ConfigParser()
    snippets.read(CONFIG)
    for option, value in project["mypy"].items():
        if option in {"files", "exclude", "plugins"}:
            continue
        assert snippets["mypy"].get(option) == value, f"mypy.ini option {option!r} differs"

    def plugins(config: configparser.ConfigParser) -> set[str]:
        return {name.strip() for name in config["mypy"]["plugins"].split(",")}

    assert plugins(project) == plugins(snippets)
    assert "typedq.mypy_plugin" in plugins(project)


@pytest.mark.parametrize(
    "snippet", PASS + FAIL, ids=[f"{path.parent.name}/{path.name}" for path in PASS + FAIL]
)
def test_snippet(snippet: Path, mypy_run: MypyRun) -> None:
    """mypy reports exactly the errors, notes and revealed types the snippet expects."""
    source = snippet.read_text()
    expectations = parse_expectations(source)
    errors_expected = [e for e in expectations if e.kind == "E"]
    if snippet in PASS:
        assert not errors_expected, "snippets in pass/ must type-check: move it to fail/"
    else:
        assert errors_expected, "snippets in fail/ must expect at least one `# E:`"

    messages = mypy_run.messages.get(snippet, [])
    unmet, unexpected = unmet_and_unexpected(expectations, messages)
    if unmet or unexpected:
        lines = source.splitlines()

        def code(line: int) -> str:
            return lines[line - 1].strip() if 0 < line <= len(lines) else "<end of file>"

        report = [f"{snippet.relative_to(ROOT)}:"]
        report += [f"  expected but missing: {e}\n      {code(e.line)}" for e in unmet]
        report += [f"  unexpected: {m}\n      {code(m.line)}" for m in unexpected]
        report += ["mypy said about this file:", *(f"  {m}" for m in messages)]
        pytest.fail("\n".join(report), pytrace=False)


def test_expectation_format() -> None:
    """The comment format: several expectations per line, strings with `#` are not comments."""
    source = (
        'x = f()  # E: arg-type "Receipt"; expected  # E: call-arg  # N: forgot to await\n'
        "reveal_type(x)  # R: typedq.job.Job[snip.Receipt]\n"
        "s = '# E: not-a-comment'  # an ordinary comment\n"
        "# E: attr-defined a message too long to trail the code\n"
        "\n"
        "# an ordinary comment\n"
        "y = x.nope  # E: misc\n"
        'z = g()  # E: arg-type "Receipt"  # P: reportCallIssue no overloads  # P: ok why\n'
    )
    assert parse_expectations(source) == [
        Expectation(1, "E", "arg-type", '"Receipt"; expected'),
        Expectation(1, "E", "call-arg", ""),
        Expectation(1, "N", None, "forgot to await"),
        Expectation(2, "R", None, "typedq.job.Job[snip.Receipt]"),
        Expectation(7, "E", "attr-defined", "a message too long to trail the code"),
        Expectation(7, "E", "misc", ""),
        Expectation(8, "E", "arg-type", '"Receipt"'),
        Expectation(8, "P", "reportCallIssue", "no overloads"),
        Expectation(8, "P", "ok", "why"),
    ]
    with pytest.raises(ValueError, match="must start with an error code"):
        parse_expectations("x = 1  # E: Argument 1 has incompatible type\n")
    with pytest.raises(ValueError, match="must start with a pyright rule"):
        parse_expectations("x = 1  # P: arg-type\n")
    with pytest.raises(ValueError, match="must say why"):
        parse_expectations("x = 1  # P: ok\n")

    expected = parse_expectations("x  # E: arg-type Receipt  # R: int  # P: reportCallIssue\n")
    reported = [
        Message(1, "error", "Argument 1 has type Receipt", "arg-type"),
        Message(1, "note", '"enqueue" defined in "typedq.task"', None),
        Message(1, "note", 'Revealed type is "builtins.int"', None),
        Message(2, "error", "Name 'y' is not defined", "name-defined"),
    ]
    unmet, unexpected = unmet_and_unexpected(expected, reported)
    assert unmet == [Expectation(1, "R", None, "int")]
    assert unexpected == [reported[2], reported[3]]
