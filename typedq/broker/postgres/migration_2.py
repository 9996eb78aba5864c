"""The PostgreSQL broker's migration 2: observability (per-minute rollups counted by the
transitions, the worker and queue registries; complete, fail and recover replaced to
count). Released: never edited (a change is a new migration).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
-- Observability (capability Observability): throughput rollups per queue and minute,
-- the worker registry and the queue registry.

-- Completions (completed), final failures (failed) and retries (retried) of a queue in a
-- minute (minutes since the epoch, the database's clock). A row per writer shard
-- (the backend's pid modulo 8), summed when read: workers finishing jobs of one queue at
-- once do not queue on one row lock. Minutes older than a day go in the reaper's pass.
CREATE TABLE {s}.rollups (
    ns text NOT NULL,
    queue text NOT NULL,
    minute bigint NOT NULL,
    shard smallint NOT NULL,
    completed bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, queue, minute, shard)
);
-- The reaper's pass drops old minutes by this index (a count's update changes no
-- indexed column: it stays a HOT update).
CREATE INDEX rollups_minute ON {s}.rollups (ns, minute);

-- Live workers: their last heartbeat's WorkerInfo (msgpack) until it expires.
CREATE TABLE {s}.workers (
    ns text NOT NULL,
    id text NOT NULL,
    until double precision NOT NULL,
    info bytea NOT NULL,
    PRIMARY KEY (ns, id)
);

-- Every queue a worker registered or a producer enqueued to (kept for good).
CREATE TABLE {s}.queues (
    ns text NOT NULL,
    queue text NOT NULL,
    PRIMARY KEY (ns, queue)
);
INSERT INTO {s}.queues (ns, queue) SELECT DISTINCT ns, queue FROM {s}.jobs
ON CONFLICT DO NOTHING;

-- Count, per job, field p_fields[i] (0 completed, 1 failed, 2 retried) of queue
-- p_queues[i] in now's minute: one row per queue (in queue order: no deadlock between
-- two batches of several queues).
-- (PL/pgSQL, not SQL: its plan is kept for the session, where a SQL function's INSERT
-- would be planned again at every call.)
CREATE FUNCTION {s}.roll(p_ns text, p_queues text[], p_fields smallint[],
                         p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.rollups AS r (ns, queue, minute, shard, completed, failed, retried)
    SELECT p_ns, t.q, floor(p_now / 60)::bigint, (pg_backend_pid() % 8)::smallint,
           count(*) FILTER (WHERE t.f = 0), count(*) FILTER (WHERE t.f = 1),
           count(*) FILTER (WHERE t.f = 2)
    FROM unnest(p_queues, p_fields) AS t (q, f)
    GROUP BY t.q ORDER BY t.q
    ON CONFLICT (ns, queue, minute, shard) DO UPDATE
    SET completed = r.completed + excluded.completed, failed = r.failed + excluded.failed,
        retried = r.retried + excluded.retried;
END $$;

-- As in migration 1, and each completion counted in its queue's minute.
CREATE OR REPLACE FUNCTION {s}.complete(p_ns text, p_ids text[], p_tokens text[],
                                        p_results bytea[], p_ttl double precision,
                                        p_cap bigint, p_channel text)
RETURNS smallint[] LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    out smallint[] := '{{}}';
    done integer := 0;
    q text;
    rq text[] := '{{}}';
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_ids, 1), 0) LOOP
        UPDATE {s}.jobs SET state = 3, result = p_results[i], done_token = p_tokens[i],
            token = NULL, finished_at = now, lease_until = 0, seq = nextval('{s}.job_seq')
        WHERE ns = p_ns AND id = p_ids[i] AND state = 2 AND token = p_tokens[i]
        RETURNING queue INTO q;
        IF FOUND THEN
            out := out || 0::smallint;
            done := done + 1;
            rq := rq || q;
            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE
            out := out || {s}.fenced(p_ns, p_ids[i], p_tokens[i]);
        END IF;
    END LOOP;
    IF done > 0 THEN
        PERFORM {s}.finished_add(p_ns, 3::smallint, done, p_ttl, p_cap, now, false);
        PERFORM {s}.roll(p_ns, rq, array_fill(0::smallint, ARRAY[done]), now);
    END IF;
    RETURN out;
END $$;

-- As in migration 1, and each final failure and retry counted in its queue's minute.
CREATE OR REPLACE FUNCTION {s}.fail(p_ns text, p_ids text[], p_tokens text[],
                                    p_errors bytea[], p_delays double precision[],
                                    p_cancelled boolean[], p_refunds boolean[],
                                    p_history integer, p_ttl double precision[],
                                    p_cap bigint[], p_channel text)
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
        SELECT x.cancel_requested, x.errors, x.queue INTO j FROM {s}.jobs x
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
        -- Waiting at once, or scheduled: a waiting worker looks again (and learns when
        -- the retry is due).
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
        FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
              WHERE x.ns = p_ns AND x.id = ANY (p_ids) AND x.state IN (0, 1)) d;
    END IF;
    RETURN out;
END $$;

-- As in migration 1, and each job failed for stalling counted in its queue's minute;
-- the reaper's pass also drops the rollups older than a day and expired workers.
CREATE OR REPLACE FUNCTION {s}.recover(p_ns text, p_limit integer, p_holding text[],
                                       p_max_stalls integer, p_history integer,
                                       p_lost text, p_stalled text,
                                       p_ttl double precision[], p_cap bigint[],
                                       p_channel text)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    j record;
    got integer := 0;
    ended integer[] := ARRAY[0, 0, 0];
    requeued boolean := false;
    rq text[] := '{{}}';
BEGIN
    DELETE FROM {s}.claims WHERE ns = p_ns AND at < now - 60;
    DELETE FROM {s}.rollups WHERE ns = p_ns AND minute <= floor(now / 60)::bigint - 1440;
    DELETE FROM {s}.workers WHERE ns = p_ns AND until <= now;
    FOR j IN
        SELECT x.id, x.stalls, x.cancel_requested, x.queue FROM {s}.jobs x
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
            rq := rq || j.queue;
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
    IF cardinality(rq) > 0 THEN
        PERFORM {s}.roll(p_ns, rq, array_fill(1::smallint, ARRAY[cardinality(rq)]), now);
    END IF;
    IF requeued THEN
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q)
        FROM (SELECT DISTINCT x.queue AS q FROM {s}.jobs x
              WHERE x.ns = p_ns AND x.state = 0 AND x.run_at = now) d;
    END IF;
    RETURN got;
END $$;
"""
