"""The PostgreSQL broker's migration 1: the job table, its indexes and the functions of the
core store (enqueue, claim, complete, fail, release, cancel, recover, retention) and of
operator actions. Released: never edited (a change is a new migration).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
CREATE TABLE {s}.jobs (
    ns text NOT NULL,
    id text NOT NULL,
    queue text NOT NULL,
    message bytea NOT NULL,
    priority integer NOT NULL DEFAULT 0,
    state smallint NOT NULL,
    seq bigint NOT NULL,
    attempt integer NOT NULL DEFAULT 0,
    enqueued_at double precision NOT NULL,
    run_at double precision NOT NULL DEFAULT 0,
    started_at double precision NOT NULL DEFAULT 0,
    finished_at double precision NOT NULL DEFAULT 0,
    lease_until double precision NOT NULL DEFAULT 0,
    token text,
    done_token text,
    worker_id text,
    result bytea,
    error bytea,
    errors bytea[] NOT NULL DEFAULT '{{}}',
    progress bytea,
    stalls integer NOT NULL DEFAULT 0,
    cancel_requested boolean NOT NULL DEFAULT false,
    br_kind text,
    br_message text,
    PRIMARY KEY (ns, id)
);
CREATE SEQUENCE {s}.job_seq;
CREATE INDEX jobs_waiting ON {s}.jobs (ns, queue, priority DESC, seq) WHERE state = 0;
CREATE INDEX jobs_scheduled ON {s}.jobs (ns, queue, run_at) WHERE state = 1;
CREATE INDEX jobs_active ON {s}.jobs (ns, lease_until) WHERE state = 2;
CREATE INDEX jobs_finished ON {s}.jobs (ns, state, finished_at) WHERE state >= 3;
CREATE INDEX jobs_finished_order ON {s}.jobs (ns, state, seq) WHERE state >= 3;
CREATE INDEX jobs_queue_state ON {s}.jobs (ns, queue, state, seq);

-- How many finished jobs of each state a namespace holds (retention's count bound).
CREATE TABLE {s}.finished (
    ns text NOT NULL,
    state smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, state)
);

-- How many finished jobs retention deleted, per queue and state (QueueStats.trimmed).
CREATE TABLE {s}.trimmed (
    ns text NOT NULL,
    queue text NOT NULL,
    state smallint NOT NULL,
    n bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, queue, state)
);

-- Recent claims by claim id: a re-sent claim answers what its first copy took.
CREATE TABLE {s}.claims (
    ns text NOT NULL,
    claim_id text NOT NULL,
    at double precision NOT NULL,
    PRIMARY KEY (ns, claim_id)
);

CREATE FUNCTION {s}.now_s() RETURNS double precision
LANGUAGE sql VOLATILE AS $$ SELECT extract(epoch FROM clock_timestamp())::double precision $$;

-- Count ``k`` more finished jobs of ``st``, then apply retention to that state: the
-- oldest past the count bound go, and with ``sweep`` (the reaper's pass, recover) those
-- older than the ttl (at most 1000 each a call). The age bound is applied by the
-- reaper's pass alone: a finish costs no scan of the finished jobs' ages.
CREATE FUNCTION {s}.finished_add(p_ns text, st smallint, k integer, ttl double precision,
                                 cap bigint, now double precision, sweep boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    total bigint;
    gone integer := 0;
    more integer;
BEGIN
    INSERT INTO {s}.finished AS f (ns, state, n) VALUES (p_ns, st, k)
    ON CONFLICT (ns, state) DO UPDATE SET n = f.n + k
    RETURNING n INTO total;
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
    IF NOT sweep THEN
        IF gone > 0 THEN
            UPDATE {s}.finished SET n = n - gone WHERE ns = p_ns AND state = st;
        END IF;
        RETURN;
    END IF;
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
    IF gone > 0 THEN
        UPDATE {s}.finished SET n = n - gone WHERE ns = p_ns AND state = st;
    END IF;
END $$;

-- Store new jobs (an id that exists, or repeats in the batch, adds nothing); refuse the
-- whole batch (SQLSTATE TQ001, "queue|pending|adding") past max_queue_length.
CREATE FUNCTION {s}.enqueue(p_ns text, p_ids text[], p_queues text[], p_messages bytea[],
                            p_priorities integer[], p_etas double precision[],
                            p_delays double precision[], p_cap integer, p_channel text)
RETURNS boolean[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    created boolean[] := '{{}}';
    run double precision;
    q text;
    pending bigint;
    adding bigint;
    k integer;
BEGIN
    IF p_cap > 0 THEN
        FOR q IN SELECT DISTINCT u FROM unnest(p_queues) u ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(hashtext('typedq-cap:' || p_ns || ':' || q));
        END LOOP;
        FOR q, adding IN
            SELECT b.queue, count(DISTINCT b.id) FROM unnest(p_ids, p_queues) AS b(id, queue)
            WHERE NOT EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = b.id)
            GROUP BY b.queue
        LOOP
            SELECT count(*) INTO pending FROM {s}.jobs j
            WHERE j.ns = p_ns AND j.queue = q AND j.state IN (0, 1);
            IF pending + adding > p_cap THEN
                RAISE EXCEPTION USING ERRCODE = 'TQ001',
                    MESSAGE = q || '|' || pending || '|' || adding;
            END IF;
        END LOOP;
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        run := CASE WHEN p_etas[i] > 0 THEN p_etas[i]
                    WHEN p_delays[i] > 0 THEN now + p_delays[i] ELSE 0 END;
        INSERT INTO {s}.jobs (ns, id, queue, message, priority, state, seq, enqueued_at, run_at)
        VALUES (p_ns, p_ids[i], p_queues[i], p_messages[i], p_priorities[i],
                CASE WHEN run > now THEN 1 ELSE 0 END, nextval('{s}.job_seq'), now,
                CASE WHEN run > now THEN run ELSE 0 END)
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS k = ROW_COUNT;
        created := created || (k > 0);
    END LOOP;
    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || u)
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d;
    RETURN created;
END $$;

-- Take up to p_limit waiting jobs of p_queues (due scheduled jobs first join the tail of
-- their level), best first, under fresh leases; a re-sent claim id answers the jobs its
-- first copy took that it still holds, and claims nothing new.
CREATE FUNCTION {s}.claim(p_ns text, p_queues text[], p_limit integer, p_worker text,
                          p_lease double precision, p_claim text)
RETURNS TABLE (n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    got bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM {s}.claims c
               WHERE c.ns = p_ns AND c.claim_id = p_claim AND c.at > now - 60) THEN
        RETURN QUERY
        SELECT split_part(j.token, '.', 2)::bigint, j.message, j.token, j.attempt,
               j.enqueued_at, j.stalls, j.run_at
        FROM {s}.jobs j
        WHERE j.ns = p_ns AND j.state = 2 AND j.token LIKE p_claim || '.%';
        RETURN;
    END IF;
    UPDATE {s}.jobs j SET state = 0, seq = d.nseq
    FROM (
        SELECT o.id, nextval('{s}.job_seq') AS nseq FROM (
            SELECT x.id FROM {s}.jobs x
            WHERE x.ns = p_ns AND x.queue = ANY (p_queues) AND x.state = 1 AND x.run_at <= now
            ORDER BY x.run_at, x.seq
            FOR UPDATE SKIP LOCKED
        ) o
    ) d
    WHERE j.ns = p_ns AND j.id = d.id;
    RETURN QUERY
    -- The best p_limit of each queue (an index walk each: "queue = ANY" would sort every
    -- waiting job), then the best p_limit of those; the others stay locked only until
    -- this call's transaction ends.
    WITH picked AS (
        SELECT y.id, row_number() OVER (ORDER BY y.priority DESC, y.seq) AS k
        FROM (
            SELECT x.id, x.priority, x.seq
            FROM unnest(p_queues) AS qn (q),
            LATERAL (
                SELECT w.id, w.priority, w.seq FROM {s}.jobs w
                WHERE w.ns = p_ns AND w.queue = qn.q AND w.state = 0
                ORDER BY w.priority DESC, w.seq
                LIMIT p_limit
                FOR UPDATE SKIP LOCKED
            ) x
            ORDER BY x.priority DESC, x.seq
            LIMIT p_limit
        ) y
    )
    UPDATE {s}.jobs j
    SET state = 2, attempt = j.attempt + 1, token = p_claim || '.' || picked.k,
        lease_until = now + p_lease, started_at = now, worker_id = p_worker
    FROM picked
    WHERE j.ns = p_ns AND j.id = picked.id
    RETURNING picked.k, j.message, j.token, j.attempt, j.enqueued_at, j.stalls, j.run_at;
    GET DIAGNOSTICS got = ROW_COUNT;
    IF got > 0 THEN
        INSERT INTO {s}.claims (ns, claim_id, at) VALUES (p_ns, p_claim, now)
        ON CONFLICT (ns, claim_id) DO UPDATE SET at = excluded.at;
    END IF;
END $$;

-- The answer of a fenced transition that did not take effect: 3 not found,
-- 1 already finished by this token, 2 lease lost.
CREATE FUNCTION {s}.fenced(p_ns text, p_id text, p_token text) RETURNS smallint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT CASE WHEN j.done_token = p_token THEN 1 ELSE 2 END::smallint
         FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = p_id),
        3::smallint)
$$;

CREATE FUNCTION {s}.complete(p_ns text, p_ids text[], p_tokens text[], p_results bytea[],
                             p_ttl double precision, p_cap bigint, p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    done integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        UPDATE {s}.jobs SET state = 3, result = p_results[i], done_token = p_tokens[i],
            token = NULL, finished_at = now, lease_until = 0, seq = nextval('{s}.job_seq')
        WHERE ns = p_ns AND id = p_ids[i] AND state = 2 AND token = p_tokens[i];
        IF FOUND THEN
            out := out || 0::smallint;
            done := done + 1;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE
            out := out || {s}.fenced(p_ns, p_ids[i], p_tokens[i]);
        END IF;
    END LOOP;
    IF done > 0 THEN
        PERFORM {s}.finished_add(p_ns, 3::smallint, done, p_ttl, p_cap, now, false);
    END IF;
    RETURN out;
END $$;

-- complete, then claim: the slots a worker frees are refilled in the same round trip.
-- Every row carries the completions' answers; with nothing claimed, one row of them.
CREATE FUNCTION {s}.complete_and_claim(p_ns text, p_ids text[], p_tokens text[],
                                       p_results bytea[], p_ttl double precision,
                                       p_cap bigint, p_channel text, p_queues text[],
                                       p_limit integer, p_worker text,
                                       p_lease double precision, p_claim text)
RETURNS TABLE (codes smallint[], n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql AS $$
DECLARE
    done smallint[];
    r record;
    got boolean := false;
BEGIN
    done := {s}.complete(p_ns, p_ids, p_tokens, p_results, p_ttl, p_cap, p_channel);
    FOR r IN SELECT * FROM {s}.claim(p_ns, p_queues, p_limit, p_worker, p_lease, p_claim) LOOP
        codes := done;
        n := r.n;
        message := r.message;
        token := r.token;
        attempt := r.attempt;
        enqueued_at := r.enqueued_at;
        stalls := r.stalls;
        run_at := r.run_at;
        got := true;
        RETURN NEXT;
    END LOOP;
    IF NOT got THEN
        codes := done;
        RETURN NEXT;
    END IF;
END $$;

-- Failed attempts: retried (scheduled after the delay, or waiting at once), or final
-- (failed; cancelled when asked to or when a cancel was requested).
CREATE FUNCTION {s}.fail(p_ns text, p_ids text[], p_tokens text[], p_errors bytea[],
                         p_delays double precision[], p_cancelled boolean[],
                         p_refunds boolean[], p_history integer,
                         p_ttl double precision[], p_cap bigint[], p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    j record;
    st smallint;
    ended integer[] := ARRAY[0, 0, 0];
    retried boolean := false;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT x.cancel_requested, x.errors INTO j FROM {s}.jobs x
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
                seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = p_ids[i];
            ended[st - 2] := ended[st - 2] + 1;
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
        END IF;
        out := out || 0::smallint;
    END LOOP;
    FOR k IN 1 .. 3 LOOP
        IF ended[k] > 0 THEN
            PERFORM {s}.finished_add(p_ns, (k + 2)::smallint, ended[k],
                                     p_ttl[least(k, 2)], p_cap[least(k, 2)], now, false);
        END IF;
    END LOOP;
    IF retried THEN
        -- Waiting at once, or scheduled: a waiting worker looks again (and learns when
        -- the retry is due).
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
        FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
              WHERE x.ns = p_ns AND x.id = ANY (p_ids) AND x.state IN (0, 1)) d;
    END IF;
    RETURN out;
END $$;

-- Claimed jobs handed back unrun: waiting again at their old place, the attempt not
-- spent; one whose cancel was requested is cancelled instead.
CREATE FUNCTION {s}.release(p_ns text, p_ids text[], p_tokens text[], p_message text,
                            p_ttl double precision, p_cap bigint, p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    asked boolean;
    cancelled integer := 0;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT x.cancel_requested INTO asked FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.id = p_ids[i] AND x.state = 2 AND x.token = p_tokens[i]
        FOR UPDATE;
        IF NOT FOUND THEN
            out := out || {s}.fenced(p_ns, p_ids[i], p_tokens[i]);
            CONTINUE;
        END IF;
        IF asked THEN
            UPDATE {s}.jobs SET state = 5, attempt = attempt - 1, done_token = p_tokens[i],
                token = NULL, lease_until = 0, finished_at = now,
                br_kind = 'cancelled_w', br_message = p_message, seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = p_ids[i];
            cancelled := cancelled + 1;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE
            UPDATE {s}.jobs SET state = 0, attempt = attempt - 1, done_token = p_tokens[i],
                token = NULL, lease_until = 0, run_at = now
            WHERE ns = p_ns AND id = p_ids[i];
        END IF;
        out := out || 0::smallint;
    END LOOP;
    IF cancelled > 0 THEN
        PERFORM {s}.finished_add(p_ns, 5::smallint, cancelled, p_ttl, p_cap, now, false);
    END IF;
    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
    FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
          WHERE x.ns = p_ns AND x.id = ANY (p_ids) AND x.state = 0) d;
    RETURN out;
END $$;

-- Cancel: a waiting or scheduled job ends cancelled; a running one gets a request.
-- Answers 0 cancelled, 1 requested, 2 already final, 3 not found.
CREATE FUNCTION {s}.cancel(p_ns text, p_id text, p_waiting text, p_scheduled text,
                           p_ttl double precision, p_cap bigint, p_channel text)
RETURNS smallint LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    st smallint;
BEGIN
    SELECT x.state INTO st FROM {s}.jobs x WHERE x.ns = p_ns AND x.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 3;
    ELSIF st >= 3 THEN
        RETURN 2;
    ELSIF st = 2 THEN
        UPDATE {s}.jobs SET cancel_requested = true WHERE ns = p_ns AND id = p_id;
        PERFORM pg_notify(p_channel, 'c:' || p_ns);
        RETURN 1;
    END IF;
    UPDATE {s}.jobs SET state = 5, finished_at = now, br_kind = 'cancelled',
        br_message = CASE WHEN st = 0 THEN p_waiting ELSE p_scheduled END,
        seq = nextval('{s}.job_seq')
    WHERE ns = p_ns AND id = p_id;
    PERFORM {s}.finished_add(p_ns, 5::smallint, 1, p_ttl, p_cap, now, false);
    PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_id);
    RETURN 0;
END $$;

-- Operator actions (capability OperatorActions). Retry: a failed or cancelled job is
-- waiting again at the tail of its level, a fresh life (attempt and stalls from zero, its
-- finish, result, error and worker cleared; its error history kept). Answers per id:
-- 0 retried, 1 not retryable (any other state), 2 not found.
CREATE FUNCTION {s}.retry(p_ns text, p_ids text[], p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    st smallint;
    q text;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        SELECT x.state, x.queue INTO st, q FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.id = p_ids[i] FOR UPDATE;
        IF NOT FOUND THEN
            out := out || 2::smallint;
        ELSIF st NOT IN (4, 5) THEN
            out := out || 1::smallint;
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

-- Delete jobs (of p_ids, in any state or in p_states; of p_queue in p_states when p_ids
-- is NULL): finished jobs leave retention's count, and each deleted job's waiters are
-- woken. Answers the ids deleted.
CREATE FUNCTION {s}.remove(p_ns text, p_ids text[], p_states smallint[], p_queue text,
                           p_channel text)
RETURNS text[] LANGUAGE plpgsql AS $$
DECLARE
    gone text[];
BEGIN
    WITH d AS (
        DELETE FROM {s}.jobs j
        WHERE j.ns = p_ns
          AND (CASE WHEN p_ids IS NULL THEN j.queue = p_queue ELSE j.id = ANY (p_ids) END)
          AND (p_states IS NULL OR j.state = ANY (p_states))
        RETURNING j.id, j.state
    ), c AS (
        UPDATE {s}.finished f SET n = f.n - k.cnt
        FROM (SELECT d.state, count(*) AS cnt FROM d WHERE d.state >= 3 GROUP BY d.state) k
        WHERE f.ns = p_ns AND f.state = k.state
    )
    SELECT coalesce(array_agg(d.id), '{{}}') INTO gone FROM d;
    PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || g) FROM unnest(gone) g;
    RETURN gone;
END $$;

-- Jobs whose lease expired (but those in p_holding): waiting again at their old place
-- (stall counted), or, past max_stalls, failed (stalled); cancelled when a cancel was
-- requested. Also applies every final state's age bound, and forgets old claim ids.
CREATE FUNCTION {s}.recover(p_ns text, p_limit integer, p_holding text[],
                            p_max_stalls integer, p_history integer, p_lost text,
                            p_stalled text, p_ttl double precision[], p_cap bigint[],
                            p_channel text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    j record;
    got integer := 0;
    ended integer[] := ARRAY[0, 0, 0];
    requeued boolean := false;
BEGIN
    DELETE FROM {s}.claims WHERE ns = p_ns AND at < now - 60;
    FOR j IN
        SELECT x.id, x.stalls, x.cancel_requested FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.state = 2 AND x.lease_until < now
          AND NOT (x.id = ANY (p_holding))
        ORDER BY x.lease_until LIMIT p_limit
        FOR UPDATE SKIP LOCKED
    LOOP
        got := got + 1;
        IF j.cancel_requested THEN
            UPDATE {s}.jobs SET state = 5, stalls = stalls + 1, done_token = NULL,
                token = NULL, lease_until = 0, finished_at = now, br_kind = 'cancelled_w',
                br_message = p_lost, seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = j.id;
            ended[3] := ended[3] + 1;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || j.id);
        ELSIF j.stalls + 1 > p_max_stalls THEN
            UPDATE {s}.jobs SET state = 4, stalls = stalls + 1, done_token = NULL,
                token = NULL, lease_until = 0, finished_at = now, br_kind = 'stalled',
                br_message = format(p_stalled, j.stalls + 1, p_max_stalls),
                seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = j.id;
            ended[2] := ended[2] + 1;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || j.id);
        ELSE
            UPDATE {s}.jobs SET state = 0, stalls = stalls + 1, done_token = NULL,
                token = NULL, lease_until = 0, run_at = now
            WHERE ns = p_ns AND id = j.id;
            requeued := true;
        END IF;
    END LOOP;
    FOR k IN 1 .. 3 LOOP
        PERFORM {s}.finished_add(p_ns, (k + 2)::smallint, ended[k],
                                 p_ttl[least(k, 2)], p_cap[least(k, 2)], now, true);
    END LOOP;
    IF requeued THEN
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
        FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
              WHERE x.ns = p_ns AND x.state = 0 AND x.run_at = now) d;
    END IF;
    RETURN got;
END $$;
"""
