"""The PostgreSQL broker's migration 14: three statements of every claim, run end and
run append that a plan made before the tables have statistics made read a whole table
at each call (issue 26). Released: never edited (a change is a new migration).

A schema's tables have no column statistics until autovacuum first analyzes them: a
minute or more after they fill (``autovacuum_naptime``, then the analyze threshold), and
every time a schema is new. Until then the planner takes ``ns = $1`` for a selective
condition (its default, 0.5% of the rows) while every row of a one-app schema has the same
``ns``, and a PL/pgSQL function keeps the generic plan it made at its sixth call, when
the tables were nearly empty, until an analyze. So planned, a statement whose condition
is more than an equality on the whole primary key read the table by its primary key on
``ns`` alone and filtered the rest: every row of the namespace, on every call (even
``id = ANY (...)`` is planned so). On the durable benchmark (bench/durable.py: a schema
made for the run) these read every retained job at each claim (up to 10,000 finished
jobs at the default bound) and every run at each append and each run's end
(bench/results/issue26-durable-postgres.txt):

- ``claim`` (migration 11's, with migration 10's step): the promotion of due scheduled
  jobs (a join of jobs to a subquery of itself) now runs only when a job is due, which a
  look at one table through the scheduled jobs' own small partial index tells; it is the
  same statement, so the waiting order it gives them is the same.
- ``run_finish`` (migration 13's): the age bound's delete runs only when the oldest
  ended run of the state (read in the order of ``runs_ended_order``, which the planner
  takes to avoid a sort) is past it.
- ``run_append`` (migration 9's): its runs are locked one at a time, each by its whole
  primary key, in id order: the same locks, in the same order, where one statement with
  ``id = ANY (p_ids)`` read every run.

The functions are the released ones word for word but for these statements (taken from
their migrations' text here, as migration 10 took migration 4's claim).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from . import migration_9, migration_11, migration_13

__all__ = ["SQL"]

#: Migration 11's promotion of due scheduled jobs, as its claim states it.
PROMOTE = """    UPDATE {s}.jobs j SET state = 0, seq = d.nseq
    FROM (
        SELECT o.id, nextval('{s}.job_seq') AS nseq FROM (
            SELECT x.id FROM {s}.jobs x
            WHERE x.ns = p_ns AND x.queue = ANY (p_queues) AND x.state = 1 AND x.run_at <= now
            ORDER BY x.run_at, x.seq
            FOR UPDATE SKIP LOCKED
        ) o
    ) d
    WHERE j.ns = p_ns AND j.id = d.id;
"""
#: The same, when a due job exists.
PROMOTE_WHEN_DUE = (
    """    IF EXISTS (SELECT 1 FROM {s}.jobs x
               WHERE x.ns = p_ns AND x.queue = ANY (p_queues) AND x.state = 1
                 AND x.run_at <= now) THEN
"""
    + "".join("    " + line + "\n" for line in PROMOTE.splitlines())
    + "    END IF;\n"
)

#: Migration 13's age bound of ended runs, and the same when a run is past it.
RUNS_PAST_AGE = """    DELETE FROM {s}.runs d USING (
        SELECT o.id FROM {s}.runs o
        WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
          AND o.finished_at <= p_now - {s}.run_ttl(p_state, p_ttls)
        ORDER BY o.finished_at LIMIT 100
    ) old WHERE d.ns = p_ns AND d.id = old.id;
"""
RUNS_PAST_AGE_WHEN_PAST = (
    """    IF (SELECT o.finished_at FROM {s}.runs o
        WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
          AND o.finished_at <= p_now - {s}.run_ttl(p_state, p_ttls)
        ORDER BY o.finished_at LIMIT 1) IS NOT NULL THEN
"""
    + "".join("    " + line + "\n" for line in RUNS_PAST_AGE.splitlines())
    + "    END IF;\n"
)


#: Migration 9's append locking its runs in id order, and the same a run at a time by
#: primary key (the same locks, taken in the same order).
APPEND_LOCK = """    PERFORM 1 FROM {s}.runs r WHERE r.ns = p_ns AND r.id = ANY(p_ids) ORDER BY r.id
    FOR UPDATE;
"""
APPEND_LOCK_BY_KEY = """    FOR lock_id IN SELECT DISTINCT u.id FROM unnest(p_ids) AS u (id) ORDER BY u.id LOOP
        PERFORM 1 FROM {s}.runs r WHERE r.ns = p_ns AND r.id = lock_id FOR UPDATE;
    END LOOP;
"""
#: The variable APPEND_LOCK_BY_KEY needs, declared after the last of migration 9's.
APPEND_DECLARE = """    taken integer;
BEGIN
"""
APPEND_DECLARE_LOCK = """    taken integer;
    lock_id text;
BEGIN
"""


def _function(sql: str, head: str, changes: tuple[tuple[str, str], ...], why: str) -> str:
    """The function of a released migration's ``sql`` that starts with ``head``, each
    statement of ``changes`` replaced (each found once), as a CREATE OR REPLACE."""
    start = sql.index(head)
    body = sql[start : sql.index("END $$;", start) + len("END $$;")]
    for old, new in changes:
        assert body.count(old) == 1, old
        body = body.replace(old, new)
    body = body.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1)
    return f"-- {why}\n{body}\n"


SQL = (
    _function(
        migration_11.SQL,
        "CREATE OR REPLACE FUNCTION {s}.claim(",
        ((PROMOTE, PROMOTE_WHEN_DUE),),
        "Migration 11's claim; due jobs promoted only when one is due.",
    )
    + _function(
        migration_13.SQL,
        "CREATE OR REPLACE FUNCTION {s}.run_finish(",
        ((RUNS_PAST_AGE, RUNS_PAST_AGE_WHEN_PAST),),
        "Migration 13's run_finish; the age bound applied only when a run is past it.",
    )
    + _function(
        migration_9.SQL,
        "CREATE FUNCTION {s}.run_append(",
        ((APPEND_DECLARE, APPEND_DECLARE_LOCK), (APPEND_LOCK, APPEND_LOCK_BY_KEY)),
        "Migration 9's run_append; its runs locked a run at a time by primary key.",
    )
)
