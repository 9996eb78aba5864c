"""The PostgreSQL broker's migration 16: concurrent finishes of jobs no longer wait for
each other on one count row (issue 30). Released: never edited (a change is a new
migration).

Every finish (``complete``, ``fail``, ``cancel``, ``recover`` and the flows' ends, all
through ``finished_add``) added to its state's one row of ``finished`` (migration 1),
at the count bound every trim added to its queue's one row of ``trimmed``, and every
run's end to its state's row of ``run_counts`` (migration 13); each row
stays locked until the finishing transaction commits, its WAL flush included, so the
finishes of a namespace's workers ran one after another, each waiting for the commit
before it (bench/results/pg-finished-counter.txt: sampled on the end-to-end benchmark,
0.4-0.6 backends on average waiting for another ``complete_and_claim``'s transaction).

Now the counts are kept in parts: ``finished_parts``, ``trimmed_parts`` and
``run_count_parts`` hold a row per connection's shard (``pg_backend_pid() % 16``, as
``rollups`` does since migration 2), and a count is its released row (``finished``,
``trimmed``, ``run_counts``: what they held when this migration ran, and what the
operator actions that still write ``finished``, ``remove``, ``retry``, ``cancel`` of a
parked job, ``flow_retry``, take off) plus the sum of its parts. No count moves: a schema
keeps its figures exactly across the migration, and they stay exact: every change adds
or takes off exactly its jobs (runs), in one of the rows.

``finished_add`` (migration 14's) adds to its connection's part (locked first, by every
call: the bound's lock below is only waited for holding it, so no two calls wait for
each other in a cycle) and reads the state's count as the sum (making the released row,
at 0, the first time a state has none). A finish does not see the finishes beside it
that have not committed, so the trim of the jobs past the count bound is split:

- at most as many as the call added, without waiting: in the steady state (at the
  bound) each finish deletes as many as it adds, the oldest, chosen ``FOR UPDATE SKIP
  LOCKED`` so two at once delete different jobs, and the bound is kept exactly;
  reaching the bound, finishes committed together may leave up to their own jobs over
  it;
- more than that (such an excess; the reaper's pass, k = 0) under the bound's lock
  (a transaction-level advisory lock per namespace and state), the count read again
  once held: the next finish or reaper pass deletes the excess, and two never delete
  it twice (as two finishes each deleting the whole excess would).

Retention never deletes below the bound. ``run_finish`` (migration 14's) and the
trigger that counts ended runs (``run_counted``, migration 13's) do the same for runs (an
end adds one). ``trim_jobs`` (migration 14's) counts what it deleted in its
connection's part of ``trimmed_parts``; ``queue_stats`` (:mod:`.statements`) sums
``trimmed`` and the parts.

The functions are the released ones word for word but for these statements.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from __future__ import annotations

from . import migration_13, migration_14
from .released import function_of

__all__ = ["SHARDS", "SQL"]

#: Parts per count (a connection writes ``pg_backend_pid() % SHARDS``).
SHARDS = 16

TABLES = """-- The counts of finished jobs per namespace and state (finished), and of the jobs
-- retention deleted per queue and state (trimmed), in parts: one a connection's shard.
CREATE TABLE {s}.finished_parts (
    ns text NOT NULL,
    state smallint NOT NULL,
    shard smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, state, shard)
);
CREATE TABLE {s}.trimmed_parts (
    ns text NOT NULL,
    queue text NOT NULL,
    state smallint NOT NULL,
    shard smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, queue, state, shard)
);
-- The same for the ended runs of each state (run_counts, migration 13).
CREATE TABLE {s}.run_count_parts (
    ns text NOT NULL,
    state smallint NOT NULL,
    shard smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, state, shard)
);

"""

#: Migration 14's count of a finish, and the same in the connection's part, summed.
COUNT = """    INSERT INTO {s}.finished AS f (ns, state, n) VALUES (p_ns, st, k)
    ON CONFLICT (ns, state) DO UPDATE SET n = f.n + k
    RETURNING n INTO total;
