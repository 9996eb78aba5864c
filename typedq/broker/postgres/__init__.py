"""The PostgreSQL broker (``postgresql://`` / ``postgres://``; extra ``typedq[postgres]``).

Today: the core store of the seam (:mod:`typedq.broker.base`) and operator actions, in
a schema of its own created and migrated on first connect. Capabilities follow one at a time; until then
they raise :class:`~typedq.errors.Unsupported` (docs/brokers.md says which).

- :mod:`.schema`: tables, indexes and the functions that move jobs (numbered migrations)
- :mod:`.connection`: the URL, migrations under an advisory lock, the listener, errors
- :mod:`.broker`: :class:`PostgresBroker`
"""

from __future__ import annotations

from .broker import PostgresBroker

__all__ = ["PostgresBroker"]
