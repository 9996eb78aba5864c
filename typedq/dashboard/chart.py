"""Throughput charts as inline SVG, drawn on the server (no script, no image files).

One bar per minute: completed jobs in one colour with final failures stacked on top in
another; every bar carries a ``<title>`` (a tooltip, and text for screen readers).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from html import escape

from ..broker.base import MinuteRollup

__all__ = ["throughput_svg"]


def throughput_svg(
    minutes: Sequence[MinuteRollup], *, label: str, width: int = 240, height: int = 40
) -> str:
    """An SVG bar chart of ``minutes`` (oldest first), ``label`` naming it for screen
    readers. The scale is the busiest minute's total."""
    n = max(1, len(minutes))
    peak = max((m.completed + m.failed for m in minutes), default=0) or 1
    bar = width / n
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" xmlns="http://www.w3.org/2000/svg"><title>{escape(label)}</title>'
    ]
    for i, m in enumerate(minutes):
        total = m.completed + m.failed
        if total == 0:
            continue
        x = i * bar
        ok_h = height * m.completed / peak
        bad_h = height * m.failed / peak
        when = time.strftime("%H:%M", time.gmtime(m.minute))
        tip = f"{when} UTC: {m.completed} completed, {m.failed} failed, {m.retried} retried"
        parts.append(f"<g><title>{escape(tip)}</title>")
        if m.completed:
            parts.append(
                f'<rect class="ok" x="{x:.1f}" y="{height - ok_h:.1f}" '
                f'width="{max(bar - 1, 1):.1f}" height="{ok_h:.1f}"/>'
            )
        if m.failed:
            parts.append(
                f'<rect class="bad" x="{x:.1f}" y="{height - ok_h - bad_h:.1f}" '
                f'width="{max(bar - 1, 1):.1f}" height="{bad_h:.1f}"/>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    return "".join(parts)