"""
#: (Its part is locked first, by every call, the reaper's of k = 0 too: the bound's lock
#: is only ever waited for holding it, so no two calls wait for each other in a cycle.)
COUNT_IN_PARTS = f"""    INSERT INTO {{s}}.finished_parts AS f (ns, state, shard, n)
    VALUES (p_ns, st, (pg_backend_pid() % {SHARDS})::smallint, k)
    ON CONFLICT (ns, state, shard) DO UPDATE SET n = f.n + k;
    SELECT f.n INTO total FROM {{s}}.finished f WHERE f.ns = p_ns AND f.state = st;
    IF NOT FOUND THEN
        -- The released row is made once: the operator actions take jobs off it.
        INSERT INTO {{s}}.finished (ns, state, n) VALUES (p_ns, st, 0)
        ON CONFLICT (ns, state) DO NOTHING;
        total := 0;
    END IF;
    total := total + coalesce((SELECT sum(p.n) FROM {{s}}.finished_parts p
                               WHERE p.ns = p_ns AND p.state = st), 0);
"""
#: Migration 14's trim of the jobs past the count bound, and the same: without waiting,
#: at most as many as this call added (in the steady state, each finish deletes what it
#: adds, two at once different jobs: SKIP LOCKED); more (an excess finishes committed
#: together left, the reaper's pass) under the bound's lock, the count read again once
#: held, so that two never delete the same excess twice.
PAST_COUNT = """    IF total > cap THEN
        gone := {s}.trim_jobs(p_ns, st, ARRAY(
            SELECT o.id FROM {s}.jobs o
            WHERE o.ns = p_ns AND o.state = st AND o.state >= 3
            ORDER BY o.seq LIMIT least(total - cap, 1000)));
    END IF;
"""
PAST_COUNT_SKIP_LOCKED = """    IF total - cap > greatest(k, 0) THEN
        PERFORM pg_advisory_xact_lock(hashtext('typedq-finished:{s}:' || p_ns || ':' || st));
        total := coalesce((SELECT f.n FROM {s}.finished f WHERE f.ns = p_ns AND f.state = st), 0)
               + coalesce((SELECT sum(p.n) FROM {s}.finished_parts p
                           WHERE p.ns = p_ns AND p.state = st), 0);
    END IF;
    IF total > cap THEN
        gone := {s}.trim_jobs(p_ns, st, ARRAY(
            SELECT o.id FROM {s}.jobs o
            WHERE o.ns = p_ns AND o.state = st AND o.state >= 3
            ORDER BY o.seq LIMIT least(total - cap, 1000)
            FOR UPDATE SKIP LOCKED));
    END IF;
"""
#: Migration 14's count of what the trims deleted, and the same in the connection's part.
UNCOUNT = """        UPDATE {s}.finished SET n = n - gone WHERE ns = p_ns AND state = st;
"""
UNCOUNT_IN_PARTS = f"""        INSERT INTO {{s}}.finished_parts AS f (ns, state, shard, n)
        VALUES (p_ns, st, (pg_backend_pid() % {SHARDS})::smallint, -gone)
        ON CONFLICT (ns, state, shard) DO UPDATE SET n = f.n - gone;
"""

#: Migration 14's count of trimmed jobs per queue, and the same in the connection's part.
TRIMMED = """    INSERT INTO {s}.trimmed AS t (ns, queue, state, n)
    SELECT p_ns, u.q, st, count(*) FROM unnest(queues) AS u (q) GROUP BY u.q
    ON CONFLICT (ns, queue, state) DO UPDATE SET n = t.n + excluded.n;
"""
TRIMMED_IN_PARTS = f"""    INSERT INTO {{s}}.trimmed_parts AS t (ns, queue, state, shard, n)
    SELECT p_ns, u.q, st, (pg_backend_pid() % {SHARDS})::smallint, count(*)
    FROM unnest(queues) AS u (q) GROUP BY u.q ORDER BY u.q
    ON CONFLICT (ns, queue, state, shard) DO UPDATE SET n = t.n + excluded.n;
"""

#: Migration 13's count of ended runs (the trigger on runs), and the same in parts.
RUN_UNCOUNT = """        UPDATE {s}.run_counts SET n = n - 1 WHERE ns = OLD.ns AND state = OLD.state;
"""
RUN_UNCOUNT_IN_PARTS = f"""        INSERT INTO {{s}}.run_count_parts AS c (ns, state, shard, n)
        VALUES (OLD.ns, OLD.state, (pg_backend_pid() % {SHARDS})::smallint, -1)
        ON CONFLICT (ns, state, shard) DO UPDATE SET n = c.n - 1;
