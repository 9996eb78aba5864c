"""The PostgreSQL broker's migration 13: the count bound of ended runs without a scan
(durable runs, migration 9). Released: never edited (a change is a new migration).

Migration 9's ``run_finish`` applied the count bound by reading every ended run of the
state, sorted, on every end (10,000 rows at the default bound, at steady state). As
finished jobs are counted in ``finished`` (migration 1's ``finished_add``), ended runs
are counted here, per namespace and state, in ``run_counts``; an end reads the count
and deletes the oldest ended runs (by ``finished_at``, then id) past the bound only when
over it, from the index ``runs_ended_order``.

The count is kept by row triggers on ``runs`` (a run whose state changes, a run deleted
while ended), so every path that ends or deletes a run counts, whatever its migration:
``run_finish``, ``run_lock`` (one past its age bound) and any later one. The count row
of a state is locked by an end until its transaction commits: ends of the same state
are serialized there, as finishes of jobs are on ``finished``; like the trigger of a
step's end (migration 9), a settle that ends a run (a turn failed for good) can
deadlock with an append ending another, and PostgreSQL rolls one back, sent again
(:func:`typedq.broker.postgres.connection.call`).

The queries name ``state > 0`` as well as the state: the ended runs' indexes are
partial, and a generic plan of a PL/pgSQL statement (a parameter for the state) could
not use them otherwise.

``mp_str`` (migration 6) is declared STABLE, as ``convert_to`` it calls is: PostgreSQL
inlines a SQL function only when its body is no more volatile than it is declared, and
a call that is not inlined (one per turn, in ``run_wake``) cost more than the rest of
the expression.

This migration touches only ``runs`` and ``run_finish`` (migration 9), ``mp_str`` and
its own objects: it depends on no migration between 9 and itself.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
ALTER FUNCTION {s}.mp_str(text) STABLE;

-- How many ended runs of each state a namespace keeps (the count bound's).
CREATE TABLE {s}.run_counts (
    ns text NOT NULL,
    state smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, state)
);

CREATE FUNCTION {s}.run_counted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.state > 0 THEN
        UPDATE {s}.run_counts SET n = n - 1 WHERE ns = OLD.ns AND state = OLD.state;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state > 0 THEN
        INSERT INTO {s}.run_counts AS c (ns, state, n) VALUES (NEW.ns, NEW.state, 1)
        ON CONFLICT (ns, state) DO UPDATE SET n = c.n + 1;
    END IF;
    RETURN NULL;
END $$;

-- Created before the counts are taken: the triggers' lock on runs holds every writer
-- off until this migration commits.
CREATE TRIGGER run_counted_in AFTER INSERT ON {s}.runs FOR EACH ROW
WHEN (NEW.state > 0) EXECUTE FUNCTION {s}.run_counted();
CREATE TRIGGER run_counted_change AFTER UPDATE OF state ON {s}.runs FOR EACH ROW
WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION {s}.run_counted();
CREATE TRIGGER run_counted_out AFTER DELETE ON {s}.runs FOR EACH ROW
WHEN (OLD.state > 0) EXECUTE FUNCTION {s}.run_counted();

INSERT INTO {s}.run_counts (ns, state, n)
SELECT ns, state, count(*) FROM {s}.runs WHERE state > 0 GROUP BY ns, state;

-- Ended runs of a state, oldest first (the count bound's order, and the age bound's).
CREATE INDEX runs_ended_order ON {s}.runs (ns, state, finished_at, id) WHERE state > 0;
DROP INDEX IF EXISTS {s}.runs_ended;

-- As in migration 9, the count bound read from run_counts: the oldest past it go (at
-- most 1000 a call), none is read when the count is within it.
CREATE OR REPLACE FUNCTION {s}.run_finish(p_ns text, p_id text, p_state smallint,
                                          p_result bytea, p_failure bytea,
                                          p_now double precision,
                                          p_ttls double precision[], p_caps bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := CASE WHEN p_state = 1 THEN p_caps[1] ELSE p_caps[2] END;
    total bigint;
BEGIN
    UPDATE {s}.runs SET state = p_state, result = p_result, failure = p_failure,
                        finished_at = p_now, wait_jobs = '{{}}', wait_signal = NULL,
                        wake_at = NULL
    WHERE ns = p_ns AND id = p_id;
    DELETE FROM {s}.run_outcomes WHERE ns = p_ns AND run_id = p_id;
    SELECT c.n INTO total FROM {s}.run_counts c WHERE c.ns = p_ns AND c.state = p_state;
    IF total > cap THEN
        DELETE FROM {s}.runs d USING (
            SELECT o.id FROM {s}.runs o
            WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
            ORDER BY o.finished_at, o.id LIMIT least(total - cap, 1000)
        ) old WHERE d.ns = p_ns AND d.id = old.id;
    END IF;
    DELETE FROM {s}.runs d USING (
        SELECT o.id FROM {s}.runs o
        WHERE o.ns = p_ns AND o.state = p_state AND o.state > 0
          AND o.finished_at <= p_now - {s}.run_ttl(p_state, p_ttls)
        ORDER BY o.finished_at LIMIT 100
    ) old WHERE d.ns = p_ns AND d.id = old.id;
    PERFORM pg_notify({s}.flow_channel(), 'r:' || p_ns || ':' || p_id);
END $$;
"""
