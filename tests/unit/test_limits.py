"""Limit declarations: bad values fail at declaration, naming the task and the fix."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.support import In, Out
from typedq import App, ConcurrencyLimit, ConfigError, RateLimit, RateLimited
from typedq.cli import load_app
from typedq.limits import LimitSpec
from typedq.stubgen import generate


class Tenant(msgspec.Struct, frozen=True):
    tenant: str


@pytest.mark.parametrize(
    ("limit", "fragment"),
    [
        (RateLimit(0), "limit must be an int from 1"),
        (RateLimit(-5), "limit must be an int from 1"),
        (RateLimit(2.5), "limit must be an int from 1"),  # type: ignore[arg-type]
        (RateLimit("5"), "limit must be an int from 1"),  # type: ignore[arg-type]
        (RateLimit(True), "limit must be an int from 1"),
        (RateLimit(5, per=0), "per must be a number of seconds above 0"),
        (RateLimit(5, per=-1.0), "per must be a number of seconds above 0"),
        (RateLimit(5, per=float("nan")), "per must be a number of seconds above 0"),
        (RateLimit(5, per=float("inf")), "per must be a number of seconds above 0"),
        (RateLimit(5, per="1"), "per must be a number of seconds"),  # type: ignore[arg-type]
        (RateLimit(5, burst=-1), "burst must be an int from 0"),
        (RateLimit(5, key="tenant"), "key must be a function"),  # type: ignore[arg-type]
    ],
)
def test_bad_rate_limits_fail_at_declaration(limit: RateLimit[Any], fragment: str) -> None:
    app = App("limits")
    with pytest.raises(ConfigError) as info:

        @app.task(rate_limit=limit)
        async def call(x: In) -> Out:
            return Out(x.n)

    message = str(info.value)
    assert "task 'call'" in message
    assert fragment in message
    assert "call" not in app.tasks


@pytest.mark.parametrize(
    ("limit", "fragment"),
    [
        (ConcurrencyLimit(0), "limit must be an int from 1"),
        (ConcurrencyLimit(-1), "limit must be an int from 1"),
        (ConcurrencyLimit(1.0), "limit must be an int from 1"),  # type: ignore[arg-type]
        (ConcurrencyLimit(2, key=3), "key must be a function"),  # type: ignore[arg-type]
    ],
)
def test_bad_concurrency_limits_fail_at_declaration(
    limit: ConcurrencyLimit[Any], fragment: str
) -> None:
    app = App("limits")
    with pytest.raises(ConfigError) as info:

        @app.task(concurrency=limit)
        async def ship(x: In) -> Out:
            return Out(x.n)

    assert "task 'ship'" in str(info.value)
    assert fragment in str(info.value)


def test_a_limit_option_of_the_wrong_kind_is_named() -> None:
    app = App("limits")
    with pytest.raises(ConfigError, match=r"task 'call': rate_limit= takes a typedq\.RateLimit"):

        @app.task(rate_limit=100)  # type: ignore[call-overload, untyped-decorator]
        async def call(x: In) -> Out:
            return Out(x.n)

    with pytest.raises(ConfigError, match=r"concurrency= takes a typedq\.ConcurrencyLimit"):

        @app.task(concurrency=RateLimit(2))  # type: ignore[call-overload, untyped-decorator]
        async def other(x: In) -> Out:
            return Out(x.n)


def test_keys_are_computed_at_the_producer_and_carried_in_the_envelope() -> None:
    app = App("limits")

    @app.task(
        rate_limit=RateLimit(5, per=1.0, key=lambda m: m.tenant),
        concurrency=ConcurrencyLimit(2, key=lambda m: len(m.tenant)),
    )
    async def call(x: Tenant) -> None:
        return None

    message = call.message(Tenant("acme"))
    assert message.rate_key == "acme"
    assert message.concurrency_key == "4"
    # Any value becomes a bounded, key-safe name: readable when it can be, else hashed.
    odd = call.message(Tenant("a b{c}|" * 40))
    assert odd.rate_key.startswith("h")
    assert len(odd.rate_key) == 33


def test_a_key_function_must_return_a_str_or_an_int() -> None:
    app = App("limits")

    @app.task(rate_limit=RateLimit(5, key=lambda m: [m.tenant]))  # type: ignore[arg-type,return-value]
    async def call(x: Tenant) -> None:
        return None

    with pytest.raises(TypeError, match="must return a str or an int, got list"):
        call.message(Tenant("acme"))


def test_the_broker_spec_of_a_rate_limit() -> None:
    spec = LimitSpec.of(RateLimit(3, per=0.25, burst=2), ConcurrencyLimit(4))
    assert spec == LimitSpec(rate=5, per_us=250_000, concurrency=4)
    assert LimitSpec.of(None, ConcurrencyLimit(1)) == LimitSpec(concurrency=1)
    assert LimitSpec.of(None, None) is None


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1"])
def test_rate_limited_needs_a_finite_delay(bad: Any) -> None:
    with pytest.raises(ValueError, match="finite number >= 0"):
        RateLimited(retry_after=bad)


def test_stubs_say_that_they_cannot_compute_limit_keys() -> None:
    text = generate(
        load_app("tests.stubfix.limited:app"), target="tests.stubfix.limited:app", out="x.py"
    )
    note = "# The worker limits this task per key (concurrency); a stub cannot compute keys"
    assert text.count(note) == 1
    # The note sits on the keyed task only (just above it), not on the task-wide one.
    lines = text.splitlines()
    hold = next(i for i, line in enumerate(lines) if line.startswith("hold: TaskStub["))
    assert any(line.startswith(note) for line in lines[hold - 3 : hold])
