"""Retry backoff policies."""

from __future__ import annotations

import pytest

from typedq import Backoff, InvalidOption


def test_exponential_doubles_then_caps() -> None:
    policy = Backoff(base=1.0, factor=2.0, max=10.0, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert policy.delay(10_000) == 10.0  # no float overflow for huge retry counts


def test_fixed_is_constant_and_not_capped_by_max() -> None:
    policy = Backoff(kind="fixed", base=600.0, jitter=0.0)
    assert {policy.delay(n) for n in range(1, 20)} == {600.0}


def test_jitter_only_takes_time_off() -> None:
    policy = Backoff(kind="fixed", base=10.0, jitter=0.5)
    delays = [policy.delay(1) for _ in range(500)]
    assert all(5.0 <= d <= 10.0 for d in delays)
    assert len(set(delays)) > 100  # actually random


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1.0},
        {"max": -1.0},
        {"factor": 0.5},
        {"jitter": 1.5},
        {"jitter": -0.1},
        # Not finite (issue 7, defect 6): NaN passed every `< 0` check.
        {"base": float("nan")},
        {"base": float("inf")},
        {"max": float("inf")},
        {"max": float("nan")},
        {"factor": float("nan")},
        {"factor": float("inf")},
        {"jitter": float("nan")},
    ],
)
def test_invalid_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidOption, match="Backoff needs"):  # a ValueError too
        Backoff(**kwargs)  # type: ignore[arg-type]
