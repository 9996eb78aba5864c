"""The unit tier's rule, checked at collection: no test here needs a broker process.

A test marked ``redis`` or ``cluster`` (the markers of tests that need a redis-server, and
of the broker-parametrized fixtures' Redis cases) belongs to tests/redis, tests/cluster or
tests/contract, so that ``pytest tests/unit`` runs without any server."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Refuses a unit-tier test that needs a redis-server or the cluster."""
    misplaced = [
        item.nodeid
        for item in items
        if item.path.is_relative_to(HERE)
        and any(item.get_closest_marker(name) for name in ("redis", "cluster"))
    ]
    if misplaced:
        raise pytest.UsageError(
            "tests/unit runs without a redis-server; move these to tests/redis or"
            " tests/cluster: " + ", ".join(misplaced)
        )
