"""Relative links in the README and docs/ point at files that exist, and at headings that
exist in them (GitHub's anchors), so a newcomer following them never lands nowhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    headings = re.findall(r"^#+ (.*)$", _without_code(markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def _without_code(markdown: str) -> str:
    return re.sub(r"^```.*?^```$", "", markdown, flags=re.DOTALL | re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", _without_code(page.read_text())):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = link.partition("#")
        target = (page.parent / path) if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target.read_text()):
            broken.append(f"{link}: no heading with that anchor")
    assert not broken, broken
