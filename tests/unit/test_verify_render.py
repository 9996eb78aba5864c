"""``typedq verify``'s table (typedq.cli.render.render_verify): how the jobs were counted
(exact, by the broker, or a sample read) and which rows are lower bounds."""

from __future__ import annotations

from rich.console import Console

from typedq.cli.render import render_verify
from typedq.verify import Report, Row


def rendered(report: Report, *, sample: int = 10) -> str:
    console = Console(record=True, width=200, soft_wrap=False)
    render_verify(console, report, sample=sample)
    return console.export_text()


def row(task: str, jobs: int, *, at_least: bool = False) -> Row:
    return Row(
        task=task,
        fingerprint="ddb32316ff34f62c",
        jobs=jobs,
        verdict="compatible",
        source="registry",
        at_least=at_least,
    )


def line_of(text: str, task: str) -> str:
    (line,) = [line for line in text.splitlines() if line.split()[:1] == [task]]
    return line


def test_exact_counts_say_so() -> None:
    text = rendered(
        Report(app="a", rows=[row("place", 1_000_000)], scanned=1_000_000, capped=False, exact=True)
    )
    assert " 1000000 " in line_of(text, "place")
    assert "at least" not in text
    assert "counted 1000000 jobs, every one (exact counts, by the broker)" in text


def test_a_sample_says_so_and_marks_only_the_rows_it_bounded() -> None:
    """A capped run scan makes its rows lower bounds, not the exact job counts."""
    report = Report(
        app="a",
        rows=[row("place", 30), row("run:onboard", 10, at_least=True)],
        scanned=30,
        capped=True,
        runs=10,
        exact=True,
    )
    text = rendered(report)
    assert "at least" not in line_of(text, "place")
    assert "at least 10" in line_of(text, "run:onboard")
    assert "stopped at --sample 10" in text

    sampled = Report(app="a", rows=[row("place", 10, at_least=True)], scanned=10, capped=True)
    text = rendered(sampled)
    assert "at least 10" in line_of(text, "place")
    assert "read 10 jobs (a sample scan: this broker does not count)" in text
