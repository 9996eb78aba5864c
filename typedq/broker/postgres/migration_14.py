"""The PostgreSQL broker's migration 14: the statements of every claim, run append, run
end and trim of finished jobs that a plan made before the tables have statistics made
read a whole table at each call (issue 26). Released: never edited (a change is a new
migration).

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
(bench/results/issue26-durable-postgres.txt; tests/postgres/test_pg_plans.py):

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
- ``finished_add`` (migration 6's): the finished jobs past the count or the age bound
  are chosen as before (their state's index, which the condition ``state >= 3`` lets a
  generic plan use), then deleted one at a time by primary key (``trim_jobs``, which
  counts them per queue in ``trimmed`` as the joined delete did); a job a retry took
  back since it was chosen stays.

The functions are the released ones word for word but for these statements (taken from
their migrations' text here, as migration 10 took migration 4's claim).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from . import migration_6_changes, migration_9, migration_11, migration_13
from .released import function_of

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


#: Migration 6's trims of finished jobs past the bounds (the count bound's, the age
#: bound's), and the same chosen first, then deleted a job at a time by primary key
#: (``trim_jobs``).
TRIM_COUNT = """        WITH d AS (
            DELETE FROM {s}.jobs j USING (
                SELECT o.id FROM {s}.jobs o
                WHERE o.ns = p_ns AND o.state = st
                ORDER BY o.seq LIMIT least(total - cap, 1000)
            ) old WHERE j.ns = p_ns AND j.id = old.id
            RETURNING j.queue
        ), c AS (
            INSERT INTO {s}.trimmed AS t (ns, queue, state, n)
            SELECT p_ns, d.queue, st, count(*) FROM d GROUP BY d.queue
            ON CONFLICT (ns, queue, state) DO UPDATE SET n = t.n + excluded.n
        )
        SELECT count(*) INTO gone FROM d;
"""
TRIM_COUNT_BY_KEY = """        gone := {s}.trim_jobs(p_ns, st, ARRAY(
            SELECT o.id FROM {s}.jobs o
            WHERE o.ns = p_ns AND o.state = st AND o.state >= 3
            ORDER BY o.seq LIMIT least(total - cap, 1000)));
"""
TRIM_AGE = """        WITH d AS (
            DELETE FROM {s}.jobs j USING (
                SELECT o.id FROM {s}.jobs o
                WHERE o.ns = p_ns AND o.state = st AND o.finished_at <= now - ttl
                ORDER BY o.finished_at LIMIT 1000
            ) old WHERE j.ns = p_ns AND j.id = old.id
            RETURNING j.queue
        ), c AS (
            INSERT INTO {s}.trimmed AS t (ns, queue, state, n)
            SELECT p_ns, d.queue, st, count(*) FROM d GROUP BY d.queue
            ON CONFLICT (ns, queue, state) DO UPDATE SET n = t.n + excluded.n
        )
        SELECT count(*) INTO more FROM d;
"""
TRIM_AGE_BY_KEY = """        more := {s}.trim_jobs(p_ns, st, ARRAY(
            SELECT o.id FROM {s}.jobs o
            WHERE o.ns = p_ns AND o.state = st AND o.state >= 3
              AND o.finished_at <= now - ttl
            ORDER BY o.finished_at LIMIT 1000));
"""
#: The trims' deletes: each job by its whole primary key (still in its final state: a
#: retry may have taken it back since it was chosen), each queue's count kept in
#: ``trimmed``.
TRIM_JOBS = """-- Delete finished jobs p_ids of state st, each by its primary key; count them per
-- queue in trimmed; answer how many went.
CREATE FUNCTION {s}.trim_jobs(p_ns text, st smallint, p_ids text[])
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    one text;
    q text;
    queues text[] := '{{}}';
BEGIN
    FOREACH one IN ARRAY p_ids LOOP
        DELETE FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = one AND j.state = st
        RETURNING j.queue INTO q;
        IF FOUND THEN
            queues := queues || q;
        END IF;
    END LOOP;
    INSERT INTO {s}.trimmed AS t (ns, queue, state, n)
    SELECT p_ns, u.q, st, count(*) FROM unnest(queues) AS u (q) GROUP BY u.q
    ON CONFLICT (ns, queue, state) DO UPDATE SET n = t.n + excluded.n;
    RETURN cardinality(queues);
END $$;

"""


SQL = (
    function_of(
        migration_11.SQL,
        "CREATE OR REPLACE FUNCTION {s}.claim(",
        ((PROMOTE, PROMOTE_WHEN_DUE),),
        "Migration 11's claim; due jobs promoted only when one is due.",
    )
    + function_of(
        migration_13.SQL,
        "CREATE OR REPLACE FUNCTION {s}.run_finish(",
        ((RUNS_PAST_AGE, RUNS_PAST_AGE_WHEN_PAST),),
        "Migration 13's run_finish; the age bound applied only when a run is past it.",
    )
    + function_of(
        migration_9.SQL,
        "CREATE FUNCTION {s}.run_append(",
        ((APPEND_DECLARE, APPEND_DECLARE_LOCK), (APPEND_LOCK, APPEND_LOCK_BY_KEY)),
        "Migration 9's run_append; its runs locked a run at a time by primary key.",
    )
    + TRIM_JOBS
    + function_of(
        migration_6_changes.SQL,
        "CREATE OR REPLACE FUNCTION {s}.finished_add(",
        ((TRIM_COUNT, TRIM_COUNT_BY_KEY), (TRIM_AGE, TRIM_AGE_BY_KEY)),
        "Migration 6's finished_add; the jobs past the bounds deleted by primary key.",
    )
)
