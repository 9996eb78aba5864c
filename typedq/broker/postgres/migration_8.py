"""The PostgreSQL broker's migration 8: unique windows and debounce (capability
FlowControl, :mod:`typedq.broker.postgres.control`). Released: never edited (a change is
a new migration). It only adds: a column, a table, indexes, functions and two triggers
(no existing function or trigger changes).

The rules are the embedded broker's (:mod:`typedq.broker.memory.control`):

- ``ctl_markers``: one row per key's marker (``<task>|<key>``) within a queue; ``kind``
  0 a unique window, 1 a debounce. ``job_id`` names the job holding it. A unique
  marker's ``until`` is NULL while its job may still hold it (the job row tells: not
  final, or COMPLETED less than ``win`` seconds ago), and set to the job's finish +
  ``win`` when retention (or an operator) deletes a completed job, so the window
  outlives the job. A job failing for good or cancelled frees its key at once.
- ``jobs.ctl``: the marker of a keyed job (NULL for every other job). Two triggers read
  it in their conditions (the row alone, no query: plain jobs pay nothing):
  ``ctl_gone`` on a deleted keyed job, ``ctl_freed`` on a keyed job failing for good or
  cancelled (its marker goes, so an operator's retry does not take the key back). A
  job completing writes nothing: its row tells the window.
- Every keyed enqueue takes the marker's transaction-level advisory lock first, so two
  producers of one key (two brokers, two processes) are serialized: one creates, the
  other finds its job.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
ALTER TABLE {s}.jobs ADD COLUMN ctl text;

CREATE TABLE {s}.ctl_markers (
    ns text NOT NULL,
    queue text NOT NULL,
    kind smallint NOT NULL,
    marker text NOT NULL,
    job_id text NOT NULL,
    win double precision NOT NULL DEFAULT 0,
    until double precision,
    seq bigint NOT NULL,
    PRIMARY KEY (ns, queue, kind, marker)
);
-- The views' order (a keyset cursor on seq) and the sweep of ended windows.
CREATE INDEX ctl_markers_seq ON {s}.ctl_markers (ns, queue, kind, seq);
CREATE INDEX ctl_markers_until ON {s}.ctl_markers (ns, until) WHERE until IS NOT NULL;
CREATE SEQUENCE {s}.ctl_seq;

-- One keyed enqueue (p_kind 0: unique for p_win seconds; 1: debounce of p_wait, bounded
-- by p_max_wait from the job's first enqueue), atomic with its marker. Answers
-- (code, job_id): 1 created, 0 the key's job (nothing changed, or a debounce replaced
-- by p_held_message), 2 a debounced job to replace whose id is job_id but p_held is not
-- it: the caller encodes its message for that id and calls again.
CREATE FUNCTION {s}.enqueue_controlled(
    p_ns text, p_id text, p_queue text, p_message bytea, p_priority integer,
    p_eta double precision, p_delay double precision, p_cap integer, p_channel text,
    p_task text, p_rate_key text, p_conc_key text,
    p_marker text, p_kind smallint, p_win double precision, p_wait double precision,
    p_max_wait double precision, p_held text, p_held_message bytea,
    OUT code smallint, OUT job_id text)
LANGUAGE plpgsql AS $$
DECLARE
    now double precision;
    m {s}.ctl_markers;
    js smallint;
    fin double precision;
    att integer;
    run double precision;
    enq double precision;
    made boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtext('typedq-ctl:' || p_ns || ':' || p_queue || ':' || p_marker));
    now := {s}.now_s();
    SELECT * INTO m FROM {s}.ctl_markers x
    WHERE x.ns = p_ns AND x.queue = p_queue AND x.kind = p_kind AND x.marker = p_marker;
    IF FOUND THEN
        SELECT j.state, j.finished_at, j.attempt, j.run_at, j.enqueued_at
        INTO js, fin, att, run, enq
        FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = m.job_id;
        IF p_kind = 0 THEN
            IF m.until IS NOT NULL THEN
                IF m.until > now THEN
                    code := 0; job_id := m.job_id; RETURN;
                END IF;
            ELSIF js IS NOT NULL AND (js < 3 OR (js = 3 AND fin + m.win > now)) THEN
                code := 0; job_id := m.job_id; RETURN;
            END IF;
            -- Expired, freed (failed, cancelled) or stale (gone unfinished): replaced.
        ELSIF js = 1 AND att = 0 AND run > now THEN
            -- Scheduled, never claimed, not due: it takes the new payload and runs
            -- `wait` after this enqueue, at the latest max_wait after its first.
            IF p_held IS DISTINCT FROM m.job_id THEN
                code := 2; job_id := m.job_id; RETURN;
            END IF;
            UPDATE {s}.jobs j SET message = p_held_message,
                run_at = least(now + p_wait, j.enqueued_at + p_max_wait)
            WHERE j.ns = p_ns AND j.id = m.job_id;
            code := 0; job_id := m.job_id; RETURN;
        END IF;
    END IF;
    -- Ended unique windows go a few at a time, so markers stay bounded by live keys.
    DELETE FROM {s}.ctl_markers x WHERE x.ctid IN (
        SELECT y.ctid FROM {s}.ctl_markers y
        WHERE y.ns = p_ns AND y.until IS NOT NULL AND y.until <= now LIMIT 8);
    made := ({s}.enqueue(p_ns, ARRAY[p_id], ARRAY[p_queue], ARRAY[p_message],
                         ARRAY[p_priority], ARRAY[p_eta], ARRAY[p_delay], p_cap, p_channel,
                         ARRAY[p_task], ARRAY[p_rate_key], ARRAY[p_conc_key]))[1];
    job_id := p_id;
    IF NOT made THEN
        code := 0; RETURN;  -- a job with this id exists: deduplicated by id, unmarked
    END IF;
    UPDATE {s}.jobs j SET ctl = p_marker WHERE j.ns = p_ns AND j.id = p_id;
    INSERT INTO {s}.ctl_markers AS x (ns, queue, kind, marker, job_id, win, until, seq)
    VALUES (p_ns, p_queue, p_kind, p_marker, p_id, p_win, NULL, nextval('{s}.ctl_seq'))
    ON CONFLICT (ns, queue, kind, marker) DO UPDATE
    SET job_id = EXCLUDED.job_id, win = EXCLUDED.win, until = NULL, seq = EXCLUDED.seq;
    code := 1;
END $$;

-- A keyed job was deleted (retention, remove, purge): a COMPLETED one keeps its unique
-- key for the rest of its window (the marker now carries its end); any other frees its
-- key (a failed or cancelled one had already; a removed unfinished one leaves none
-- stale). A debounce marker goes with its job.
CREATE FUNCTION {s}.ctl_gone() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.state = 3 THEN
        UPDATE {s}.ctl_markers x SET until = OLD.finished_at + x.win
        WHERE x.ns = OLD.ns AND x.queue = OLD.queue AND x.kind = 0 AND x.marker = OLD.ctl
          AND x.job_id = OLD.id AND x.until IS NULL;
        DELETE FROM {s}.ctl_markers x
        WHERE x.ns = OLD.ns AND x.queue = OLD.queue AND x.kind = 1 AND x.marker = OLD.ctl
          AND x.job_id = OLD.id;
    ELSE
        DELETE FROM {s}.ctl_markers x
        WHERE x.ns = OLD.ns AND x.queue = OLD.queue AND x.marker = OLD.ctl
          AND x.job_id = OLD.id;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER ctl_gone AFTER DELETE ON {s}.jobs FOR EACH ROW
WHEN (OLD.ctl IS NOT NULL)
EXECUTE FUNCTION {s}.ctl_gone();

-- A keyed job failed for good or was cancelled: its key is free at once, and stays free
-- should an operator retry the job (as the embedded broker and Redis drop the marker).
CREATE FUNCTION {s}.ctl_freed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {s}.ctl_markers x
    WHERE x.ns = NEW.ns AND x.queue = NEW.queue AND x.marker = NEW.ctl AND x.job_id = NEW.id;
    RETURN NULL;
END $$;

CREATE TRIGGER ctl_freed AFTER UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN (NEW.ctl IS NOT NULL AND NEW.state >= 4 AND OLD.state < 3)
EXECUTE FUNCTION {s}.ctl_freed();
"""
