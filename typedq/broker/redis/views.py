"""The Redis broker's views of flow control (capability FlowViews,
:mod:`typedq.broker.flowviews`), mixed into RedisBroker.

Each page runs ``lua/flow_keys.lua`` a few times at most: one SCAN step (unique keys
``Q uk:*``, debounce keys ``Q db:*``, job streams ``Q js:*`` with their readers' sets
``Q jr:<id>``) or HSCAN step (fair lanes, the hash ``Q F`` of their weights, with each
lane's length) of
COUNT ``limit`` each, in the queue's slot (on Redis Cluster, the node serving it). So a
page costs in proportion to its limit, never to the keyspace; it may be short, even
empty, before the end (SCAN passes other keys): follow the cursor. A SCAN step may
answer more keys than the page has room for: the cursor then says how many of that
step's keys the page took (``'<scan cursor>|<taken>'``), and the next page runs the
same step again and skips them (SCAN's guarantee holds: a key present for the whole
walk is listed, perhaps twice).
"""

from __future__ import annotations

import re
from typing import Any

from ...names import check_name
from ..base import bad_cursor
from ..flowviews import MAX_FLOW_PAGE, FlowKey, FlowKeyPage, FlowKind
from .codec import as_int, from_us, text
from .core import RedisCore

__all__ = ["ViewOps"]

#: SCAN steps one page runs at most (a step of an idle keyspace finds nothing).
MAX_STEPS = 8

_LETTER = {"unique": "u", "debounce": "d", "fair": "f", "stream": "s"}
_PATTERN = {"u": "uk:*", "d": "db:*", "s": "js:*", "f": ""}
_CURSOR = re.compile(r"(\d{1,20})\|(\d{1,9})")
_GLOB = re.compile(r"([\\*?\[\]])")


class ViewOps(RedisCore):
    """The flow-control views of the Redis broker."""

    async def flow_keys(
        self, queue: str, kind: FlowKind, *, cursor: str | None = None, limit: int = 100
    ) -> FlowKeyPage:
        check_name("queue", queue)
        letter = _LETTER.get(kind)
        if letter is None:
            raise ValueError(
                f"unknown flow-control kind {kind!r}: one of fair, debounce, unique, stream"
            )
        limit = max(0, min(limit, MAX_FLOW_PAGE))
        scan, skip = "0", 0
        if cursor is not None:
            match = _CURSOR.fullmatch(cursor)
            if match is None:
                raise bad_cursor(cursor)
            scan, skip = match[1], int(match[2])
        k = self.keys
        prefix = k.queue_prefix(queue)
        pattern = _GLOB.sub(r"\\\1", prefix) + _PATTERN[letter]
        keys: list[FlowKey] = []
        for _ in range(MAX_STEPS):
            if len(keys) >= limit:
                return FlowKeyPage(keys, f"{scan}|{skip}")
            reply = await self._eval(
                "flow_keys",
                [k.active(queue)],
                [k.prefix, queue, letter, scan, max(10, limit), pattern],
            )
            found = _parse(kind, reply)
            room = limit - len(keys)
            taken = found[skip : skip + room]
            keys += taken
            if skip + len(taken) < len(found):
                return FlowKeyPage(keys, f"{scan}|{skip + len(taken)}")
            scan, skip = text(reply[0]), 0
            if scan == "0":
                return FlowKeyPage(keys, None)
        return FlowKeyPage(keys, f"{scan}|0")


def _parse(kind: FlowKind, reply: list[Any]) -> list[FlowKey]:
    now_us = as_int(reply[1])
    rows = reply[2:]
    out: list[FlowKey] = []
    if kind == "fair":
        for i in range(0, len(rows), 3):
            prio, _, marker = text(rows[i]).partition("|")
            task, _, key = marker.partition("|")
            waiting = as_int(rows[i + 1])
            weight = as_int(rows[i + 2])
            if waiting:
                out.append(
                    FlowKey(
                        kind="fair",
                        task=task,
                        key=key,
                        waiting=waiting,
                        priority=int(prio),
                        weight=weight if weight > 0 else None,
                    )
                )
        return out
    if kind == "stream":
        for i in range(0, len(rows), 3):
            out.append(
                FlowKey(
                    kind="stream",
                    task="",
                    key="",
                    job_id=text(rows[i]),
                    waiting=as_int(rows[i + 1]),
                    readers=as_int(rows[i + 2]),
                )
            )
        return out
    for i in range(0, len(rows), 3):
        task, _, key = text(rows[i]).partition("|")
        job_id = text(rows[i + 1])
        if kind == "unique":
            left_ms = as_int(rows[i + 2])
            until = None if left_ms < 0 else from_us(now_us + left_ms * 1000)
        else:
            at = float(text(rows[i + 2]))
            until = None if at < 0 else from_us(int(at))
        out.append(FlowKey(kind=kind, task=task, key=key, job_id=job_id, until=until))
    return out
