"""Fair(...) options checked when the task is declared, and the envelope it makes."""

from __future__ import annotations

import msgspec
import pytest

from typedq import App, ConfigError, Fair, InvalidOption


class Work(msgspec.Struct, frozen=True):
    tenant: str
    n: int = 0


@pytest.mark.parametrize(
    ("fair", "fragment"),
    [
        (Fair(key=lambda w: w.tenant, default_weight=0), "default_weight must be an int"),
        (Fair(key=lambda w: w.tenant, default_weight=True), "default_weight must be an int"),
        (Fair(key=lambda w: w.tenant, weights={"big": 0}), "the weight of key 'big'"),
        (Fair(key=lambda w: w.tenant, weights={"big": 2.5}), "the weight of key 'big'"),  # type: ignore[dict-item]
        (Fair(key=lambda w: w.tenant, weights={"big": 10_001}), "from 1 to 10000"),
        (Fair(key="tenant"), "key must be a function"),  # type: ignore[arg-type]
        ("tenant", "fair= takes a typedq.Fair"),
    ],
)
def test_bad_fair_options_are_refused(fair: object, fragment: str) -> None:
    app = App("fair-bad", broker="memory://")
    with pytest.raises(ConfigError, match=fragment):

        @app.task(fair=fair)  # type: ignore[call-overload,untyped-decorator]
        async def work(w: Work) -> None:
            pass


def test_fair_with_partitions_is_refused() -> None:
    app = App("fair-parts", broker="memory://")
    with pytest.raises(ConfigError, match="fair= cannot be combined with partitions=4"):

        @app.task(fair=Fair(key=lambda w: w.tenant), partitions=4)
        async def work(w: Work) -> None:
            pass


def test_the_envelope_carries_the_key_and_its_weight() -> None:
    app = App("fair-env", broker="memory://")

    @app.task(fair=Fair(key=lambda w: w.n, weights={7: 5}, default_weight=2))
    async def work(w: Work) -> None:
        pass

    assert (work.message(Work("x", 7)).fair_key, work.message(Work("x", 7)).fair_weight) == (
        "7",
        5,
    )
    assert work.message(Work("x", 1)).fair_weight == 2
    # Keys that do not fit a Redis key name are hashed, like limit keys.
    odd = work.message(Work("x", 3))
    assert odd.fair_key == "3"
    assert repr(Fair(key=len, weights={"a": 2})) == "Fair(key=..., weights={'a': 2})"


def test_a_key_function_returning_no_str_or_int_is_an_invalid_option() -> None:
    app = App("fair-key", broker="memory://")

    @app.task(fair=Fair(key=lambda w: None))  # type: ignore[arg-type,return-value]
    async def work(w: Work) -> None:
        pass

    with pytest.raises(InvalidOption, match="a fair key function must return a str or an int"):
        work.message(Work("x"))


def test_plain_tasks_are_not_fair() -> None:
    app = App("fair-plain", broker="memory://")

    @app.task
    async def work(w: Work) -> None:
        pass

    message = work.message(Work("x"))
    assert (message.fair_key, message.fair_weight) == ("", 0)
