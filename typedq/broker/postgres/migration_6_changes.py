"""Migration 6 (:mod:`.migration_6`), its last part: functions of earlier migrations
made again with the flows' rules (``finished_add``, ``remove``, ``fail``, ``cancel``,
``retry``), and the flows' calls beside them (``flow_retry``, ``flow_note_spans``,
``cancel_job``, ``enqueue_flows``). Released: never edited."""

__all__ = ["SQL"]

SQL = r"""
-- As in migration 1, and the trims done with typedq.trimming set (flow_gone tells a
-- parked job retention deleted from one an operator removed).
CREATE OR REPLACE FUNCTION {s}.finished_add(p_ns text, st smallint, k integer,
                                            ttl double precision, cap bigint,
                                            now double precision, sweep boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    total bigint;
    gone integer := 0;
    more integer;
    prev text;
BEGIN
    INSERT INTO {s}.finished AS f (ns, state, n) VALUES (p_ns, st, k)
    ON CONFLICT (ns, state) DO UPDATE SET n = f.n + k
    RETURNING n INTO total;
    IF total <= cap AND NOT sweep THEN
        RETURN;
    END IF;
    prev := coalesce(current_setting('typedq.trimming', true), '');
    PERFORM set_config('typedq.trimming', '1', true);
    IF total > cap THEN
        WITH d AS (
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
    END IF;
    IF sweep THEN
        WITH d AS (
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
        gone := gone + more;
    END IF;
    PERFORM set_config('typedq.trimming', prev, true);
    IF gone > 0 THEN
        UPDATE {s}.finished SET n = n - gone WHERE ns = p_ns AND state = st;
    END IF;
END $$;

-- As in migration 1, repeated while a purge (p_ids NULL) finds more: a job the flows'
-- reactions put in the purged states (a fan-in released by its last member's deletion,
-- a job a flow's end cancelled) goes in the same purge.
CREATE OR REPLACE FUNCTION {s}.remove(p_ns text, p_ids text[], p_states smallint[],
                                      p_queue text, p_channel text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    gone text[] := '{{}}';
    round text[];
BEGIN
    LOOP
        WITH d AS (
            DELETE FROM {s}.jobs j
            WHERE j.ns = p_ns
              AND (CASE WHEN p_ids IS NULL THEN j.queue = p_queue ELSE j.id = ANY (p_ids) END)
              AND (p_states IS NULL OR j.state = ANY (p_states))
            RETURNING j.id, j.state
        ), c AS (
            UPDATE {s}.finished f SET n = f.n - k.cnt
            FROM (SELECT d.state, count(*) AS cnt FROM d WHERE d.state >= 3
                  GROUP BY d.state) k
            WHERE f.ns = p_ns AND f.state = k.state
        )
        SELECT coalesce(array_agg(d.id), '{{}}') INTO round FROM d;
        gone := gone || round;
        EXIT WHEN p_ids IS NOT NULL OR cardinality(round) = 0;
    END LOOP;
    PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || g) FROM unnest(gone) g;
    RETURN gone;
END $$;

-- As in migration 2, and a final failure with a park record (p_parks[i], a deploy's
-- undecodable payload) of a flow's job is parked: its flow waits for an operator.
CREATE FUNCTION {s}.fail(p_ns text, p_ids text[], p_tokens text[], p_errors bytea[],
                         p_delays double precision[], p_cancelled boolean[],
                         p_refunds boolean[], p_history integer,
                         p_ttl double precision[], p_cap bigint[], p_channel text,
                         p_parks bytea[])
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    j record;
    st smallint;
    ended integer[] := ARRAY[0, 0, 0];
    retried boolean := false;
    rq text[] := '{{}}';
    rf smallint[] := '{{}}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT x.cancel_requested, x.errors, x.queue, x.flow_id INTO j FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.id = p_ids[i] AND x.state = 2 AND x.token = p_tokens[i]
        FOR UPDATE;
        IF NOT FOUND THEN
            out := out || {s}.fenced(p_ns, p_ids[i], p_tokens[i]);
            CONTINUE;
        END IF;
        IF p_cancelled[i] OR p_delays[i] IS NULL OR j.cancel_requested THEN
            st := CASE WHEN p_cancelled[i] OR j.cancel_requested THEN 5 ELSE 4 END;
            UPDATE {s}.jobs SET state = st, error = p_errors[i],
                errors = (j.errors || p_errors[i])[greatest(1, cardinality(j.errors) + 2 - p_history):],
                done_token = p_tokens[i], token = NULL, finished_at = now, lease_until = 0,
                seq = nextval('{s}.job_seq'),
                parked = CASE WHEN st = 4 AND j.flow_id IS NOT NULL THEN p_parks[i] END
            WHERE ns = p_ns AND id = p_ids[i];
            ended[st - 2] := ended[st - 2] + 1;
            IF st = 4 THEN
                rq := rq || j.queue;
                rf := rf || 1::smallint;
            END IF;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE
            UPDATE {s}.jobs SET error = p_errors[i],
                errors = (j.errors || p_errors[i])[greatest(1, cardinality(j.errors) + 2 - p_history):],
                done_token = p_tokens[i], token = NULL, lease_until = 0,
                attempt = attempt - CASE WHEN p_refunds[i] THEN 1 ELSE 0 END,
                state = CASE WHEN p_delays[i] > 0 THEN 1 ELSE 0 END,
                run_at = now + p_delays[i],
                seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = p_ids[i];
            retried := true;
            rq := rq || j.queue;
            rf := rf || 2::smallint;
        END IF;
        out := out || 0::smallint;
    END LOOP;
    FOR k IN 1 .. 3 LOOP
        IF ended[k] > 0 THEN
            PERFORM {s}.finished_add(p_ns, (k + 2)::smallint, ended[k],
                                     p_ttl[least(k, 2)], p_cap[least(k, 2)], now, false);
        END IF;
    END LOOP;
    IF cardinality(rq) > 0 THEN
        PERFORM {s}.roll(p_ns, rq, rf, now);
    END IF;
    IF retried THEN
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
        FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
              WHERE x.ns = p_ns AND x.id = ANY (p_ids) AND x.state IN (0, 1)) d;
    END IF;
    RETURN out;
END $$;

-- As in migration 1, and a parked job (failed, its flow waiting for it) is cancelled as
-- a waiting one would be: its flow ends as cancelled.
CREATE OR REPLACE FUNCTION {s}.cancel(p_ns text, p_id text, p_waiting text, p_scheduled text,
                                      p_ttl double precision, p_cap bigint, p_channel text)
RETURNS smallint LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    st smallint;
    pk boolean;
BEGIN
    SELECT x.state, x.parked IS NOT NULL INTO st, pk FROM {s}.jobs x
    WHERE x.ns = p_ns AND x.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 3;
    ELSIF st >= 3 AND NOT pk THEN
        RETURN 2;
    ELSIF st = 2 THEN
        UPDATE {s}.jobs SET cancel_requested = true WHERE ns = p_ns AND id = p_id;
        PERFORM pg_notify(p_channel, 'c:' || p_ns);
        RETURN 1;
    END IF;
    IF pk THEN
        UPDATE {s}.finished SET n = n - 1 WHERE ns = p_ns AND state = 4;
    END IF;
    UPDATE {s}.jobs SET state = 5, finished_at = now, br_kind = 'cancelled', parked = NULL,
        -- records.cancelled_while('parked') for a parked job
        br_message = CASE WHEN pk THEN 'cancelled while parked'
                          WHEN st = 0 THEN p_waiting ELSE p_scheduled END,
        seq = nextval('{s}.job_seq')
    WHERE ns = p_ns AND id = p_id;
    PERFORM {s}.finished_add(p_ns, 5::smallint, 1, p_ttl, p_cap, now, false);
    PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_id);
    RETURN 0;
END $$;

-- May a failed or cancelled job of a flow run again (memory/flows.py, Flows.retry)? A
-- parked one: if its flow still waits for it. A step that ran, of a flow that has
-- ended: yes, its later steps (ended with the flow, never released) held again and the
-- flow made again. A member, a step that never ran, a job of a running flow: no.
CREATE FUNCTION {s}.flow_retry(p_ns text, p_id text, p_caps bigint[])
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    j record;
    shape integer[];
    later record;
BEGIN
    SELECT x.flow_id, x.flow_member, x.flow_step, x.hole, x.parked INTO j FROM {s}.jobs x
    WHERE x.ns = p_ns AND x.id = p_id;
    IF j.parked IS NOT NULL THEN
        UPDATE {s}.jobs SET parked = NULL WHERE ns = p_ns AND id = p_id;
        RETURN EXISTS (SELECT 1 FROM {s}.flows f WHERE f.ns = p_ns AND f.id = j.flow_id);
    END IF;
    IF j.flow_member IS NOT NULL OR j.hole IS NOT NULL
       OR EXISTS (SELECT 1 FROM {s}.flows f WHERE f.ns = p_ns AND f.id = j.flow_id) THEN
        RETURN false;
    END IF;
    SELECT x.flow_shape INTO shape FROM {s}.jobs x WHERE x.ns = p_ns AND x.id = j.flow_id;
    IF shape IS NULL THEN
        RETURN false;
    END IF;
    FOR k IN j.flow_step + 1 .. shape[1] - 1 LOOP
        SELECT x.state, x.hole INTO later FROM {s}.jobs x
        WHERE x.ns = p_ns
          AND x.id = CASE WHEN k = shape[1] - 1 THEN j.flow_id ELSE j.flow_id || '.' || k END
        FOR UPDATE;
        IF NOT FOUND OR later.state NOT IN (4, 5) OR later.hole IS NULL THEN
            RETURN false;
        END IF;
    END LOOP;
    WITH h AS (
        UPDATE {s}.jobs x SET state = 1, run_at = 9000000000.0, error = NULL,
            finished_at = 0, br_kind = NULL, br_message = NULL
        FROM (SELECT o.id, o.state AS was FROM {s}.jobs o
              WHERE o.ns = p_ns AND o.flow_id = j.flow_id AND o.flow_step > j.flow_step) y
        WHERE x.ns = p_ns AND x.id = y.id
        RETURNING y.was
    )
    UPDATE {s}.finished f SET n = f.n - c.cnt
    FROM (SELECT h.was, count(*) AS cnt FROM h GROUP BY h.was) c
    WHERE f.ns = p_ns AND f.state = c.was;
    INSERT INTO {s}.flows (ns, id, steps, members, collector, collect, remaining, caps)
    VALUES (p_ns, j.flow_id, shape[1], shape[2], false, false, 0, p_caps);
    DELETE FROM {s}.flow_ends WHERE ns = p_ns AND flow = j.flow_id;
    RETURN true;
END $$;

-- As in migration 1, and a job of a flow retried as flow_retry says (3: in_flow).
CREATE FUNCTION {s}.retry(p_ns text, p_ids text[], p_channel text, p_caps bigint[])
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    st smallint;
    q text;
    fid text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT x.state, x.queue, x.flow_id INTO st, q, fid FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.id = p_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
            out := out || 2::smallint;
        ELSIF st NOT IN (4, 5) THEN
            out := out || 1::smallint;
        ELSIF fid IS NOT NULL AND NOT {s}.flow_retry(p_ns, p_ids[i], p_caps) THEN
            out := out || 3::smallint;
        ELSE
            UPDATE {s}.jobs SET state = 0, seq = nextval('{s}.job_seq'), run_at = now,
                attempt = 0, stalls = 0, started_at = 0, finished_at = 0, result = NULL,
                error = NULL, progress = NULL, cancel_requested = false, worker_id = NULL,
                done_token = NULL, token = NULL, br_kind = NULL, br_message = NULL
            WHERE ns = p_ns AND id = p_ids[i];
            UPDATE {s}.finished SET n = n - 1 WHERE ns = p_ns AND state = st;
            PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q);
            out := out || 0::smallint;
        END IF;
    END LOOP;
    RETURN out;
END $$;

-- Keep traced fan-out members' process spans (p_spans[i], '' none) for their callback's
-- links, as the embedded broker's note_span: the attempt still holds its lease, the
-- member is among the first MAX_SPAN_LINKS and has not settled, its flow runs.
CREATE FUNCTION {s}.flow_note_spans(p_ns text, p_ids text[], p_tokens text[],
                                    p_spans text[], p_max integer)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO {s}.flow_links AS l (ns, flow, idx, span)
    SELECT p_ns, j.flow_id, j.flow_member, i.span
    FROM unnest(p_ids, p_tokens, p_spans) AS i (id, token, span)
    JOIN {s}.jobs j ON j.ns = p_ns AND j.id = i.id AND j.state = 2 AND j.token = i.token
    WHERE i.span <> '' AND j.flow_member < p_max
      AND EXISTS (SELECT 1 FROM {s}.flows f WHERE f.ns = p_ns AND f.id = j.flow_id)
      AND NOT EXISTS (SELECT 1 FROM {s}.flow_results r
                      WHERE r.ns = p_ns AND r.flow = j.flow_id AND r.idx = j.flow_member)
    ON CONFLICT (ns, flow, idx) DO UPDATE SET span = excluded.span
$$;

-- cancel, and whether an ended flow has jobs left to end (flow_finish), for the caller to
-- finish them once their holders have committed.
CREATE FUNCTION {s}.cancel_job(p_ns text, p_id text, p_waiting text, p_scheduled text,
                               p_ttl double precision, p_cap bigint, p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    code smallint;
BEGIN
    code := {s}.cancel(p_ns, p_id, p_waiting, p_scheduled, p_ttl, p_cap, p_channel);
    RETURN ARRAY[code, EXISTS (SELECT 1 FROM {s}.flow_ends WHERE ns = p_ns)::integer];
END $$;

-- Store several flows in one call, each as enqueue_flow stores it (p_counts[f] jobs of
-- the job arrays, in order, are flow f's, held to max_queue_length p_queue_caps[f]); one
-- refused (TQ001, TQ002) stores nothing of
-- it and the others are still stored. Answers per flow its code (0 stored, 1 its id
-- existed, or the refusal's SQLSTATE) and the refusal's message.
CREATE FUNCTION {s}.enqueue_flows(p_ns text, p_flows text[], p_steps integer[],
                                  p_members integer[], p_fan_out boolean[],
                                  p_collector boolean[], p_collect boolean[],
                                  p_links_holes integer[], p_counts integer[],
                                  p_ids text[], p_queues text[], p_messages bytea[],
                                  p_priorities integer[], p_holes integer[],
                                  p_tasks text[], p_rate_keys text[], p_conc_keys text[],
                                  p_queue_caps integer[], p_caps bigint[], p_channel text)
RETURNS TABLE (code text, info text) LANGUAGE plpgsql AS $$
DECLARE
    a integer := 1;
    b integer;
BEGIN
    FOR f IN 1 .. coalesce(array_length(p_flows, 1), 0) LOOP
        b := a + p_counts[f] - 1;
        BEGIN
            code := {s}.enqueue_flow(p_ns, p_flows[f], p_steps[f], p_members[f], p_fan_out[f],
                                     p_collector[f], p_collect[f], p_ids[a:b], p_queues[a:b],
                                     p_messages[a:b], p_priorities[a:b], p_holes[a:b],
                                     p_tasks[a:b], p_rate_keys[a:b], p_conc_keys[a:b],
                                     p_queue_caps[f], p_caps, p_channel,
                                     p_links_holes[f])::text;
            info := NULL;
        EXCEPTION WHEN SQLSTATE 'TQ001' OR SQLSTATE 'TQ002' THEN
            GET STACKED DIAGNOSTICS code = RETURNED_SQLSTATE, info = MESSAGE_TEXT;
        END;
        RETURN NEXT;
        a := b + 1;
    END LOOP;
END $$;
"""
