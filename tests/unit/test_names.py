"""The id grammar, key-derived ids, and the ranges of numeric options (no broker needed).

Issue 7, defect 9: key-derived ids were ``<task>.<key>``, so task ``a`` with key ``b.c``
and task ``a.b`` with key ``c`` shared the id ``a.b.c``; they are now ``<task>:<key>``
(task names hold no ``:``). Defect 6: ``@app.task`` and ``Producer.task`` options and
per-call numbers are range-checked with a clear one-line ``InvalidOption``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support import In, Out
from typedq import App, ConfigError, InvalidName, InvalidOption, Producer
from typedq.broker.base import JobMessage
from typedq.names import check_job_id, key_job_id
from typedq.options import (
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_SECONDS,
    MIN_PRIORITY,
    check_message,
)

# -- job ids -----------------------------------------------------------------------------


@pytest.mark.parametrize("good", ["order:123", "a:b:c", "x", "0", "a.b-c_d:e", "j" * 200])
def test_job_ids_may_hold_colons(good: str) -> None:
    assert check_job_id(good) == good


@pytest.mark.parametrize(
    "bad",
    [":lead", "", "{x}", "a{b}", "has space", "tab\tx", "new\nline", "nul\x00", "star*",
     "q?", "[ab]", "é", "j" * 201, 7],
)  # fmt: skip
def test_job_ids_refuse_braces_globs_whitespace_and_control_bytes(bad: object) -> None:
    with pytest.raises(InvalidName, match=r"A-Z a-z 0-9 _ \. : -") as info:
        check_job_id(bad)
    assert "\n" not in str(info.value)


def test_key_ids_of_two_tasks_never_collide() -> None:
    assert key_job_id("a", "b.c") == "a:b.c"
    assert key_job_id("a.b", "c") == "a.b:c"
    assert key_job_id("a", "b.c") != key_job_id("a.b", "c")
    assert key_job_id("orders", "customer:7") == "orders:customer:7"


def test_key_ids_outside_the_grammar_are_hashed_deterministically() -> None:
    odd = key_job_id("send", "a@b.c")
    assert odd == key_job_id("send", "a@b.c")
    assert odd.startswith("send:h")
    assert len(odd) == len("send:h") + 32
    assert check_job_id(odd) == odd
    assert key_job_id("send", "x" * 300).startswith("send:h")  # too long
    assert key_job_id("other", "a@b.c") != odd  # the task is part of the id
    # A key that looks like a digest is hashed too, so it cannot pose as another's hash.
    digest = odd.removeprefix("send:")
    assert key_job_id("send", digest) != odd
    assert key_job_id("send", digest).startswith("send:h")


# -- numeric options -----------------------------------------------------------------------

BAD_CALLS: list[tuple[str, Any]] = [
    ("delay", math.nan),
    ("delay", math.inf),
    ("delay", -1),
    ("delay", timedelta(seconds=-1)),
    ("delay", MAX_SECONDS * 2),
    ("delay", "5"),
    ("eta", math.inf),
    ("eta", math.nan),
    ("eta", -1.0),
    ("eta", datetime(2200, 1, 1, tzinfo=UTC)),
    ("eta", datetime(2030, 1, 1)),  # naive
    ("priority", 2**64),
    ("priority", MAX_PRIORITY + 1),
    ("priority", MIN_PRIORITY - 1),
    ("priority", True),
    ("priority", 1.5),
    ("retries", -1),
    ("retries", MAX_RETRIES + 1),
    ("retries", 2.0),
    ("timeout", 0),
    ("timeout", -1),
    ("timeout", math.nan),
    ("timeout", math.inf),
]


@pytest.mark.parametrize(("option", "value"), BAD_CALLS)
def test_bad_numbers_are_refused_before_anything_is_sent(option: str, value: Any) -> None:
    """``task.message`` (what enqueue sends) refuses them; no broker is even connected."""
    app = App("names", broker="memory://")

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(InvalidOption) as info:
        echo.message(In(1), **{option: value})
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("task 'echo': ")
    assert f"{option}=" in text
    assert ("naive" in text) or ("use " in text)  # says how to fix it
    assert isinstance(info.value, ConfigError | ValueError)


def test_bounds_themselves_are_accepted() -> None:
    app = App("names", broker="memory://")

    @app.task
    async def echo(x: In) -> Out:
        return Out(x.n)

    top = echo.message(
        In(1), priority=MAX_PRIORITY, retries=MAX_RETRIES, timeout=MAX_SECONDS, delay=MAX_SECONDS
    )
    assert (top.priority, top.max_retries, top.timeout, top.delay) == (
        MAX_PRIORITY,
        MAX_RETRIES,
        MAX_SECONDS,
        MAX_SECONDS,
    )
    assert echo.message(In(1), priority=MIN_PRIORITY, eta=MAX_SECONDS).eta == MAX_SECONDS
    assert echo.message(In(1), delay=timedelta(minutes=1)).delay == 60.0
    assert echo.message(In(1), timeout=None).timeout == 0.0  # no limit for this job
    past = echo.message(In(1), eta=datetime(2001, 1, 1, tzinfo=UTC))
    assert past.eta == datetime(2001, 1, 1, tzinfo=UTC).timestamp()  # runs at once


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("priority", 2**64),
        ("priority", True),
        ("retries", -1),
        ("retries", 2**40),
        ("timeout", math.nan),
        ("timeout", 0),
        ("timeout", math.inf),
    ],
)
def test_task_options_are_range_checked(option: str, value: Any) -> None:
    app = App("names", broker="memory://")

    async def handler(x: In) -> Out:
        return Out(x.n)

    with pytest.raises(InvalidOption, match=f"task 'handler': {option}="):
        app.task(**{option: value})(handler)
    producer = Producer("names")
    with pytest.raises(InvalidOption, match=f"task 'stub': {option}="):
        producer.task("stub", In, Out, **{option: value})


@pytest.mark.parametrize(
    "fields",
    [
        {"priority": 2**64},
        {"eta": math.nan},
        {"delay": math.inf},
        {"max_retries": -2},
        {"timeout": -0.5},
        {"timeout": math.nan},
        {"rate_key": "a|b"},
        {"concurrency_key": "x" * 201},
        {"concurrency_key": "{tag}"},
    ],
)
def test_hand_built_envelopes_are_checked(fields: dict[str, Any]) -> None:
    """``Client.enqueue`` / ``enqueue_many`` check envelopes built without a task."""
    message = JobMessage(id="order:1", task="t", queue="q", payload=b"", **fields)
    with pytest.raises(InvalidOption, match=r"job 'order:1' of task 't': "):
        check_message(message)


def test_hand_built_envelope_defaults_pass() -> None:
    message = JobMessage(id="order:1", task="t", queue="q", payload=b"")
    assert check_message(message) is message  # max_retries=-1, timeout=-1: the task's own
    with pytest.raises(InvalidName):
        check_message(JobMessage(id="a b", task="t", queue="q", payload=b""))
