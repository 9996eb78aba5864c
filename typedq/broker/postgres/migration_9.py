"""The PostgreSQL broker's migration 9: durable runs (capability Runs,
:mod:`typedq.broker.runs`). Released: never edited (a change is a new migration).

A run is a row of ``runs`` (its log an array of encoded entries, compared by its length
and appended to in one update); its signal inbox is rows of ``run_inbox`` and the kept
outcomes of its ended steps are rows of ``run_outcomes`` (both go with the run). The
rules are the embedded broker's (``memory/runs.py``), the Redis Lua (``run_*.lua``) the
other statement of them.

A turn is a row of ``jobs`` inserted here (``run_wake``): its envelope is the run's
``turn_head || msgpack(turn id) || turn_tail`` (the envelope is array-like and the id
its first field, so the Python side cuts the two parts once, at create).

An append stores the steps it schedules in its own transaction (one round trip per
turn). A step's end is taken by a trigger, in the transaction that finished it (whatever made
it final: complete, complete_and_claim, fail, release, cancel, recover): ``run_step``
keeps its outcome with its run and enqueues the turn when the run waits on it, so a
crash never loses the wake-up. Its ``WHEN`` clause reads the row alone: a step is a job
whose envelope's ``run_queue`` is not empty, and that field is the third from the end
of the envelope, followed by ``fair_key`` (empty) and ``fair_weight`` (0, which this
broker requires): so a job with ``run_queue`` empty ends with the bytes a0 a0 00, and a
job that is no step pays no query. ``run_turn`` fails a run whose turn failed for good.
The trigger locks the step's run until the settle commits: two settles of steps of the
same runs in opposite orders (a gather's steps, two workers' batches) can deadlock;
PostgreSQL rolls one back and the call is sent again
(:func:`typedq.broker.postgres.connection.call`), as with flows. Appends lock their runs
in id order.

Ended runs are kept within the retention bounds as finished jobs are: the count bound
at each end (per final state), the age bound at every read (a run past it reads as
none) and at each end (at most 100 per call).

Run states as stored: 0 running, 1 completed, 2 failed, 3 cancelled (RunState's order).
Waiters of ``wait_run`` are woken by ``r:<ns>:<run id>`` notifications (the log grew or
the run ended).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
CREATE TABLE {s}.runs (
    ns text NOT NULL,
    id text NOT NULL,
    name text NOT NULL,
    queue text NOT NULL,
    turn_task text NOT NULL,
    turn_payload bytea NOT NULL,
    input bytea NOT NULL,
    fingerprint text NOT NULL,
    -- A turn's envelope around its id (see the module).
    turn_head bytea NOT NULL,
    turn_tail bytea NOT NULL,
    state smallint NOT NULL DEFAULT 0,
    log bytea[] NOT NULL DEFAULT '{{}}',
    created_at double precision NOT NULL,
    finished_at double precision NOT NULL DEFAULT 0,
    result bytea,
    failure bytea,
    wait_jobs text[] NOT NULL DEFAULT '{{}}',
    wait_signal text,
    wake_at double precision,
    -- The last immediate turn enqueued (no second one while it waits), and how many.
    turn text,
    turns integer NOT NULL DEFAULT 0,
    -- The retention bounds its creator had ({{completed, failed}}): a run a trigger ends
    -- (its turn failed) is kept by them.
    ttls double precision[] NOT NULL,
    caps bigint[] NOT NULL,
    PRIMARY KEY (ns, id)
);
CREATE INDEX runs_ended ON {s}.runs (ns, state, finished_at) WHERE state > 0;

CREATE SEQUENCE {s}.run_inbox_seq;
CREATE TABLE {s}.run_inbox (
    ns text NOT NULL,
    run_id text NOT NULL,
    signal text NOT NULL,
    seq bigint NOT NULL,
    payload bytea NOT NULL,
    PRIMARY KEY (ns, run_id, signal, seq),
    FOREIGN KEY (ns, run_id) REFERENCES {s}.runs (ns, id) ON DELETE CASCADE
);

CREATE TABLE {s}.run_outcomes (
    ns text NOT NULL,
    run_id text NOT NULL,
    job_id text NOT NULL,
    state smallint NOT NULL,
    result bytea,
    error bytea,
    PRIMARY KEY (ns, run_id, job_id),
    FOREIGN KEY (ns, run_id) REFERENCES {s}.runs (ns, id) ON DELETE CASCADE
);

-- One run as the Python side reads it (rows.run_record_of); ``created`` is set by
-- run_create alone.
CREATE TYPE {s}.run_row AS (
    k integer,
    created boolean,
    id text,
    name text,
    queue text,
    turn_task text,
    turn_payload bytea,
    input bytea,
    fingerprint text,
    state smallint,
    log bytea[],
    created_at double precision,
    finished_at double precision,
    result bytea,
    failure bytea,
    wait_jobs text[],
    wait_signal text,
    wake_at double precision,
    inbox_signals text[],
    inbox_payloads bytea[],
    outcome_jobs text[],
    outcome_states smallint[],
    outcome_results bytea[],
    outcome_errors bytea[],
    read_at double precision
);

-- The age bound of an ended run's state (p_ttls: {{completed, failed}}).
CREATE FUNCTION {s}.run_ttl(p_state smallint, p_ttls double precision[])
RETURNS double precision LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_state = 1 THEN p_ttls[1] ELSE p_ttls[2] END
$$;

-- Runs p_ids (NULL id: none, or ended past its age bound), in order.
CREATE FUNCTION {s}.run_rows(p_ns text, p_ids text[], p_ttls double precision[])
RETURNS SETOF {s}.run_row LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
BEGIN
    RETURN QUERY
    SELECT i.k::integer, NULL::boolean, r.id, r.name, r.queue, r.turn_task, r.turn_payload,
           r.input, r.fingerprint, r.state, r.log, r.created_at, r.finished_at, r.result,
           r.failure, r.wait_jobs, r.wait_signal, r.wake_at,
           b.signals, b.payloads, o.jobs, o.states, o.results, o.errors,
           floor(now * 1000000) / 1000000
    FROM unnest(p_ids) WITH ORDINALITY AS i(id, k)
    LEFT JOIN {s}.runs r ON r.ns = p_ns AND r.id = i.id
        AND (r.state = 0 OR r.finished_at > now - {s}.run_ttl(r.state, p_ttls))
    LEFT JOIN LATERAL (
        SELECT array_agg(x.signal ORDER BY x.signal, x.seq) AS signals,
               array_agg(x.payload ORDER BY x.signal, x.seq) AS payloads
        FROM {s}.run_inbox x WHERE x.ns = p_ns AND x.run_id = r.id
    ) b ON true
    LEFT JOIN LATERAL (
        SELECT array_agg(y.job_id ORDER BY y.job_id) AS jobs,
               array_agg(y.state ORDER BY y.job_id) AS states,
               array_agg(y.result ORDER BY y.job_id) AS results,
               array_agg(y.error ORDER BY y.job_id) AS errors
        FROM {s}.run_outcomes y WHERE y.ns = p_ns AND y.run_id = r.id
    ) o ON true
    ORDER BY i.k;
END $$;

-- Run p_id locked for an update: its state, or NULL (no such run; one ended past its age
-- bound is deleted here).
CREATE FUNCTION {s}.run_lock(p_ns text, p_id text, p_ttls double precision[],
                             p_now double precision)
RETURNS smallint LANGUAGE plpgsql AS $$
DECLARE
    st smallint;
    fin double precision;
BEGIN
    SELECT r.state, r.finished_at INTO st, fin FROM {s}.runs r
    WHERE r.ns = p_ns AND r.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF st > 0 AND fin <= p_now - {s}.run_ttl(st, p_ttls) THEN
        DELETE FROM {s}.runs WHERE ns = p_ns AND id = p_id;
        RETURN NULL;
    END IF;
    RETURN st;
END $$;

-- Enqueue a turn of run p_id (locked by the caller): now (p_at at or before p_now) or at
-- p_at. At most one immediate turn waits at a time. Past max_queue_length too: a turn is
-- the run's own continuation, never refused. An id taken already stores nothing.
CREATE FUNCTION {s}.run_wake(p_ns text, p_id text, p_at double precision,
                             p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    r record;
    tid text;
    immediate boolean := p_at <= p_now;
BEGIN
    SELECT x.queue, x.turn_task, x.turn_head, x.turn_tail, x.turn, x.turns INTO r
    FROM {s}.runs x WHERE x.ns = p_ns AND x.id = p_id;
    IF immediate AND r.turn IS NOT NULL AND EXISTS (
        SELECT 1 FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = r.turn AND j.state = 0
    ) THEN
        RETURN;
    END IF;
    tid := p_id || ':t' || (r.turns + 1);
    UPDATE {s}.runs SET turns = turns + 1,
                        turn = CASE WHEN immediate THEN tid ELSE turn END
    WHERE ns = p_ns AND id = p_id;
    INSERT INTO {s}.jobs (ns, id, queue, message, priority, state, seq, enqueued_at, run_at,
                          task, rate_key, conc_key)
    VALUES (p_ns, tid, r.queue, r.turn_head || {s}.mp_str(tid) || r.turn_tail, 0,
            CASE WHEN immediate THEN 0 ELSE 1 END, nextval('{s}.job_seq'), p_now,
            CASE WHEN immediate THEN 0 ELSE p_at END, r.turn_task, '', '')
    ON CONFLICT DO NOTHING;
    PERFORM pg_notify({s}.flow_channel(), 'w:' || p_ns || ':' || r.queue);
END $$;

-- End run p_id (locked) in p_state: its waits and kept outcomes go, then the ended runs
-- of that state past the retention bounds (p_ttls, p_caps: {{completed, failed}}).
CREATE FUNCTION {s}.run_finish(p_ns text, p_id text, p_state smallint, p_result bytea,
                               p_failure bytea, p_now double precision,
                               p_ttls double precision[], p_caps bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    cap bigint := CASE WHEN p_state = 1 THEN p_caps[1] ELSE p_caps[2] END;
BEGIN
    UPDATE {s}.runs SET state = p_state, result = p_result, failure = p_failure,
                        finished_at = p_now, wait_jobs = '{{}}', wait_signal = NULL,
                        wake_at = NULL
    WHERE ns = p_ns AND id = p_id;
    DELETE FROM {s}.run_outcomes WHERE ns = p_ns AND run_id = p_id;
    DELETE FROM {s}.runs d USING (
        SELECT o.id FROM {s}.runs o WHERE o.ns = p_ns AND o.state = p_state
        ORDER BY o.finished_at DESC, o.id DESC OFFSET cap
    ) old WHERE d.ns = p_ns AND d.id = old.id;
    DELETE FROM {s}.runs d USING (
        SELECT o.id FROM {s}.runs o
        WHERE o.ns = p_ns AND o.state = p_state
          AND o.finished_at <= p_now - {s}.run_ttl(p_state, p_ttls)
        ORDER BY o.finished_at LIMIT 100
    ) old WHERE d.ns = p_ns AND d.id = old.id;
    PERFORM pg_notify({s}.flow_channel(), 'r:' || p_ns || ':' || p_id);
END $$;

-- Create runs (an id taken by a kept run creates nothing), each with its first turn;
-- answers every run as it is after, with ``created``.
CREATE FUNCTION {s}.run_create(p_ns text, p_ids text[], p_names text[], p_queues text[],
                               p_tasks text[], p_payloads bytea[], p_inputs bytea[],
                               p_fingerprints text[], p_heads bytea[], p_tails bytea[],
                               p_ttls double precision[], p_caps bigint[])
RETURNS SETOF {s}.run_row LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    created boolean[] := '{{}}';
    n integer;
    rec {s}.run_row;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        PERFORM {s}.run_lock(p_ns, p_ids[i], p_ttls, now);
        INSERT INTO {s}.runs (ns, id, name, queue, turn_task, turn_payload, input, fingerprint,
                              turn_head, turn_tail, created_at, ttls, caps)
        VALUES (p_ns, p_ids[i], p_names[i], p_queues[i], p_tasks[i], p_payloads[i],
                p_inputs[i], p_fingerprints[i], p_heads[i], p_tails[i], now, p_ttls, p_caps)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS n = ROW_COUNT;
        created := created || (n > 0);
        IF n > 0 THEN
            PERFORM {s}.run_wake(p_ns, p_ids[i], 0, now);
        END IF;
    END LOOP;
    FOR rec IN SELECT * FROM {s}.run_rows(p_ns, p_ids, p_ttls) LOOP
        rec.created := created[rec.k];
        RETURN NEXT rec;
    END LOOP;
END $$;

-- Compare-and-append, per run: 0 appended, 1 conflict, 2 finished, 3 not found. The
-- entries, recorded jobs and waited jobs of all the appends are end to end, each
-- append's count in p_*_n.
CREATE FUNCTION {s}.run_append(p_ns text, p_ids text[], p_expected integer[],
                               p_entries_n integer[], p_entries bytea[], p_take text[],
                               p_recorded_n integer[], p_recorded text[],
                               p_states smallint[], p_results bytea[], p_failures bytea[],
                               p_wait_n integer[], p_wait text[], p_wait_signals text[],
                               p_wake_at double precision[], p_ttls double precision[],
                               p_caps bigint[], p_step_ids text[], p_step_queues text[],
                               p_step_messages bytea[], p_step_priorities integer[],
                               p_step_etas double precision[],
                               p_step_delays double precision[], p_step_cap integer,
                               p_channel text, p_step_tasks text[],
                               p_step_rate_keys text[], p_step_conc_keys text[])
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    st smallint;
    len integer;
    ea integer := 0;
    ra integer := 0;
    wa integer := 0;
    entries bytea[];
    recorded text[];
    waits text[];
    taken integer;
BEGIN
    -- The steps the appends schedule, stored first (RunAppend.steps: a later turn
    -- schedules the same ids when the compare fails), in the same transaction: a turn
    -- that schedules steps is one round trip. Past max_queue_length the whole call is
    -- refused (TQ001, as enqueue refuses).
    IF cardinality(p_step_ids) > 0 THEN
        PERFORM {s}.enqueue(p_ns, p_step_ids, p_step_queues, p_step_messages,
                            p_step_priorities, p_step_etas, p_step_delays, p_step_cap,
                            p_channel, p_step_tasks, p_step_rate_keys, p_step_conc_keys);
    END IF;
    -- The runs locked in one order (a process coalesces concurrent turns' appends into
    -- one call: two such calls must not lock the same runs in opposite orders).
    PERFORM 1 FROM {s}.runs r WHERE r.ns = p_ns AND r.id = ANY(p_ids) ORDER BY r.id
    FOR UPDATE;
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        entries := p_entries[ea + 1 : ea + p_entries_n[i]];
        recorded := p_recorded[ra + 1 : ra + p_recorded_n[i]];
        waits := p_wait[wa + 1 : wa + p_wait_n[i]];
        ea := ea + p_entries_n[i];
        ra := ra + p_recorded_n[i];
        wa := wa + p_wait_n[i];
        st := {s}.run_lock(p_ns, p_ids[i], p_ttls, now);
        IF st IS NULL THEN
            out := out || 3::smallint;
            CONTINUE;
        ELSIF st > 0 THEN
            out := out || 2::smallint;
            CONTINUE;
        END IF;
        SELECT cardinality(r.log) INTO len FROM {s}.runs r WHERE r.ns = p_ns AND r.id = p_ids[i];
        IF len <> p_expected[i] THEN
            out := out || 1::smallint;
            CONTINUE;
        END IF;
        IF p_take[i] IS NOT NULL THEN
            DELETE FROM {s}.run_inbox x USING (
                SELECT o.seq FROM {s}.run_inbox o
                WHERE o.ns = p_ns AND o.run_id = p_ids[i] AND o.signal = p_take[i]
                ORDER BY o.seq LIMIT 1
            ) oldest
            WHERE x.ns = p_ns AND x.run_id = p_ids[i] AND x.signal = p_take[i]
              AND x.seq = oldest.seq;
            GET DIAGNOSTICS taken = ROW_COUNT;
            IF taken = 0 THEN
                out := out || 1::smallint;  -- only appends take: cannot happen when fenced
                CONTINUE;
            END IF;
        END IF;
        UPDATE {s}.runs SET log = log || entries, wait_jobs = '{{}}', wait_signal = NULL,
                            wake_at = NULL
        WHERE ns = p_ns AND id = p_ids[i];
        IF cardinality(entries) > 0 THEN
            PERFORM pg_notify({s}.flow_channel(), 'r:' || p_ns || ':' || p_ids[i]);
        END IF;
        out := out || 0::smallint;
        IF p_states[i] > 0 THEN
            PERFORM {s}.run_finish(p_ns, p_ids[i], p_states[i], p_results[i], p_failures[i],
                                   now, p_ttls, p_caps);
            CONTINUE;
        END IF;
        UPDATE {s}.runs SET wait_jobs = waits, wait_signal = p_wait_signals[i],
                            wake_at = p_wake_at[i]
        WHERE ns = p_ns AND id = p_ids[i];
        -- The outcomes this append records are in the log now; the others stay (a step
        -- that ended after the turn's read).
        DELETE FROM {s}.run_outcomes
        WHERE ns = p_ns AND run_id = p_ids[i] AND job_id = ANY(recorded);
        -- A wait already over when it is set wakes the run at once (a step: a job whose
        -- envelope carries a run_queue, see the module).
        IF EXISTS (
               SELECT 1 FROM {s}.jobs j
               WHERE j.ns = p_ns AND j.id = ANY(waits) AND j.state >= 3
                 AND get_byte(j.message, octet_length(j.message) - 3) <> 160
           )
           OR (p_wait_signals[i] IS NOT NULL AND EXISTS (
               SELECT 1 FROM {s}.run_inbox x
               WHERE x.ns = p_ns AND x.run_id = p_ids[i] AND x.signal = p_wait_signals[i]
           ))
           OR (p_wake_at[i] IS NOT NULL AND p_wake_at[i] <= now) THEN
            PERFORM {s}.run_wake(p_ns, p_ids[i], 0, now);
        ELSIF p_wake_at[i] IS NOT NULL THEN
            PERFORM {s}.run_wake(p_ns, p_ids[i], p_wake_at[i], now);
        END IF;
    END LOOP;
    RETURN out;
END $$;

-- Deliver signals: 0 delivered, 1 finished, 2 not found; a run waiting for it wakes.
CREATE FUNCTION {s}.run_signal(p_ns text, p_ids text[], p_signals text[], p_payloads bytea[],
                               p_ttls double precision[])
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    st smallint;
    waiting text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        st := {s}.run_lock(p_ns, p_ids[i], p_ttls, now);
        IF st IS NULL THEN
            out := out || 2::smallint;
            CONTINUE;
        ELSIF st > 0 THEN
            out := out || 1::smallint;
            CONTINUE;
        END IF;
        INSERT INTO {s}.run_inbox (ns, run_id, signal, seq, payload)
        VALUES (p_ns, p_ids[i], p_signals[i], nextval('{s}.run_inbox_seq'), p_payloads[i]);
        SELECT r.wait_signal INTO waiting FROM {s}.runs r WHERE r.ns = p_ns AND r.id = p_ids[i];
        IF waiting = p_signals[i] THEN
            PERFORM {s}.run_wake(p_ns, p_ids[i], 0, now);
        END IF;
        out := out || 0::smallint;
    END LOOP;
    RETURN out;
END $$;

-- Enqueue a turn of each running run, now or at its time: true per run that is running.
CREATE FUNCTION {s}.run_wake_runs(p_ns text, p_ids text[], p_ats double precision[],
                                  p_ttls double precision[])
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out boolean[] := '{{}}';
    st smallint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        st := {s}.run_lock(p_ns, p_ids[i], p_ttls, now);
        IF st IS NULL OR st > 0 THEN
            out := out || false;
        ELSE
            PERFORM {s}.run_wake(p_ns, p_ids[i], p_ats[i], now);
            out := out || true;
        END IF;
    END LOOP;
    RETURN out;
END $$;

-- Cancel running runs: per run the jobs it waited on (the caller cancels them), or NULL
-- (no such run, or ended). p_message: the failure record's message.
CREATE FUNCTION {s}.run_cancel(p_ns text, p_ids text[], p_message text,
                               p_ttls double precision[], p_caps bigint[])
RETURNS TABLE (k integer, waited text[]) LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    st smallint;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        k := i;
        st := {s}.run_lock(p_ns, p_ids[i], p_ttls, now);
        IF st IS NULL OR st > 0 THEN
            waited := NULL;
        ELSE
            SELECT r.wait_jobs INTO waited FROM {s}.runs r
            WHERE r.ns = p_ns AND r.id = p_ids[i];
            PERFORM {s}.run_finish(p_ns, p_ids[i], 3::smallint, NULL,
                                   {s}.mp_failure('cancelled', 'JobCancelled', p_message, 0,
                                                  NULL, now),
                                   now, p_ttls, p_caps);
        END IF;
        RETURN NEXT;
    END LOOP;
END $$;

-- A step of a run ended (see the module): keep its outcome while its run is running,
-- and wake the run when it waits on the step.
CREATE FUNCTION {s}.run_step() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    rid text := substring(NEW.id FROM '^(.*):[0-9]+$');
    st smallint;
    waits text[];
BEGIN
    IF rid IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT r.state, r.wait_jobs INTO st, waits FROM {s}.runs r
    WHERE r.ns = NEW.ns AND r.id = rid FOR UPDATE;
    IF NOT FOUND OR st <> 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO {s}.run_outcomes AS o (ns, run_id, job_id, state, result, error)
    VALUES (NEW.ns, rid, NEW.id, NEW.state,
            CASE WHEN NEW.state = 3 THEN NEW.result END,
            CASE WHEN NEW.state <> 3 THEN
                {s}.job_error(NEW.error, NEW.br_kind, NEW.br_message, NEW.attempt,
                              NEW.worker_id, NEW.finished_at)
            END)
    ON CONFLICT (ns, run_id, job_id) DO UPDATE
        SET state = excluded.state, result = excluded.result, error = excluded.error;
    IF NEW.id = ANY(waits) THEN
        PERFORM {s}.run_wake(NEW.ns, rid, 0, {s}.now_s());
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER run_step AFTER UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN (NEW.state >= 3 AND OLD.state < 3
      AND get_byte(NEW.message, octet_length(NEW.message) - 3) <> 160)
EXECUTE FUNCTION {s}.run_step();

-- A job that is no step failed for good: when it is a turn of a running run (id
-- ``<run>:t<n>``, of the run's turn task), no turn comes again, so the run fails with
-- the turn's failure record.
CREATE FUNCTION {s}.run_turn() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    rid text := substring(NEW.id FROM '^(.*):t[0-9]+$');
    r record;
BEGIN
    SELECT x.state, x.turn_task, x.ttls, x.caps INTO r FROM {s}.runs x
    WHERE x.ns = NEW.ns AND x.id = rid FOR UPDATE;
    IF NOT FOUND OR r.state <> 0 OR r.turn_task IS DISTINCT FROM NEW.task THEN
        RETURN NULL;
    END IF;
    PERFORM {s}.run_finish(NEW.ns, rid, 2::smallint, NULL,
                           {s}.job_error(NEW.error, NEW.br_kind, NEW.br_message, NEW.attempt,
                                         NEW.worker_id, NEW.finished_at),
                           {s}.now_s(), r.ttls, r.caps);
    RETURN NULL;
END $$;

CREATE TRIGGER run_turn AFTER UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN (NEW.state = 4 AND OLD.state < 3
      AND get_byte(NEW.message, octet_length(NEW.message) - 3) = 160
      AND NEW.id ~ ':t[0-9]+$')
EXECUTE FUNCTION {s}.run_turn();
"""
