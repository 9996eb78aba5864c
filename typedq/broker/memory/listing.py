"""Listing a queue's jobs of one state, in the state's order, by offset or by cursor.

A page cursor is the place of the last job listed, ``<letter><number>:<order>:<id>`` in
the state's order: the next page goes on after that place, wherever the jobs before it
went meanwhile, so a job that stays in the state is listed once. A page costs one pass
over the queue's jobs (no sort of the whole state).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from ..base import JobList, JobState, bad_cursor
from .jobs import SCHEDULED, WAITING, JobTable

__all__ = ["list_ids", "page", "places"]

#: A job's place in its state's order: (number, order, id).
Place = tuple[float, int, str]

#: The letter that starts a page cursor of each state (a cursor of another state is refused).
CURSOR_LETTERS = {state: "wsacfx"[i] for i, state in enumerate(JobState)}


def cursor_place(cursor: str, letter: str) -> Place:
    """The place a cursor of state ``letter`` names."""
    parts = cursor[1:].split(":", 2)
    if cursor[:1] != letter or len(parts) != 3 or not parts[2]:
        raise bad_cursor(cursor)
    try:
        a = float(parts[0]) if "." in parts[0] or "e" in parts[0] else int(parts[0])
        b = int(parts[1])
    except ValueError:
        raise bad_cursor(cursor) from None
    if a != a or a in (float("inf"), float("-inf")):
        raise bad_cursor(cursor)
    return (a, b, parts[2])


def places(
    table: JobTable, finished: dict[JobState, OrderedDict[str, float]], queue: str, state: JobState
) -> list[Place]:
    """The jobs of ``queue`` in ``state`` as places in the state's order: waiting
    (-priority, order), scheduled (due time, order), active (start time, order),
    final states most recently finished first (-version: a job's version is set when
    it finishes and stays while it is finished), each with its id. Final states come
    in order; the others unsorted."""
    jobs = table.jobs
    if state.is_final:
        return [
            (-jobs[job_id].version, 0, job_id)
            for job_id in reversed(finished[state])
            if jobs[job_id].message.queue == queue
        ]
    jobs_in = [j for j in jobs.values() if j.message.queue == queue and j.state is state]
    if state is WAITING:
        return [(-j.message.priority, j.order, j.message.id) for j in jobs_in]
    if state is SCHEDULED:
        return [(j.run_at, j.order, j.message.id) for j in jobs_in]
    return [(j.started_at, j.order, j.message.id) for j in jobs_in]


def list_ids(listed: list[Place], state: JobState, offset: int, limit: int) -> list[str]:
    """The ids of places ``offset`` to ``offset + limit`` in the state's order."""
    if not state.is_final:
        listed.sort()
    return [key[2] for key in listed[offset : offset + limit]]


def page(listed: list[Place], state: JobState, cursor: str | None, limit: int) -> JobList:
    """The page of at most ``limit`` (up to 1000) ids after ``cursor``'s place."""
    letter = CURSOR_LETTERS[state]
    after = None if cursor is None else cursor_place(cursor, letter)
    limit = max(0, min(limit, 1000))
    if after is not None:
        listed = [place for place in listed if place > after]
    # Final states come in order; the others are taken smallest first.
    taken = listed[: limit + 1] if state.is_final else heapq.nsmallest(limit + 1, listed)
    ids = [place[2] for place in taken[:limit]]
    if len(taken) <= limit or not ids:
        return JobList(ids, None)
    a, b, last = taken[limit - 1]
    return JobList(ids, f"{letter}{a!r}:{b}:{last}")
