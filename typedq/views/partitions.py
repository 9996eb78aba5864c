"""Partitioned queues in inspection: a partition's name (``<queue>.p<n>``) and the counts
of a partitioned queue summed over its partitions (``typedq inspect``, the dashboard)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..broker.base import JobState

__all__ = ["partition_of", "partition_totals"]

_PARTITION = re.compile(r"(.+)\.p(0|[1-9][0-9]{0,2})")


def partition_of(queue: str) -> tuple[str, int] | None:
    """``("emails", 3)`` for ``emails.p3`` (a partition's name), else None."""
    match = _PARTITION.fullmatch(queue)
    return None if match is None else (match[1], int(match[2]))


def partition_totals(
    counts: Mapping[str, Mapping[JobState, int]],
) -> dict[str, tuple[int, dict[JobState, int], str]]:
    """The counts of each partitioned queue summed over its partitions (those of ``counts``
    named ``<queue>.p<n>``, at least two): ``{queue: (partitions, counts, last partition
    in sorted order)}``."""
    groups: dict[str, list[str]] = {}
    for queue in counts:
        parent = partition_of(queue)
        if parent is not None:
            groups.setdefault(parent[0], []).append(queue)
    totals: dict[str, tuple[int, dict[JobState, int], str]] = {}
    for name, members in groups.items():
        if len(members) < 2:
            continue
        summed: dict[JobState, int] = {}
        for member in members:
            for state, n in counts[member].items():
                summed[state] = summed.get(state, 0) + n
        totals[name] = (len(members), summed, max(members))
    return totals
