"""The PostgreSQL broker (``postgresql://`` / ``postgres://``; extra ``typedq[postgres]``).

Today: the core store of the seam (:mod:`typedq.broker.base`), operator actions,
observability, schedules, task limits and transactional enqueue, in a schema of its own
created and migrated on first connect. Capabilities follow one at a time; until then
they raise :class:`~typedq.errors.Unsupported` (docs/brokers.md says which).

- :mod:`.schema`: tables, indexes and the functions that move jobs (numbered migrations)
- :mod:`.connection`: the URL, migrations under an advisory lock, the listener, errors
- :mod:`.statements`: the calls of those functions and the reads, as SQL text
- :mod:`.broker`: :class:`PostgresBroker` (connect, close, notifications), made of
  mixins on :mod:`.core`: :mod:`.store` (enqueue, reads, listings), :mod:`.leases`
  (claim, leases, settles, stall recovery), :mod:`.limits` (Limits), :mod:`.observe`
  (Observability), :mod:`.schedules` (Schedules), :mod:`.actions` (OperatorActions);
  :mod:`.rows` turns rows into the seam's values, :mod:`.within` enqueues in the
  caller's transaction
"""

from __future__ import annotations

from .broker import PostgresBroker

__all__ = ["PostgresBroker"]
