"""typedq.bulk without a broker: durations of ``--since``, ``--where`` values parsed by
the field's type (msgspec and Pydantic models), the filter in words."""

from __future__ import annotations

import datetime
import enum
from typing import Any

import msgspec
import pydantic
import pytest

from typedq import App, JobState
from typedq.bulk import JobFilter, Where, describe_filter, parse_since, parse_where
from typedq.errors import ConfigError
from typedq.task import TaskBase


def test_since_parses_durations() -> None:
    assert parse_since("90s") == 90
    assert parse_since("30m") == 1800
    assert parse_since("1h") == 3600
    assert parse_since("2d") == 172800
    assert parse_since("1w") == 604800
    assert parse_since("1.5h") == 5400
    assert parse_since("45") == 45


@pytest.mark.parametrize("bad", ["", "h", "1y", "-1h", "1 hour", "1h30m"])
def test_a_bad_duration_is_one_line(bad: str) -> None:
    with pytest.raises(ConfigError, match="is not a duration: use a number and a unit"):
        parse_since(bad)


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Inner(pydantic.BaseModel):
    code: int


class Ticket(pydantic.BaseModel):
    n: int
    inner: Inner | None = None
    tags: list[str] = []


class Paint(msgspec.Struct, frozen=True):
    color: Color
    at: datetime.datetime
    sizes: list[int]
    label: str | None = None
    ratio: float = 1.0


def make_tasks() -> tuple[TaskBase[Any, Any], TaskBase[Any, Any]]:
    app = App("units")

    @app.task
    async def paint(p: Paint) -> None:
        return None

    @app.task
    async def ticket(t: Ticket) -> None:
        return None

    return paint, ticket


def test_where_values_are_parsed_by_the_field_type() -> None:
    paint, ticket = make_tasks()
    assert parse_where(paint, "color=red").value is Color.RED
    assert parse_where(paint, "at=2026-01-02T03:04:05Z").value == datetime.datetime(
        2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC
    )
    assert parse_where(paint, "sizes=[1, 2]").value == [1, 2]
    assert parse_where(paint, "label=null").value is None
    assert parse_where(paint, "label=x=y").value == "x=y"  # the first = splits
    assert parse_where(paint, "ratio=2").value == 2.0
    assert parse_where(ticket, "n=7").value == 7
    assert parse_where(ticket, "inner.code=3") == Where(
        path=("inner", "code"), text="inner.code=3", value=3
    )
    assert parse_where(ticket, 'tags=["a"]').value == ["a"]
    with pytest.raises(ConfigError, match="color is Color; 'green' is not one"):
        parse_where(paint, "color=green")
    with pytest.raises(
        ConfigError,
        match=r"Inner \(task 'ticket', at inner\) has no field 'x'; "
        r"its fields: code",
    ):
        parse_where(ticket, "inner.x=1")
    with pytest.raises(ConfigError, match=r"inner\.code of task 'ticket' is not a model"):
        parse_where(ticket, "inner.code.deep=1")


def test_the_filter_in_words() -> None:
    assert describe_filter(JobFilter()) == "failed jobs"
    words = describe_filter(JobFilter(task="t", error_type="E", since=3600, where=("a=1", "b=2")))
    assert (
        words == "failed jobs, of task t, with error E, finished in the last 1h, where a=1 and b=2"
    )
    waiting = describe_filter(JobFilter(state=JobState.WAITING, since=90))
    assert waiting == "waiting jobs, enqueued in the last 90s"
