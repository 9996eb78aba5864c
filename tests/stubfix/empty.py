"""An app with no tasks."""

from __future__ import annotations

from typedq import App

app = App("empty")
