"""The PostgreSQL broker's migration 12: the scheduled and active states' listing order
as indexes, so that a page of ``page_jobs`` (and of ``count_fingerprints``, which counts
the same page) is read from the index at its cursor, in order, whatever the size of the
state (:data:`typedq.broker.postgres.statements.page_statement`). Released: never edited
(a change is a new migration). It only adds and replaces indexes (no function, no
trigger, no column).

- ``jobs_scheduled_order`` (``run_at, seq``) replaces ``jobs_scheduled`` (``run_at``
  alone): a scheduled page is in ``(run_at, seq)`` order, and the jobs of a batch
  enqueued with one delay tie on ``run_at``, so the old index left every page to sort
  the ties after its cursor's time. It serves what the old one did (the due jobs'
  promotion by ``run_at``, the next due time), so the old one goes: one index to keep
  up per scheduled job, as before.
- ``jobs_active_order`` (``started_at, seq``): no index had the active state's order;
  a page sorted all of the queue's active jobs. One more index entry per claim and per
  lease renewal (bench/pg_control_cost.py measures the drain with and without it).

The indexes are built in the migration's transaction (``CREATE INDEX`` locks the jobs
table against writes while it builds: on a large table, migrate at a quiet time).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
CREATE INDEX jobs_scheduled_order ON {s}.jobs (ns, queue, run_at, seq) WHERE state = 1;
DROP INDEX {s}.jobs_scheduled;
CREATE INDEX jobs_active_order ON {s}.jobs (ns, queue, started_at, seq) WHERE state = 2;
"""
