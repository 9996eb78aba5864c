"""The PostgreSQL broker's schema: tables, indexes and the functions that move jobs, as
numbered migrations applied once per database schema.

Every state transition is one call of a function here (one round trip, one
transaction), as every transition of the Redis broker is one Lua script; the rules are
the embedded broker's (:mod:`typedq.broker.memory`), restated in PL/pgSQL.

``{s}`` in a migration is the broker's schema (``?schema=typedq`` in the URL), quoted.
:func:`migrate` applies the migrations a schema lacks, in order, under a transaction-level
advisory lock: any number of processes may connect at once; the first applies them, the
others wait for it and find nothing left to do. A migration is never edited once
released: a change is a new migration.

The job table
-------------
One row per job (``ns``: the app's namespace, ``id``). ``state``: 0 waiting,
1 scheduled, 2 active, 3 completed, 4 failed, 5 cancelled. ``seq`` orders waiting jobs
within a priority level (FIFO) and, once a job is final, orders finished jobs (most
recent first). Times are epoch seconds of the database's clock (``{s}.now_s()``), the
broker's clock. A failure record the broker writes itself (a cancel, a stall) is kept as
its parts (``br_kind``, ``br_message``) and encoded by the Python side when read.
"""

from __future__ import annotations

import re

from . import (
    migration_1,
    migration_2,
    migration_3,
    migration_4,
    migration_5,
    migration_6,
    migration_7,
    migration_8,
    migration_9,
    migration_10,
    migration_11,
    migration_12,
    migration_13,
    migration_14,
    migration_15,
    migration_16,
    migration_17,
)

__all__ = ["MIGRATIONS", "STATE_CODES", "SCHEMA_NAME", "migrate_sql"]

#: Schema names the broker accepts (they are quoted, but kept simple on purpose).
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")

#: Job states as stored (``jobs.state``), in JobState's order.
STATE_CODES = ("waiting", "scheduled", "active", "completed", "failed", "cancelled")


#: The migrations, in order: migration ``i`` takes a schema from version ``i`` to ``i + 1``.
MIGRATIONS: tuple[str, ...] = (
    migration_1.SQL,
    migration_2.SQL,
    migration_3.SQL,
    migration_4.SQL,
    migration_5.SQL,
    migration_6.SQL,
    migration_7.SQL,
    migration_8.SQL,
    migration_9.SQL,
    migration_10.SQL,
    migration_11.SQL,
    migration_12.SQL,
    migration_13.SQL,
    migration_14.SQL,
    migration_15.SQL,
    migration_16.SQL,
    migration_17.SQL,
)


def migrate_sql(version: int, schema: str) -> str:
    """The SQL of migration ``version`` (from 1) for the quoted ``schema``."""
    return MIGRATIONS[version - 1].format(s=f'"{schema}"')
