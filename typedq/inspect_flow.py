"""The table ``typedq inspect --fair/--debounced/--unique/--streams QUEUE`` draws of a
queue's flow control (with ``rich``, imported when it draws). The page it draws is read
by :mod:`typedq.views.flowkeys` (the dashboard's queue page reads it there too, and
imports no ``rich``); its names are importable from here as before.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .broker.flowviews import FlowKind
from .views.flowkeys import FlowKeysView as FlowKeysView
from .views.flowkeys import flow_keys_view as flow_keys_view

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
