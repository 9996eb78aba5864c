"""What ``typedq inspect --fair/--debounced/--unique/--streams QUEUE`` and the
dashboard's queue page show of a queue's flow control: one bounded page of its fair keys
with jobs waiting, its debounce keys and their collecting jobs, its unique keys held, or
its job streams (the broker's capability :class:`~typedq.broker.capabilities.FlowViews`).
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import msgspec

from .broker.base import Broker
from .broker.capabilities import FlowViews, supports
from .broker.flowviews import FlowKey, FlowKind
from .errors import Unsupported

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["FlowKeysView", "flow_keys_view", "render_flow_keys"]

#: The CLI's option per kind, for titles and messages.
OPTION: dict[FlowKind, str] = {
    "fair": "--fair",
    "debounce": "--debounced",
    "unique": "--unique",
    "stream": "--streams",
}


class FlowKeysView(msgspec.Struct, frozen=True):
    """One page of ``queue``'s keys of ``kind``; ``cursor`` continues it
    (``--cursor``), None when there are no more."""

    queue: str
    kind: FlowKind
    keys: list[FlowKey]
    cursor: str | None


async def flow_keys_view(
    broker: Broker, queue: str, kind: FlowKind, *, limit: int = 20, cursor: str | None = None
) -> FlowKeysView:
    """Read one page (at most ``limit`` keys) of ``queue``'s ``kind`` keys.

    :raises Unsupported: the broker has no flow-control views
    """
    if not supports(broker, FlowViews):
        raise Unsupported(f"broker {type(broker).__name__} cannot list flow-control keys")
    page = await broker.flow_keys(queue, kind, cursor=cursor, limit=limit)
    return FlowKeysView(queue, kind, page.keys, page.cursor)


def until_text(when: float | None, now: float) -> str:
    """A key's ``until`` for people: its time and how far off, '-' for none."""
    if when is None or not math.isfinite(when):
        return "-"
    stamp = datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%d %H:%M:%S")
    left = when - now
    return f"{stamp} (in {left:.0f}s)" if left >= 0 else f"{stamp} ({-left:.0f}s ago)"


def render_flow_keys(console: Console, view: FlowKeysView) -> None:
    """Draw ``view`` as a table (plain text: keys are the app's data, never markup)."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    what = {"fair": "fair keys with jobs waiting", "debounce": "debounced keys",
            "unique": "unique keys held", "stream": "job streams"}[view.kind]  # fmt: skip
    if not view.keys:
        console.print(Text(f"no {what} in queue {view.queue!r}"))
    else:
        now = time.time()
        table = Table(
            title=Text(f"{what} in queue {view.queue!r}"),
            title_justify="left",
            box=box.SIMPLE_HEAD,
            pad_edge=False,
        )
        if view.kind == "stream":
            table.add_column("job", no_wrap=True)
            table.add_column("entries", justify="right")
            table.add_column("readers waiting", justify="right")
            for key in view.keys:
                readers = "?" if key.readers is None else str(key.readers)
                table.add_row(Text(key.job_id), Text(str(key.waiting)), Text(readers))
            console.print(table)
            if view.cursor is not None:
                console.print(Text(f"more: --streams {view.queue} --cursor {view.cursor}"))
            return
        table.add_column("task", no_wrap=True)
        table.add_column("key", overflow="fold", ratio=1)
        if view.kind == "fair":
            table.add_column("waiting", justify="right")
            table.add_column("weight", justify="right")
            table.add_column("priority", justify="right")
        else:
            table.add_column("job", no_wrap=True)
            table.add_column("runs at" if view.kind == "debounce" else "window ends")
        for key in view.keys:
            if view.kind == "fair":
                weight = "?" if key.weight is None else str(key.weight)
                cells = [str(key.waiting), weight, str(key.priority)]
            else:
                ends = until_text(key.until, now)
                if view.kind == "unique" and key.until is None:
                    ends = "after the job finishes"
                cells = [key.job_id, ends]
            table.add_row(Text(key.task), Text(key.key), *(Text(c) for c in cells))
        console.print(table)
    if view.cursor is not None:
        console.print(Text(f"more: {OPTION[view.kind]} {view.queue} --cursor {view.cursor}"))
