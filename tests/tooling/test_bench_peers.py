"""The bench's list of peers agrees with itself: every system bench/run.py runs by default has an
adapter, a pinned venv in bench/peers.toml (except typedq and the floors, which run in the
project venv) and a row in bench/README.md's peer table showing the pinned version. Nothing here
installs a peer or runs one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import run

ROOT = Path(__file__).resolve().parents[2]
PEERS = [s for s in run.SYSTEMS if s != "typedq" and s not in run.FLOORS]


def _peer_table() -> dict[str, list[str]]:
    """README's peer table: {first cell, lower case: cells}."""
    lines = (ROOT / "bench" / "README.md").read_text().splitlines()
    start = lines.index("| system | version | enqueue | bulk path | worker process |")
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].lower()] = cells
    return rows


def _pinned_version(requirement: str) -> str:
    match = re.fullmatch(r"[A-Za-z0-9_.-]+(\[[^\]]*\])?==(\S+)", requirement)
    assert match, f"not a pinned requirement: {requirement}"
    return match.group(2)


def test_the_new_peers_are_known_systems() -> None:
    assert {"dramatiq", "rq"} <= set(PEERS)


@pytest.mark.parametrize("system", PEERS)
def test_every_peer_has_an_adapter_a_pinned_venv_and_a_readme_row(system: str) -> None:
    assert (ROOT / "bench" / "adapters" / f"{system}.py").is_file()
    requirements = run.peers()[system]
    # The system's own package comes first and is pinned, so its venv is reproducible.
    version = _pinned_version(requirements[0])
    rows = [cells for name, cells in _peer_table().items() if name.startswith(system)]
    assert len(rows) == 1, f"{system}: {len(rows)} rows in bench/README.md's peer table"
    assert version in rows[0][1], f"{system}: README says {rows[0][1]}, peers.toml pins {version}"
