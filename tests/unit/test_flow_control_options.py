"""unique_for= and debounce= are checked when the task is declared: conflicting or
out-of-range options raise ConfigError in one line naming the fix (typedq.flowcontrol)."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import msgspec
import pytest

from typedq import App, ConfigError, Debounce, InvalidOption
from typedq.broker.base import EnqueueControl, JobMessage
from typedq.options import check_controls


class Doc(msgspec.Struct, frozen=True):
    doc: str


def declare(**options: Any) -> Any:
    app = App("fc", broker="memory://")

    async def handler(d: Doc) -> None:
        pass

    return app.task(**options)(handler)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"unique_for": 60}, "unique_for= needs key="),
        ({"key": lambda d: d.doc, "unique_for": 0}, "unique_for=0 must be"),
        ({"key": lambda d: d.doc, "unique_for": -1.0}, "unique_for=-1.0 must be"),
        ({"key": lambda d: d.doc, "unique_for": math.nan}, "unique_for=nan must be"),
        ({"key": lambda d: d.doc, "unique_for": "1h"}, "must be a timedelta or seconds"),
        (
            {"key": lambda d: d.doc, "unique_for": 60, "debounce": Debounce(key=str, wait=1)},
            "do not combine",
        ),
        ({"debounce": Debounce(key=lambda d: d.doc, wait=0)}, "Debounce(wait=0) must be"),
        (
            {"debounce": Debounce(key=lambda d: d.doc, wait=5, max_wait=2)},
            "use a max_wait of at least wait",
        ),
        (
            {"debounce": Debounce(key=lambda d: d.doc, wait=1, max_wait=-3)},
            "Debounce(max_wait=-3) must be",
        ),
        ({"debounce": 2.0}, "debounce= takes a typedq.Debounce"),
        (
            {"key": lambda d: d.doc, "debounce": Debounce(key=lambda d: d.doc, wait=1)},
            "drop the task's key=",
        ),
        (
            {"key": lambda d: d.doc, "unique_for": 60, "partitions": 4},
            "drop partitions=4",
        ),
    ],
)
def test_bad_options_fail_at_declaration(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        declare(**options)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_good_options_are_kept_in_seconds() -> None:
    unique = declare(key=lambda d: d.doc, unique_for=timedelta(hours=1))
    assert unique.flow_control.unique_for == 3600.0
    debounced = declare(
        debounce=Debounce(key=lambda d: d.doc, wait=timedelta(seconds=2), max_wait=30)
    )
    spec = debounced.flow_control
    assert (spec.wait, spec.max_wait, spec.unique_for) == (2.0, 30.0, 0.0)
    assert declare().flow_control is None  # a plain task: no flow control


def test_the_control_carries_a_redis_safe_key() -> None:
    task = declare(key=lambda d: d.doc, unique_for=60)
    assert task.flow_control.control(Doc("a b/c")).key.startswith("h")  # hashed
    assert task.flow_control.control(Doc("ord-1")).key == "ord-1"
    assert task.flow_control.control(Doc("7")).key == "7"
    with pytest.raises(InvalidOption, match="returned an empty key"):
        task.flow_control.control(Doc(""))


def test_a_raising_key_function_is_reported_on_one_line() -> None:
    def key(d: Doc) -> str:
        raise ValueError("first line\nsecond line")

    task = declare(key=key, unique_for=60)
    with pytest.raises(InvalidOption) as info:
        task.flow_control.control(Doc("a"))
    assert "raised ValueError: first line second line; nothing was enqueued" in str(info.value)


def envelope() -> JobMessage:
    return JobMessage(id="j1", task="t", queue="q", payload=b"")


@pytest.mark.parametrize(
    ("control", "message"),
    [
        (EnqueueControl(key=""), "is not a key"),
        (EnqueueControl(key="a b"), "is not a key"),
        (EnqueueControl(key="k"), "not neither"),
        (EnqueueControl(key="k", unique_for=1, wait=1, max_wait=2), "not both"),
        (EnqueueControl(key="k", wait=2, max_wait=1), "passes max_wait"),
        (EnqueueControl(key="k", unique_for=math.inf), "unique_for=inf is out of range"),
    ],
)
def test_a_broker_refuses_a_malformed_control(control: EnqueueControl, message: str) -> None:
    with pytest.raises(InvalidOption, match="job 'j1' of task 't'") as info:
        check_controls([(envelope(), control)])
    assert message in str(info.value)
