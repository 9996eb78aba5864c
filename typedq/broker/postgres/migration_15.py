"""The PostgreSQL broker's migration 15: stall recovery hands jobs back in their order.
Released: never edited (a change is a new migration).

``recover`` (migration 2's) took the expired leases in deadline order and handed each
back in that order, a job at a time; jobs with the same deadline (one claim's) came in
whatever order the table gave them. A fair job whose key has no lane joins at the tail
of its level as it comes back (``fair_back``, migration 10), so two keys' lanes took
their places in that arbitrary order, where the embedded broker (the reference) hands
one call's jobs back oldest first (``WaitLine.hand_back``) and Redis does the same. The
combined model check on PostgreSQL diverged on that, now and then (fair seed 100, a
claim after two recovered keys).

Now the expired leases are chosen as before (the oldest deadlines, up to the limit) and
handed back in their jobs' order: a job's original ``seq`` (a job handed back before
keeps it in its low 31 bits, migration 10), then its id.

The function is migration 2's word for word but for that statement.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from __future__ import annotations

from . import migration_2
from .released import function_of

__all__ = ["SQL"]

EXPIRED = """        SELECT x.id, x.stalls, x.cancel_requested, x.queue FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.state = 2 AND x.lease_until < now
          AND NOT (x.id = ANY (p_holding))
        ORDER BY x.lease_until LIMIT p_limit
        FOR UPDATE SKIP LOCKED
"""

EXPIRED_IN_ORDER = """        SELECT e.id, e.stalls, e.cancel_requested, e.queue FROM (
            SELECT x.id, x.stalls, x.cancel_requested, x.queue, x.seq FROM {s}.jobs x
            WHERE x.ns = p_ns AND x.state = 2 AND x.lease_until < now
              AND NOT (x.id = ANY (p_holding))
            ORDER BY x.lease_until LIMIT p_limit
            FOR UPDATE SKIP LOCKED
        ) e
        ORDER BY CASE WHEN e.seq < 0 THEN e.seq & 2147483647 ELSE e.seq END, e.id
"""

SQL = function_of(
    migration_2.SQL,
    "CREATE OR REPLACE FUNCTION {s}.recover(",
    ((EXPIRED, EXPIRED_IN_ORDER),),
    "Migration 2's recover; one call's expired leases handed back in their jobs' order.",
)
