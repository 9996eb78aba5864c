"""A module that fails while importing (not an ImportError)."""

from __future__ import annotations

raise RuntimeError("the database is not configured")
