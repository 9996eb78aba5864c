"""The PostgreSQL broker's migration 6: workflows (capability Flows, :mod:`typedq.broker.flow`).
Released: never edited (a change is a new migration).

A flow's jobs are ordinary rows tagged with their flow and place (``flow_id``,
``flow_member`` or ``flow_step``); a held step is ``scheduled`` at ``HELD_AT`` with an empty
payload whose place in the stored envelope is ``hole`` (the byte offset of its ``bin 0``),
where the hand-off splices its input. A running flow is a row of ``flows`` (deleted when
the flow ends) and its settled members' fan-in elements are rows of ``flow_results``.

The hand-off is done by triggers, in the transaction of the transition that finished the
job, whatever made it final (complete, complete_and_claim, fail, release, cancel, recover,
a flow's own end): ``flow_final`` after a flow job's state becomes final, and
``flow_gone`` after a flow job that had not finished (or was parked) is deleted (remove,
purge, retention). Their ``WHEN`` clauses test columns of the row alone, so a job with no
flow pays no query. The rules are the embedded broker's (``memory/flows.py``).

A flow's end never waits for a row another transaction holds (``flow_end_jobs``: a
worker settling a batch holds its jobs' rows and waits for the flow's row, so waiting
here could deadlock); those jobs are ended by ``flow_finish`` once their holder has
committed (after the cancel, remove or purge that ended the flow, and in the reaper's
pass). A deadlock left (rare: the last member's fan-in against a cancel of the flow's
own job) is rolled back by PostgreSQL and the call sent again
(:func:`typedq.broker.postgres.connection.call`).

A failure record the flow writes is msgpack made here (``mp_failure``): the same map
msgspec encodes a ``FailureRecord`` as.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
ALTER TABLE {s}.jobs
    ADD COLUMN flow_id text,
    -- NULL, not -1, when not a member or not a step: a job with no flow stores no byte
    -- more (its row has a null bitmap already).
    ADD COLUMN flow_member integer,
    ADD COLUMN flow_step integer,
    -- On a flow's own job: {{steps, members}} (inspect and retry after the flow ended).
    ADD COLUMN flow_shape integer[],
    -- A held step: the byte offset of its empty payload in ``message``; NULL once released.
    ADD COLUMN hole integer,
    -- A parked job (failed, its flow waiting for an operator's retry): the record its
    -- flow fails with if retention deletes it first, failed_at left for the trim to set.
    ADD COLUMN parked bytea;
CREATE INDEX jobs_flow ON {s}.jobs (ns, flow_id) WHERE flow_id IS NOT NULL;

CREATE TABLE {s}.flows (
    ns text NOT NULL,
    id text NOT NULL,
    steps integer NOT NULL,
    members integer NOT NULL,
    collector boolean NOT NULL,
    collect boolean NOT NULL,
    remaining integer NOT NULL,
    completed integer NOT NULL DEFAULT 0,
    failed integer NOT NULL DEFAULT 0,
    cancelled integer NOT NULL DEFAULT 0,
    -- The first failed member by index (the default fan-in policy fails the flow with it).
    fail_index integer,
    fail_state smallint,
    fail_error bytea,
    -- Retention's count bounds (completed, failed) of the app that stored the flow: the
    -- jobs its end finalises count against them.
    caps bigint[] NOT NULL,
    -- A fan-out whose step 0 carries a trace context: the byte offset of step 0's empty
    -- trace_links in its stored envelope, where the fan-in writes its members' spans.
    links_hole integer,
    PRIMARY KEY (ns, id)
);

-- Traced fan-out members' process spans, the first MAX_SPAN_LINKS by index, for their
-- fan-in callback's span links (JobMessage.trace_links).
CREATE TABLE {s}.flow_links (
    ns text NOT NULL,
    flow text NOT NULL,
    idx integer NOT NULL,
    span text NOT NULL,
    PRIMARY KEY (ns, flow, idx)
);

-- Ended flows with jobs still to end (flow_end_jobs: held by another transaction then).
CREATE TABLE {s}.flow_ends (
    ns text NOT NULL,
    flow text NOT NULL,
    state smallint NOT NULL,
    error bytea,
    caps bigint[] NOT NULL,
    PRIMARY KEY (ns, flow)
);

CREATE TABLE {s}.flow_results (
    ns text NOT NULL,
    flow text NOT NULL,
    idx integer NOT NULL,
    element bytea,
    PRIMARY KEY (ns, flow, idx)
);

-- msgpack of a str (nil for NULL), an unsigned int, an array header, a bin.
CREATE FUNCTION {s}.mp_str(t text) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN t IS NULL THEN '\xc0'::bytea
        WHEN octet_length(t) < 32 THEN set_byte('\x00'::bytea, 0, 160 + octet_length(t))
            || convert_to(t, 'UTF8')
        WHEN octet_length(t) < 256 THEN '\xd9'::bytea
            || set_byte('\x00'::bytea, 0, octet_length(t)) || convert_to(t, 'UTF8')
        WHEN octet_length(t) < 65536 THEN '\xda'::bytea
            || substr(int4send(octet_length(t)), 3) || convert_to(t, 'UTF8')
        ELSE '\xdb'::bytea || int4send(octet_length(t)) || convert_to(t, 'UTF8')
    END
$$;

CREATE FUNCTION {s}.mp_uint(n bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN n < 128 THEN set_byte('\x00'::bytea, 0, n::integer)
        WHEN n < 256 THEN '\xcc'::bytea || set_byte('\x00'::bytea, 0, n::integer)
        WHEN n < 65536 THEN '\xcd'::bytea || substr(int4send(n::integer), 3)
        WHEN n < 4294967296 THEN '\xce'::bytea || substr(int8send(n), 5)
        ELSE '\xcf'::bytea || int8send(n)
    END
$$;

CREATE FUNCTION {s}.mp_array(n integer) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN n < 16 THEN set_byte('\x00'::bytea, 0, 144 + n)
        WHEN n < 65536 THEN '\xdc'::bytea || substr(int4send(n), 3)
        ELSE '\xdd'::bytea || int4send(n)
    END
$$;

CREATE FUNCTION {s}.mp_bin(b bytea) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN length(b) < 256 THEN '\xc4'::bytea || set_byte('\x00'::bytea, 0, length(b)) || b
        WHEN length(b) < 65536 THEN '\xc5'::bytea || substr(int4send(length(b)), 3) || b
        ELSE '\xc6'::bytea || int4send(length(b)) || b
    END
$$;

-- A FailureRecord (never retryable) as msgspec encodes it: a map of its 10 fields.
CREATE FUNCTION {s}.mp_failure(p_reason text, p_type text, p_message text,
                               p_attempt integer, p_worker text,
                               p_failed_at double precision)
RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT '\x8a'::bytea
        || {s}.mp_str('reason') || {s}.mp_str(p_reason)
        || {s}.mp_str('error_type') || {s}.mp_str(p_type)
        || {s}.mp_str('message') || {s}.mp_str(p_message)
        || {s}.mp_str('attempt') || {s}.mp_uint(greatest(p_attempt, 0))
        || {s}.mp_str('retryable') || '\xc2'::bytea
        || {s}.mp_str('traceback') || '\xc0'::bytea
        || {s}.mp_str('domain_type') || '\xc0'::bytea
        || {s}.mp_str('domain_payload') || '\xc0'::bytea
        || {s}.mp_str('worker_id') || {s}.mp_str(p_worker)
        || {s}.mp_str('failed_at') || '\xcb'::bytea || float8send(p_failed_at)
$$;

-- A final job's failure record as bytes: its ``error``, or the record the broker wrote
-- as parts (rows.record_of reads them the same way).
CREATE FUNCTION {s}.job_error(p_error bytea, p_kind text, p_message text, p_attempt integer,
                              p_worker text, p_finished double precision)
RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_kind IS NULL THEN p_error
        WHEN p_kind = 'stalled' THEN
            {s}.mp_failure('stalled', 'WorkerLost', p_message, p_attempt, p_worker, p_finished)
        ELSE {s}.mp_failure('cancelled', 'JobCancelled', p_message, p_attempt,
                            CASE WHEN p_kind = 'cancelled' THEN NULL ELSE p_worker END,
                            p_finished)
    END
$$;

CREATE FUNCTION {s}.flow_broken(p_now double precision) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT {s}.mp_failure('flow_broken', 'FlowBroken',
                          'a job of this flow was removed before it finished', 0, NULL, p_now)
$$;

-- Store one flow: its members waiting, its first step waiting (a chain) or held, the
-- other steps held; p_holes[i] is the place of a held step's payload. Answers 0 stored,
-- 1 the flow's id exists (nothing stored), or raises TQ002 (a derived id taken, the id
-- as message) or TQ001 (max_queue_length, as enqueue).
CREATE FUNCTION {s}.enqueue_flow(p_ns text, p_flow text, p_steps integer, p_members integer,
                                 p_fan_out boolean, p_collector boolean, p_collect boolean,
                                 p_ids text[], p_queues text[], p_messages bytea[],
                                 p_priorities integer[], p_holes integer[], p_tasks text[],
                                 p_rate_keys text[], p_conc_keys text[], p_cap integer,
                                 p_caps bigint[], p_channel text, p_links_hole integer)
RETURNS smallint LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    taken text;
    q text;
    pending bigint;
    adding bigint;
    held boolean;
    k integer;
BEGIN
    -- Two producers storing one flow id at once: the second waits for the first's
    -- commit, then finds the flow (created False) instead of failing on a taken id.
    PERFORM pg_advisory_xact_lock(hashtext('typedq-flow:' || p_ns || ':' || p_flow));
    IF EXISTS (SELECT 1 FROM {s}.jobs WHERE ns = p_ns AND id = p_flow) THEN
        RETURN 1;
    END IF;
    SELECT j.id INTO taken FROM {s}.jobs j
    WHERE j.ns = p_ns AND j.id = ANY (p_ids) ORDER BY array_position(p_ids, j.id) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'TQ002', MESSAGE = taken || chr(31) || p_flow;
    END IF;
    IF p_cap > 0 THEN
        FOR q IN SELECT DISTINCT u FROM unnest(p_queues) u ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(hashtext('typedq-cap:' || p_ns || ':' || q));
        END LOOP;
        FOR q, adding IN
            SELECT u, count(*) FROM unnest(p_queues) u GROUP BY u
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
        k := i - 1 - p_members;  -- the step's index (members come first)
        held := k >= 0 AND (k > 0 OR p_fan_out);
        INSERT INTO {s}.jobs (ns, id, queue, message, priority, state, seq, enqueued_at,
                             run_at, task, rate_key, conc_key, flow_id, flow_member,
                             flow_step, flow_shape, hole)
        VALUES (p_ns, p_ids[i], p_queues[i], p_messages[i], p_priorities[i],
                CASE WHEN held THEN 1 ELSE 0 END, nextval('{s}.job_seq'), now,
                CASE WHEN held THEN 9000000000.0 ELSE 0 END,
                p_tasks[i], p_rate_keys[i], p_conc_keys[i], p_flow,
                CASE WHEN k < 0 THEN i - 1 END, CASE WHEN k >= 0 THEN k END,
                CASE WHEN k = p_steps - 1 THEN ARRAY[p_steps, p_members] END,
                CASE WHEN held THEN p_holes[i] END);
    END LOOP;
    INSERT INTO {s}.flows (ns, id, steps, members, collector, collect, remaining, caps,
                          links_hole)
    VALUES (p_ns, p_flow, p_steps, p_members, p_collector, p_collect, p_members, p_caps,
            p_links_hole);
    IF p_fan_out AND p_members = 0 THEN
        PERFORM {s}.flow_fan_in(p_ns, p_flow, now);
    END IF;
    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || u)
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d;
    RETURN 0;
END $$;

-- End a flow that did not complete: every job of it not final ends in p_state with
-- p_error (NULL: cancelled with its flow); a running one is asked to cancel.
CREATE FUNCTION {s}.flow_end(p_ns text, p_flow text, p_caps bigint[], p_state smallint,
                             p_error bytea, p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {s}.flows WHERE ns = p_ns AND id = p_flow;
    DELETE FROM {s}.flow_results WHERE ns = p_ns AND flow = p_flow;
    DELETE FROM {s}.flow_links WHERE ns = p_ns AND flow = p_flow;
    IF NOT {s}.flow_end_jobs(p_ns, p_flow, p_caps, p_state, p_error, p_now) THEN
        INSERT INTO {s}.flow_ends AS e (ns, flow, state, error, caps)
        VALUES (p_ns, p_flow, p_state, p_error, p_caps)
        ON CONFLICT (ns, flow) DO UPDATE SET state = excluded.state, error = excluded.error;
    END IF;
END $$;

-- The jobs of an ended flow that are not final, but those another transaction holds
-- (SKIP LOCKED): each ends in p_state with p_error (NULL: cancelled with its flow), a
-- running one is asked to cancel. Waiting for a held row here could deadlock (its holder,
-- settling a batch, may wait for a row this transaction holds); flow_finish ends those
-- later. Answers whether none is left.
CREATE FUNCTION {s}.flow_end_jobs(p_ns text, p_flow text, p_caps bigint[], p_state smallint,
                                  p_error bytea, p_now double precision)
RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    j record;
    st smallint := CASE WHEN p_error IS NULL THEN 5 ELSE p_state END;
    n integer := 0;
    asked boolean := false;
    channel text := {s}.flow_channel();
BEGIN
    FOR j IN
        SELECT x.id, x.state FROM {s}.jobs x
        WHERE x.ns = p_ns AND x.flow_id = p_flow AND x.state < 3
          AND NOT (x.state = 2 AND x.cancel_requested)
        ORDER BY x.id FOR UPDATE SKIP LOCKED
    LOOP
        IF j.state = 2 THEN
            UPDATE {s}.jobs SET cancel_requested = true WHERE ns = p_ns AND id = j.id;
            asked := true;
            CONTINUE;
        END IF;
        IF p_error IS NULL THEN
            UPDATE {s}.jobs SET state = 5, finished_at = p_now, br_kind = 'cancelled',
                br_message = 'cancelled with its flow', seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = j.id;
        ELSE
            UPDATE {s}.jobs SET state = st, finished_at = p_now, error = p_error,
                seq = nextval('{s}.job_seq')
            WHERE ns = p_ns AND id = j.id;
        END IF;
        n := n + 1;
        PERFORM pg_notify(channel, 'f:' || p_ns || ':' || j.id);
    END LOOP;
    IF asked THEN
        PERFORM pg_notify(channel, 'c:' || p_ns);
    END IF;
    IF n > 0 THEN
        PERFORM {s}.finished_add(p_ns, st, n, 0, p_caps[least(st - 2, 2)],
                                 p_now, false);
    END IF;
    -- Rows held by another transaction read as they were before it: left for later.
    RETURN NOT EXISTS (SELECT 1 FROM {s}.jobs x
                       WHERE x.ns = p_ns AND x.flow_id = p_flow AND x.state < 3
                         AND NOT (x.state = 2 AND x.cancel_requested));
END $$;

-- End the jobs flow_end_jobs left to ended flows (held then by another transaction):
-- after a cancel, remove or purge that ended a flow, and in the reaper's pass. Answers
-- how many ended flows still have such jobs.
CREATE FUNCTION {s}.flow_finish(p_ns text) RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    e record;
    left_over integer := 0;
BEGIN
    FOR e IN SELECT * FROM {s}.flow_ends x WHERE x.ns = p_ns FOR UPDATE SKIP LOCKED LOOP
        IF {s}.flow_end_jobs(p_ns, e.flow, e.caps, e.state, e.error, {s}.now_s()) THEN
            DELETE FROM {s}.flow_ends WHERE ns = p_ns AND flow = e.flow;
        ELSE
            left_over := left_over + 1;
        END IF;
    END LOOP;
    RETURN left_over;
END $$;

-- The NOTIFY channel of this schema (connection.channel_of).
CREATE FUNCTION {s}.flow_channel() RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT 'typedq_' || btrim('{s}', '"')
$$;

-- Give held step p_index of a running flow its input: waiting now, at the head of its
-- priority level (a flow under way finishes before new work starts), or, a collector,
-- completed with it. A step not held any more (removed, ended) breaks the flow.
CREATE FUNCTION {s}.flow_release(p_ns text, p_flow text, p_steps integer,
                                 p_collector boolean, p_caps bigint[], p_index integer,
                                 p_payload bytea, p_now double precision,
                                 p_links text DEFAULT '', p_links_hole integer DEFAULT NULL)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    sid text := CASE WHEN p_index = p_steps - 1 THEN p_flow ELSE p_flow || '.' || p_index END;
    j record;
BEGIN
    SELECT x.state, x.hole, x.queue INTO j FROM {s}.jobs x
    WHERE x.ns = p_ns AND x.id = sid FOR UPDATE;
    IF NOT FOUND OR j.state <> 1 OR j.hole IS NULL THEN
        PERFORM {s}.flow_end(p_ns, p_flow, p_caps, 4::smallint, {s}.flow_broken(p_now), p_now);
        RETURN;
    END IF;
    IF p_collector AND p_index = p_steps - 1 THEN
        -- The flow's own job: its completion (trigger flow_final) ends the flow.
        UPDATE {s}.jobs SET state = 3, result = p_payload, finished_at = p_now, hole = NULL,
            seq = nextval('{s}.job_seq')
        WHERE ns = p_ns AND id = sid;
        PERFORM {s}.finished_add(p_ns, 3::smallint, 1, 0, p_caps[1], p_now, false);
        PERFORM pg_notify({s}.flow_channel(), 'f:' || p_ns || ':' || sid);
        RETURN;
    END IF;
    UPDATE {s}.jobs SET state = 0, run_at = p_now, hole = NULL,
        message = CASE WHEN p_links = '' OR p_links_hole IS NULL
            THEN substr(message, 1, j.hole) || {s}.mp_bin(p_payload)
                 || substr(message, j.hole + 3)
            -- trace_links ("" at p_links_hole) comes after the payload in the envelope
            ELSE substr(message, 1, j.hole) || {s}.mp_bin(p_payload)
                 || substr(message, j.hole + 3, p_links_hole - j.hole - 2)
                 || {s}.mp_str(p_links) || substr(message, p_links_hole + 2)
        END,
        seq = -nextval('{s}.job_seq')
    WHERE ns = p_ns AND id = sid;
    PERFORM pg_notify({s}.flow_channel(), 'w:' || p_ns || ':' || j.queue);
END $$;

-- Every member has settled: the first failed one (by index) ends the flow, else step 0
-- gets the members' elements, in input order, as its input.
CREATE FUNCTION {s}.flow_fan_in(p_ns text, p_flow text, p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    f record;
    payload bytea;
    links text;
BEGIN
    SELECT * INTO f FROM {s}.flows WHERE ns = p_ns AND id = p_flow;
    IF f.fail_index IS NOT NULL THEN
        PERFORM {s}.flow_end(p_ns, p_flow, f.caps, f.fail_state, f.fail_error, p_now);
        RETURN;
    END IF;
    SELECT {s}.mp_array(f.members)
           || coalesce(string_agg(coalesce(r.element, '\xc0'::bytea), ''::bytea
                                  ORDER BY r.idx), ''::bytea)
    INTO payload
    FROM {s}.flow_results r WHERE r.ns = p_ns AND r.flow = p_flow;
    DELETE FROM {s}.flow_results WHERE ns = p_ns AND flow = p_flow;
    SELECT coalesce(string_agg(l.span, ',' ORDER BY l.idx), '') INTO links
    FROM {s}.flow_links l WHERE l.ns = p_ns AND l.flow = p_flow;
    DELETE FROM {s}.flow_links WHERE ns = p_ns AND flow = p_flow;
    PERFORM {s}.flow_release(p_ns, p_flow, f.steps, f.collector, f.caps, 0, payload, p_now,
                             links, f.links_hole);
END $$;

-- A job of a flow reached a final state (or was removed): hand off, or end the flow.
CREATE FUNCTION {s}.flow_settled(p_ns text, p_flow text, p_member integer, p_step integer,
                                 p_state smallint, p_result bytea, p_error bytea,
                                 p_now double precision)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    f record;
BEGIN
    SELECT * INTO f FROM {s}.flows WHERE ns = p_ns AND id = p_flow FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;  -- the flow has ended: a late member, or a step its end reached
    END IF;
    IF p_member >= 0 THEN
        INSERT INTO {s}.flow_results (ns, flow, idx, element)
        VALUES (p_ns, p_flow, p_member, CASE
            WHEN f.collect AND p_state = 3 THEN '\x92a26f6b'::bytea
                || coalesce(p_result, '\xc0'::bytea)
            WHEN f.collect THEN '\x92a66661696c6564'::bytea || coalesce(p_error, '\xc0'::bytea)
            WHEN p_state = 3 THEN p_result
        END)
        ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN
            RETURN;  -- settled before (a retried member): counted once
        END IF;
        UPDATE {s}.flows SET remaining = remaining - 1,
            completed = completed + (p_state = 3)::integer,
            failed = failed + (p_state = 4)::integer,
            cancelled = cancelled + (p_state = 5)::integer,
            fail_index = CASE WHEN NOT f.collect AND p_state <> 3
                AND (f.fail_index IS NULL OR p_member < f.fail_index)
                THEN p_member ELSE fail_index END,
            fail_state = CASE WHEN NOT f.collect AND p_state <> 3
                AND (f.fail_index IS NULL OR p_member < f.fail_index)
                THEN p_state ELSE fail_state END,
            fail_error = CASE WHEN NOT f.collect AND p_state <> 3
                AND (f.fail_index IS NULL OR p_member < f.fail_index)
                THEN p_error ELSE fail_error END
        WHERE ns = p_ns AND id = p_flow;
        IF f.remaining = 1 THEN
            PERFORM {s}.flow_fan_in(p_ns, p_flow, p_now);
        END IF;
        RETURN;
    END IF;
    IF p_state = 3 THEN
        IF p_step = f.steps - 1 THEN
            DELETE FROM {s}.flows WHERE ns = p_ns AND id = p_flow;
        ELSE
            PERFORM {s}.flow_release(p_ns, p_flow, f.steps, f.collector, f.caps, p_step + 1,
                                     coalesce(nullif(p_result, ''::bytea), '\xc0'::bytea),
                                     p_now);
        END IF;
    ELSIF p_step = f.steps - 1 AND p_state = 5 THEN
        -- The flow's own job was cancelled first: cancel everything else.
        PERFORM {s}.flow_end(p_ns, p_flow, f.caps, 5::smallint, NULL, p_now);
    ELSE
        PERFORM {s}.flow_end(p_ns, p_flow, f.caps, p_state, p_error, p_now);
    END IF;
END $$;

CREATE FUNCTION {s}.flow_final() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.flow_settled(NEW.ns, NEW.flow_id, coalesce(NEW.flow_member, -1),
                             coalesce(NEW.flow_step, -1), NEW.state,
                             NEW.result,
                             CASE WHEN NEW.state <> 3 THEN
                                 {s}.job_error(NEW.error, NEW.br_kind, NEW.br_message,
                                               NEW.attempt, NEW.worker_id, NEW.finished_at)
                             END,
                             {s}.now_s());
    RETURN NULL;
END $$;

CREATE TRIGGER flow_final AFTER UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN (NEW.flow_id IS NOT NULL AND NEW.state >= 3 AND NEW.parked IS NULL
      AND (OLD.state < 3 OR OLD.parked IS NOT NULL))
EXECUTE FUNCTION {s}.flow_final();

-- A deleted job of a flow had not finished (or was parked: its flow waited for it): its
-- flow treats it as failed, with reason flow_broken; a parked job retention deleted, with
-- its own reason and a message that says so (the record ``parked`` holds).
CREATE FUNCTION {s}.flow_gone() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    record bytea;
BEGIN
    IF OLD.parked IS NOT NULL AND current_setting('typedq.trimming', true) = '1' THEN
        record := substr(OLD.parked, 1, length(OLD.parked) - 8) || float8send(now);
    ELSE
        record := {s}.flow_broken(now);
    END IF;
    PERFORM {s}.flow_settled(OLD.ns, OLD.flow_id, coalesce(OLD.flow_member, -1),
                             coalesce(OLD.flow_step, -1),
                             4::smallint, NULL, record, now);
    RETURN NULL;
END $$;

CREATE TRIGGER flow_gone AFTER DELETE ON {s}.jobs FOR EACH ROW
WHEN (OLD.flow_id IS NOT NULL AND (OLD.state < 3 OR OLD.parked IS NOT NULL))
EXECUTE FUNCTION {s}.flow_gone();

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
