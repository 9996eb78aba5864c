"""What ``typedq inspect --fair/--debounced/--unique/--streams QUEUE`` and the
dashboard's queue page read of a queue's flow control: one bounded page of its fair keys
with jobs waiting, its debounce keys and their collecting jobs, its unique keys held, or
its job streams (the broker's capability :class:`~typedq.broker.capabilities.FlowViews`).
Draws nothing: the command line's table is :func:`typedq.inspect_flow.render_flow_keys`.
"""

from __future__ import annotations

import msgspec

from ..broker.base import Broker
from ..broker.capabilities import FlowViews, supports
from ..broker.flowviews import FlowKey, FlowKind
from ..errors import Unsupported

__all__ = ["FlowKeysView", "flow_keys_view"]


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
