"""typedq.bulk without a broker: durations of ``--since``."""

from __future__ import annotations

import pytest

from typedq.bulk import parse_since
from typedq.errors import ConfigError


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
