"""Migration 6 (:mod:`.migration_6`), its second part: the functions that store, hand
off, settle and end flows, and the triggers ``flow_final`` and ``flow_gone``. Released:
never edited."""

__all__ = ["SQL"]

SQL = r"""
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
"""
