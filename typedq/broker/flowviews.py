"""What ``typedq inspect`` and the dashboard show of a queue's flow control
(capability :class:`~typedq.broker.capabilities.FlowViews`, docs/flow-control.md,
"Inspecting flow control"): its fair keys with jobs waiting, its debounce keys and the
jobs collecting them, and the unique keys held, one bounded page at a time.
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["FLOW_KINDS", "FlowKey", "FlowKeyPage", "FlowKind"]

#: The kinds of keys :meth:`flow_keys` pages: fair shares, debounce windows, unique windows.
FlowKind = Literal["fair", "debounce", "unique", "stream"]
FLOW_KINDS: tuple[FlowKind, ...] = ("fair", "debounce", "unique", "stream")

#: The most keys one page holds (a larger ``limit`` is cut to it).
MAX_FLOW_PAGE = 1000


class FlowKey(msgspec.Struct, frozen=True, kw_only=True):
    """One key of a queue's flow control.

    - ``fair``: a fair key with jobs waiting: ``waiting`` entries in its lane at level
      ``priority`` (an upper bound: an entry of a job that moved on is dropped when its
      turn comes), and the jobs its next turn takes (``weight``: its newest job's, see
      docs/flow-control.md; None where the broker cannot tell).
    - ``debounce``: the key's collecting job ``job_id``; ``until`` is when the job runs
      (None: it is no longer scheduled, e.g. it started).
    - ``unique``: the job ``job_id`` holding the key; ``until`` is when the window ends
      (the job completed), None while the job has not finished.
    - ``stream``: the stream of job ``job_id`` (``emits=``, typedq.streams; ``task`` and
      ``key`` empty): ``waiting`` is the entries it keeps now (its current run's items,
      at most 10,000, plus the end entry once the job is final); ``readers`` is how many
      ``job.stream()`` readers read it now (registered with their reads, until they end,
      close, or stop reading for :data:`~typedq.broker.streams.READER_TTL`; None where
      the broker does not count them).
    """

    kind: FlowKind
    task: str
    key: str
    job_id: str = ""
    waiting: int = 0
    priority: int = 0
    weight: int | None = None
    until: float | None = None
    readers: int | None = None


class FlowKeyPage(msgspec.Struct, frozen=True):
    """One page of :meth:`flow_keys`: ``keys``, and the ``cursor`` that continues after
    them (None: no more). Keys come in the broker's own order (no sorting: a page costs
    in proportion to its limit); a key that stays for the whole walk is listed at least
    once, and one that comes and goes may be listed again or not at all."""

    keys: list[FlowKey]
    cursor: str | None
