"""The embedded broker's views of flow control (capability FlowViews,
:mod:`typedq.broker.flowviews`): pages of a queue's fair keys, debounce keys and
unique keys held.

A cursor is a position in the broker's own order (the markers' insertion order; the
fair turns level by level): a page examines at most ``SCAN_FACTOR * limit`` entries
past it, so a page is bounded by its limit, never by the number of keys (markers of
other queues are passed over and counted; a page may then be short before the end).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

from ..base import cursor_position
from ..flowviews import MAX_FLOW_PAGE, FlowKey, FlowKeyPage, FlowKind
from ..messages import JobState

if TYPE_CHECKING:
    from .core import JobPath

__all__ = ["flow_keys"]

#: Entries one page examines per key it may answer (markers of other queues and ended
#: windows are passed over).
SCAN_FACTOR = 10


def flow_keys(
    path: JobPath, queue: str, kind: FlowKind, cursor: str | None, limit: int
) -> FlowKeyPage:
    """One page of ``queue``'s keys of ``kind`` (see the module docstring)."""
    start = cursor_position(cursor)
    limit = max(0, min(limit, MAX_FLOW_PAGE))
    if kind == "fair":
        source = _fair(path, queue)
    elif kind == "debounce":
        source = _debounced(path, queue)
    elif kind == "unique":
        source = _unique(path, queue)
    elif kind == "stream":
        source = _streams(path, queue)
    else:
        raise ValueError(
            f"unknown flow-control kind {kind!r}: one of fair, debounce, unique, stream"
        )
    keys: list[FlowKey] = []
    examined = 0
    budget = max(1, limit) * SCAN_FACTOR
    exhausted = True
    for entry in islice(source, start, None):
        if len(keys) >= limit or examined >= budget:
            exhausted = False
            break
        examined += 1
        if entry is not None:
            keys.append(entry)
    return FlowKeyPage(keys, None if exhausted else str(start + examined))


def _split(marker: str) -> tuple[str, str]:
    task, _, key = marker.partition("|")
    return task, key


def _fair(path: JobPath, queue: str) -> Iterator[FlowKey | None]:
    line = path.lines.waiting.get(queue)
    if line is None:
        return
    for neg_priority in line.keys:
        level = line.levels.get(neg_priority)
        if level is None:
            continue
        for (task, key), turn in level.turns.items():
            waiting = len(turn.lane.fifo) + len(turn.lane.late)
            if not waiting:
                yield None
                continue
            yield FlowKey(
                kind="fair",
                task=task,
                key=key,
                waiting=waiting,
                priority=-neg_priority,
                weight=turn.next_weight,
            )


def _debounced(path: JobPath, queue: str) -> Iterator[FlowKey | None]:
    jobs = path.table.jobs
    for marker, job_id in path.control.debounced.items():
        job = jobs.get(job_id)
        if job is None or job.message.queue != queue or job.state.is_final:
            yield None
            continue
        task, key = _split(marker)
        scheduled = job.state is JobState.SCHEDULED
        yield FlowKey(
            kind="debounce",
            task=task,
            key=key,
            job_id=job_id,
            until=job.run_at if scheduled else None,
        )


def _unique(path: JobPath, queue: str) -> Iterator[FlowKey | None]:
    jobs = path.table.jobs
    now = path.clock.time()
    for marker, (job_id, until) in path.control.unique.items():
        job = jobs.get(job_id)
        if until == math.inf:
            # Held while its job has not finished; a job gone without finishing left a
            # stale marker (the next enqueue replaces it).
            if job is None or job.state.is_final or job.message.queue != queue:
                yield None
                continue
        elif until <= now or job is None or job.message.queue != queue:
            # A window that ended, or one whose job retention removed (its queue unknown
            # here: listed nowhere rather than in the wrong queue).
            yield None
            continue
        task, key = _split(marker)
        yield FlowKey(
            kind="unique",
            task=task,
            key=key,
            job_id=job_id,
            until=None if until == math.inf else until,
        )


def _streams(path: JobPath, queue: str) -> Iterator[FlowKey | None]:
    jobs = path.table.jobs
    now = path.clock.time()
    for job_id, stream in path.streams._streams.items():
        job = jobs.get(job_id)
        if job is None or job.message.queue != queue or stream.expires <= now:
            yield None
            continue
        yield FlowKey(
            kind="stream",
            task="",
            key="",
            job_id=job_id,
            waiting=len(stream.entries),
            readers=path.streams.readers(job_id),
        )
