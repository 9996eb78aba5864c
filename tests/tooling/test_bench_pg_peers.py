"""bench/pg_peers.py agrees with itself: every PostgreSQL system it runs has an adapter and
(peers) a pinned venv, oban's venv asks for the Python it requires, and the table it writes
puts typedq's advantage and the best peer where the README says. Nothing here installs a
peer, starts one or touches a database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import pg_peers, run

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("system", pg_peers.SYSTEMS)
def test_every_system_has_an_adapter_and_peers_a_pinned_venv(system: str) -> None:
    module, _env = pg_peers.VARIANTS.get(system, (system, {}))
    assert (ROOT / "bench" / "adapters" / f"pg_{module}.py").is_file()
    if module != "typedq":
        assert "==" in run.peers()[module][0], f"{module}: its own package is pinned first"


def test_oban_gets_the_python_it_requires() -> None:
    assert run.venv_python("oban") == "3.12"
    assert run.venv_python("procrastinate") is None  # the others: this interpreter's own


def test_each_row_names_its_workload() -> None:
    assert pg_peers.params_of("e2e64", 2000, 10) == {
        "workload": "e2e", "n": 2000, "concurrency": 64, "producers": 4, "min_rate": 5,
    }  # fmt: skip
    assert pg_peers.params_of("history0", 2000, 10)["history"] == 0
    assert pg_peers.params_of("history", 2000, 10)["history"] == 10
    assert pg_peers.params_of("bulk", 2000, 10)["workload"] == "bulk"


def _data(cells: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "systems": ["typedq", "oban", "awa"],
        "rows": ["drain"],
        "n": 100,
        "history": 10,
        "medians": {"drain": cells},
    }


def test_the_table_shows_ratios_and_the_best_peer() -> None:
    text = pg_peers.markdown(
        _data(
            {
                "typedq": {"jobs_per_s": 3000.0},
                "oban": {"jobs_per_s": 500.0},
                "awa": {"jobs_per_s": 1000.0},
            }
        )
    )
    row = text.splitlines()[2]
    assert "| 3,000 | 500 (6.00x) | 1,000 (3.00x) | awa 1,000 | 3.00x |" in row


def test_a_failed_peer_is_shown_as_an_error_not_as_a_win() -> None:
    text = pg_peers.markdown(
        _data(
            {
                "typedq": {"jobs_per_s": 3000.0},
                "oban": {"errors": ["boom"]},
                "awa": {"jobs_per_s": 1500.0},
            }
        )
    )
    row = text.splitlines()[2]
    assert "| error |" in row
    assert "awa 1,500 | 2.00x |" in row
