"""The PostgreSQL broker's migration 5: event streams (typedq.events) and job streams
(typedq.streams), as :mod:`..streams` describes. Released: never edited (a change is a new
migration).

Events. ``event_queues`` holds a row per queue whose stream is on (its cap and the number
of its last event); ``events`` the events, numbered per queue. An event is written by a
deferred constraint trigger on the job's move to a final state, so in the transaction of
that move (complete, fail, release, cancel, recover: every function, no function edited),
at its commit: a queue without a stream pays one primary-key probe of ``event_queues``
per job ending, and nothing else. A queue with one takes the namespace's events lock
(transaction-level) before it numbers its event: the numbers are then given in commit
order (a reader that read up to N never finds N - 1 committed later), and, the lock being
taken at commit (after every row lock of the transaction), two transactions never wait
on each other for it in a cycle. The stream keeps its last ``cap`` events and at most
:data:`_EVENTS_SLACK` more (trimmed by whole chunks, as Redis ``MAXLEN ~``).

Job streams. ``streams`` holds a row per job stream: the last position given out, the
positions at or below ``low`` gone (trimmed, or a previous run's), and when it expires;
``stream_entries`` the entries; ``stream_readers`` who reads it until when. An append
locks the stream's row, then reads its fence (so an append refused to a lost lease
cannot land after the next run's first append), and notifies ``s:<ns>:<job id>``.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
CREATE TABLE {s}.event_queues (
    ns text NOT NULL,
    queue text NOT NULL,
    cap bigint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, queue)
);

CREATE TABLE {s}.events (
    ns text NOT NULL,
    queue text NOT NULL,
    seq bigint NOT NULL,
    id text NOT NULL,
    task text NOT NULL,
    state smallint NOT NULL,
    data bytea,
    attempt integer NOT NULL,
    br_kind text,
    br_message text,
    worker_id text,
    finished_at double precision NOT NULL,
    PRIMARY KEY (ns, queue, seq)
);

-- A job reached a final state: an event on its queue's stream, when the stream is on.
CREATE FUNCTION {s}.job_final() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    v_last bigint;
    v_cap bigint;
BEGIN
    PERFORM 1 FROM {s}.event_queues e WHERE e.ns = NEW.ns AND e.queue = NEW.queue;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('typedq-events:' || TG_TABLE_SCHEMA || ':' || NEW.ns));
    UPDATE {s}.event_queues e SET n = e.n + 1 WHERE e.ns = NEW.ns AND e.queue = NEW.queue
    RETURNING e.n, e.cap INTO v_last, v_cap;
    INSERT INTO {s}.events (ns, queue, seq, id, task, state, data, attempt, br_kind,
                            br_message, worker_id, finished_at)
    VALUES (NEW.ns, NEW.queue, v_last, NEW.id, coalesce(NEW.task, ''), NEW.state,
            CASE WHEN NEW.state = 3 THEN NEW.result ELSE NEW.error END, NEW.attempt,
            NEW.br_kind, NEW.br_message, NEW.worker_id, NEW.finished_at);
    -- Trimmed by chunks of 64: the stream holds between cap and cap + 64 events.
    IF v_last % 64 = 0 AND v_last > v_cap THEN
        DELETE FROM {s}.events x WHERE x.ns = NEW.ns AND x.queue = NEW.queue
          AND x.seq <= v_last - v_cap;
    END IF;
    PERFORM pg_notify('typedq_' || TG_TABLE_SCHEMA, 'e:' || NEW.ns || ':' || NEW.queue);
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER job_final AFTER UPDATE OF state ON {s}.jobs
DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
WHEN (NEW.state >= 3 AND OLD.state < 3)
EXECUTE FUNCTION {s}.job_final();

CREATE TABLE {s}.streams (
    ns text NOT NULL,
    job_id text NOT NULL,
    last bigint NOT NULL DEFAULT 0,
    low bigint NOT NULL DEFAULT 0,
    expires double precision NOT NULL,
    PRIMARY KEY (ns, job_id)
);
CREATE INDEX streams_expires ON {s}.streams (ns, expires);

CREATE TABLE {s}.stream_entries (
    ns text NOT NULL,
    job_id text NOT NULL,
    pos bigint NOT NULL,
    attempt integer NOT NULL,
    seq bigint NOT NULL,
    data bytea NOT NULL,
    fin smallint,
    PRIMARY KEY (ns, job_id, pos)
);

CREATE TABLE {s}.stream_readers (
    ns text NOT NULL,
    job_id text NOT NULL,
    reader text NOT NULL,
    until double precision NOT NULL,
    PRIMARY KEY (ns, job_id, reader)
);
CREATE INDEX stream_readers_until ON {s}.stream_readers (ns, until);

-- Appends to job streams (Broker.append_streams): append i's items are
-- p_items[o + 1 .. o + p_counts[i]] (o: the counts before it). True for each taken.
CREATE FUNCTION {s}.stream_append(p_ns text, p_ids text[], p_tokens text[],
                                  p_attempts integer[], p_seqs bigint[], p_fresh boolean[],
                                  p_ends boolean[], p_ttls double precision[],
                                  p_counts integer[], p_items bytea[], p_cap bigint,
                                  p_channel text)
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out boolean[] := '{{}}';
    o integer := 0;
    c integer;
    v_fin smallint;
    st record;
    v_last bigint;
    v_low bigint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        c := p_counts[i];
        o := o + c;
        -- The stream's row is locked first, then the fence read: an append that
        -- waited for the lock sees what committed meanwhile (the next run's claim, and
        -- its first append), so a refused run never writes after the next run's start.
        -- A stream not made yet is made only for an append its fence lets through.
        SELECT s.last, s.low, s.expires INTO st FROM {s}.streams s
        WHERE s.ns = p_ns AND s.job_id = p_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
            PERFORM 1 FROM {s}.jobs x WHERE x.ns = p_ns AND x.id = p_ids[i]
              AND CASE WHEN p_ends[i] THEN x.state >= 3 AND x.done_token = p_tokens[i]
                  ELSE x.state = 2 AND x.token = p_tokens[i] END;
            IF NOT FOUND THEN
                out := out || false;
                CONTINUE;
            END IF;
            INSERT INTO {s}.streams (ns, job_id, expires) VALUES (p_ns, p_ids[i], now)
            ON CONFLICT DO NOTHING;
            SELECT s.last, s.low, s.expires INTO st FROM {s}.streams s
            WHERE s.ns = p_ns AND s.job_id = p_ids[i] FOR UPDATE;
        END IF;
        -- The fence: items while the token holds the active job, the end once the job
        -- is final by this token's own transition (the entry records that state).
        SELECT x.state INTO v_fin FROM {s}.jobs x WHERE x.ns = p_ns AND x.id = p_ids[i]
          AND CASE WHEN p_ends[i] THEN x.state >= 3 AND x.done_token = p_tokens[i]
              ELSE x.state = 2 AND x.token = p_tokens[i] END;
        IF v_fin IS NULL THEN
            out := out || false;
            CONTINUE;
        END IF;
        v_last := st.last;
        v_low := st.low;
        -- A fresh run, or a stream expired but not swept yet: emptied first (its
        -- positions keep growing).
        IF p_fresh[i] OR st.expires <= now THEN
            IF v_last > v_low THEN
                DELETE FROM {s}.stream_entries e
                WHERE e.ns = p_ns AND e.job_id = p_ids[i] AND e.pos > v_low;
            END IF;
            v_low := v_last;
        END IF;
        IF c > 0 THEN
            INSERT INTO {s}.stream_entries (ns, job_id, pos, attempt, seq, data)
            SELECT p_ns, p_ids[i], v_last + u.k, p_attempts[i], p_seqs[i] + u.k - 1, u.item
            FROM unnest(p_items[o - c + 1 : o]) WITH ORDINALITY AS u (item, k);
            v_last := v_last + c;
        END IF;
        IF p_ends[i] THEN
            v_last := v_last + 1;
            INSERT INTO {s}.stream_entries (ns, job_id, pos, attempt, seq, data, fin)
            VALUES (p_ns, p_ids[i], v_last, p_attempts[i], p_seqs[i] + c, '', v_fin);
        END IF;
        -- Trimmed by chunks of 100 (Redis MAXLEN ~): between cap and cap + 100 kept.
        IF v_last - v_low >= p_cap + 100 THEN
            DELETE FROM {s}.stream_entries e
            WHERE e.ns = p_ns AND e.job_id = p_ids[i] AND e.pos <= v_last - p_cap;
            v_low := v_last - p_cap;
        END IF;
        -- The expiry moves only when it would move by more than a tenth of the ttl (at
        -- most a minute): the other appends leave the indexed column alone, so their
        -- update is HOT (no index entry each); a stream may expire that much early.
        UPDATE {s}.streams s SET last = v_last, low = v_low,
            expires = CASE WHEN abs(now + p_ttls[i] - st.expires) > least(60, p_ttls[i] / 10)
                THEN now + p_ttls[i] ELSE st.expires END
        WHERE s.ns = p_ns AND s.job_id = p_ids[i];
        PERFORM pg_notify(p_channel, 's:' || p_ns || ':' || p_ids[i]);
        out := out || true;
    END LOOP;
    RETURN out;
END $$;

-- The reaper's pass: expired streams (with their entries) and readers whose time passed.
CREATE FUNCTION {s}.sweep_streams(p_ns text, p_limit integer)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    gone integer;
BEGIN
    WITH g AS (
        DELETE FROM {s}.streams s USING (
            SELECT x.job_id FROM {s}.streams x
            WHERE x.ns = p_ns AND x.expires <= now
            ORDER BY x.expires LIMIT p_limit FOR UPDATE SKIP LOCKED
        ) old WHERE s.ns = p_ns AND s.job_id = old.job_id
        RETURNING s.job_id
    ), e AS (
        DELETE FROM {s}.stream_entries e USING g WHERE e.ns = p_ns AND e.job_id = g.job_id
    )
    SELECT count(*) INTO gone FROM g;
    DELETE FROM {s}.stream_readers r USING (
        SELECT x.job_id, x.reader FROM {s}.stream_readers x
        WHERE x.ns = p_ns AND x.until <= now LIMIT p_limit FOR UPDATE SKIP LOCKED
    ) old WHERE r.ns = p_ns AND r.job_id = old.job_id AND r.reader = old.reader;
    RETURN gone;
END $$;
"""
