"""The PostgreSQL broker's migration 6: workflows (capability Flows, :mod:`typedq.broker.flow`).
Released: never edited (a change is a new migration).

A flow's jobs are ordinary rows tagged with their flow and place (``flow_id``,
``flow_member`` or ``flow_step``); a held step is ``scheduled`` at ``HELD_AT`` with an empty
payload whose place in the stored envelope is ``hole`` (the byte offset of its ``bin 0``),
where the hand-off splices its input. A running flow is a row of ``flows`` (deleted when
the flow ends) and its settled members' fan-in elements are rows of ``flow_results``.

The hand-off is done by triggers, in the transaction of the transition that finished the
job, whatever made it final (complete, complete_and_claim, fail, release, cancel, recover,
a flow's own end): ``flow_final`` after a flow job's state becomes final, and
``flow_gone`` after a flow job that had not finished (or was parked) is deleted (remove,
purge, retention). Their ``WHEN`` clauses test columns of the row alone, so a job with no
flow pays no query. The rules are the embedded broker's (``memory/flows.py``).

A flow's end never waits for a row another transaction holds (``flow_end_jobs``: a
worker settling a batch holds its jobs' rows and waits for the flow's row, so waiting
here could deadlock); those jobs are ended by ``flow_finish`` once their holder has
committed (after the cancel, remove or purge that ended the flow, and in the reaper's
pass). A deadlock left (rare: the last member's fan-in against a cancel of the flow's
own job) is rolled back by PostgreSQL and the call sent again
(:func:`typedq.broker.postgres.connection.call`).

A failure record the flow writes is msgpack made here (``mp_failure``): the same map
msgspec encodes a ``FailureRecord`` as.

The SQL is kept in three modules, one part each, joined here in order
(:mod:`.migration_6_tables`, :mod:`.migration_6_flows`, :mod:`.migration_6_changes`):
the text that runs is the one released (tests/unit/test_pg_migration_text.py pins its
digest).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from . import migration_6_changes, migration_6_flows, migration_6_tables

__all__ = ["SQL"]

SQL = migration_6_tables.SQL + migration_6_flows.SQL + migration_6_changes.SQL