"""
RUN_COUNT = """        INSERT INTO {s}.run_counts AS c (ns, state, n) VALUES (NEW.ns, NEW.state, 1)
        ON CONFLICT (ns, state) DO UPDATE SET n = c.n + 1;
"""
RUN_COUNT_IN_PARTS = f"""        INSERT INTO {{s}}.run_count_parts AS c (ns, state, shard, n)
        VALUES (NEW.ns, NEW.state, (pg_backend_pid() % {SHARDS})::smallint, 1)
        ON CONFLICT (ns, state, shard) DO UPDATE SET n = c.n + 1;
"""
#: Migration 14's read of a state's count of ended runs, and the same summed with parts.
RUN_TOTAL = """    SELECT c.n INTO total FROM {s}.run_counts c WHERE c.ns = p_ns AND c.state = p_state;
"""
RUN_TOTAL_IN_PARTS = """    SELECT coalesce((SELECT c.n FROM {s}.run_counts c
                     WHERE c.ns = p_ns AND c.state = p_state), 0)
         + coalesce((SELECT sum(p.n) FROM {s}.run_count_parts p
                     WHERE p.ns = p_ns AND p.state = p_state), 0)
    INTO total;
"""
#: Migration 14's delete of the ended runs past the count bound, and the same as
#: ``finished_add`` trims jobs: at most the one run this end added without waiting, more
#: under the bound's lock with the count read again; each chosen skipping the runs
#: another end holds, then deleted a run at a time by primary key.
RUNS_PAST_COUNT = """    IF total > cap THEN
        DELETE FROM {s}.runs d USING (
            SELECT o.id FROM {s}.runs o
            WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
            ORDER BY o.finished_at, o.id LIMIT least(total - cap, 1000)
        ) old WHERE d.ns = p_ns AND d.id = old.id;
    END IF;
"""
RUNS_PAST_COUNT_SKIP_LOCKED = (
    """    IF total - cap > 1 THEN
        PERFORM pg_advisory_xact_lock(
            hashtext('typedq-run-counts:{s}:' || p_ns || ':' || p_state));
"""
    + "".join("    " + line + "\n" for line in RUN_TOTAL_IN_PARTS.splitlines())
    + """    END IF;
    IF total > cap THEN
        FOREACH one IN ARRAY ARRAY(
            SELECT o.id FROM {s}.runs o
            WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
            ORDER BY o.finished_at, o.id LIMIT least(total - cap, 1000)
            FOR UPDATE SKIP LOCKED) LOOP
            DELETE FROM {s}.runs d WHERE d.ns = p_ns AND d.id = one;
        END LOOP;
    END IF;
"""
)
#: The variable RUNS_PAST_COUNT_SKIP_LOCKED needs, declared after migration 14's.
RUN_DECLARE = """    total bigint;
BEGIN
"""
RUN_DECLARE_ONE = """    total bigint;
    one text;
BEGIN
"""

SQL = (
    TABLES
    + function_of(
        migration_14.SQL,
        "CREATE FUNCTION {s}.trim_jobs(",
        ((TRIMMED, TRIMMED_IN_PARTS),),
        "Migration 14's trim_jobs; the trimmed jobs counted in the connection's part.",
    )
    + function_of(
        migration_14.SQL,
        "CREATE OR REPLACE FUNCTION {s}.finished_add(",
        (
            (COUNT, COUNT_IN_PARTS),
            (PAST_COUNT, PAST_COUNT_SKIP_LOCKED),
            (UNCOUNT, UNCOUNT_IN_PARTS),
        ),
        "Migration 14's finished_add; counted in parts, the jobs past the bound skipping held ones.",
    )
    + function_of(
        migration_13.SQL,
        "CREATE FUNCTION {s}.run_counted(",
        ((RUN_UNCOUNT, RUN_UNCOUNT_IN_PARTS), (RUN_COUNT, RUN_COUNT_IN_PARTS)),
        "Migration 13's run_counted; ended runs counted in the connection's part.",
    )
    + function_of(
        migration_14.SQL,
        "CREATE OR REPLACE FUNCTION {s}.run_finish(",
        (
            (RUN_DECLARE, RUN_DECLARE_ONE),
            (RUN_TOTAL, RUN_TOTAL_IN_PARTS),
            (RUNS_PAST_COUNT, RUNS_PAST_COUNT_SKIP_LOCKED),
        ),
        "Migration 14's run_finish; the count summed with its parts, the runs past the "
        "bound skipping held ones.",
    )
)
