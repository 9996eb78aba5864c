"""The PostgreSQL broker's migration 7: the schema registry (capability
``SchemaRegistry``, ``typedq verify``), as :mod:`..schemas` describes. Released: never
edited (a change is a new migration).

``schemas`` holds one row per ``(task, fingerprint)`` of a namespace: the first record
of it, stamped with the database's clock when it was inserted (``first_seen``); a later
record of the same pair is dropped by ``ON CONFLICT DO NOTHING``. A table alone: no
function and no trigger, so the job functions of earlier migrations are untouched.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
CREATE TABLE {s}.schemas (
    ns text NOT NULL,
    task text NOT NULL,
    fingerprint text NOT NULL,
    input_schema text NOT NULL,
    output_schema text NOT NULL,
    first_seen double precision NOT NULL,
    PRIMARY KEY (ns, task, fingerprint)
);
"""
