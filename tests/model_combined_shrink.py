"""Delta debugging for the combined model check (issue 24): the shortest program found
that still fails, by removing chunks of steps while the mismatch persists (ddmin)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


async def shrink(
    steps: Sequence[T], fails: Callable[[list[T]], Awaitable[bool]], budget: int = 60
) -> list[T]:
    """A sub-sequence of ``steps`` on which ``fails`` still answers True, 1-minimal within
    ``budget`` runs of ``fails`` (``steps`` itself must fail)."""
    current = list(steps)
    chunks = 2
    runs = 0
    while len(current) > 1 and runs < budget:
        size = max(1, len(current) // chunks)
        removed = False
        for start in range(0, len(current), size):
            candidate = current[:start] + current[start + size :]
            runs += 1
            if candidate and await fails(candidate):
                current = candidate
                chunks = max(chunks - 1, 2)
                removed = True
                break
            if runs >= budget:
                break
        if not removed:
            if size == 1:
                break
            chunks = min(len(current), chunks * 2)
    return current
