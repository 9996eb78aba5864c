"""The PostgreSQL broker's migration 4: task limits (rate and concurrency, typedq.limits)
enforced inside the claim, as :mod:`.limits` describes (the job's task and limit keys as
columns, rate windows, slots, ghosts, gates and their freed notes, bucket locks taken
without waiting). Released: never edited (a change is a new migration).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
ALTER TABLE {s}.jobs
    ADD COLUMN task text,
    ADD COLUMN rate_key text NOT NULL DEFAULT '',
    ADD COLUMN conc_key text NOT NULL DEFAULT '',
    ADD COLUMN slot boolean NOT NULL DEFAULT false,
    ADD COLUMN gate text;
-- The claim's line: waiting jobs no gate parked.
CREATE INDEX jobs_open ON {s}.jobs (ns, queue, priority DESC, seq)
    WHERE state = 0 AND gate IS NULL;
CREATE INDEX jobs_parked ON {s}.jobs (ns, queue, gate, priority DESC, seq)
    WHERE state = 0 AND gate IS NOT NULL;
CREATE INDEX jobs_slots ON {s}.jobs (ns, task, conc_key) WHERE state = 2 AND slot;

-- Each rate bucket's start times in its window, oldest first.
CREATE TABLE {s}.rate_windows (
    ns text NOT NULL,
    task text NOT NULL,
    key text NOT NULL,
    starts bigint[] NOT NULL,
    PRIMARY KEY (ns, task, key)
);

-- Slots held by active jobs an operator deleted, until their lease would have ended.
CREATE TABLE {s}.ghosts (
    ns text NOT NULL,
    task text NOT NULL,
    key text NOT NULL,
    id text NOT NULL,
    until_us bigint NOT NULL,
    PRIMARY KEY (ns, task, key, id)
);

-- The closed limits of each queue: gate is kind ('r' rate | 'c' concurrency), task and
-- key joined by chr(31); opens_us NULL: when a slot is freed.
CREATE TABLE {s}.gates (
    ns text NOT NULL,
    queue text NOT NULL,
    gate text NOT NULL,
    kind text NOT NULL,
    task text NOT NULL,
    key text NOT NULL,
    opens_us bigint,
    PRIMARY KEY (ns, queue, gate)
);

-- Slots freed (at_us 0) or ghosts ending (at_us): the gate is looked at again then.
CREATE TABLE {s}.freed (
    id bigserial PRIMARY KEY,
    ns text NOT NULL,
    queue text NOT NULL,
    gate text NOT NULL,
    at_us bigint NOT NULL,
    made double precision NOT NULL
);
CREATE INDEX freed_gate ON {s}.freed (ns, queue, gate);

-- enqueue (migration 1) storing each job's task and limit keys too.
CREATE FUNCTION {s}.enqueue(p_ns text, p_ids text[], p_queues text[], p_messages bytea[],
                            p_priorities integer[], p_etas double precision[],
                            p_delays double precision[], p_cap integer, p_channel text,
                            p_tasks text[], p_rate_keys text[], p_conc_keys text[])
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
        INSERT INTO {s}.jobs (ns, id, queue, message, priority, state, seq, enqueued_at, run_at,
                             task, rate_key, conc_key)
        VALUES (p_ns, p_ids[i], p_queues[i], p_messages[i], p_priorities[i],
                CASE WHEN run > now THEN 1 ELSE 0 END, nextval('{s}.job_seq'), now,
                CASE WHEN run > now THEN run ELSE 0 END,
                p_tasks[i], p_rate_keys[i], p_conc_keys[i])
        ON CONFLICT DO NOTHING;
        GET DIAGNOSTICS k = ROW_COUNT;
        created := created || (k > 0);
    END LOOP;
    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || u)
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d;
    RETURN created;
END $$;

-- fire_schedules (migration 3) storing each job's task and limit keys too.
CREATE FUNCTION {s}.fire_schedules(p_ns text, p_names text[], p_digests text[],
                                   p_expected bigint[], p_new_last bigint[],
                                   p_skipped integer[], p_overlap text[],
                                   p_starts integer[], p_counts integer[],
                                   p_caps integer[], p_ids text[], p_queues text[],
                                   p_messages bytea[], p_priorities integer[],
                                   p_etas double precision[],
                                   p_delays double precision[], p_channel text,
                                   p_tasks text[], p_rate_keys text[],
                                   p_conc_keys text[])
RETURNS TABLE (k integer, outcome smallint, name text, digest text, last_tick_us bigint,
               last_job text, last_fired_us bigint, fired bigint, skipped bigint)
LANGUAGE plpgsql AS $$
DECLARE
    now bigint;
    st {s}.schedules;
    js smallint;
    a integer;
    b integer;
    n integer;
    got integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_names, 1), 0) LOOP
        k := i;
        now := {s}.now_us();
        SELECT * INTO st FROM {s}.schedules x
        WHERE x.ns = p_ns AND x.name = p_names[i] FOR UPDATE;
        IF NOT FOUND THEN
            outcome := 1;
            name := NULL; digest := NULL; last_tick_us := NULL; last_job := NULL;
            last_fired_us := NULL; fired := NULL; skipped := NULL;
            RETURN NEXT;
            CONTINUE;
        END IF;
        n := p_counts[i];
        a := p_starts[i];
        b := a + n - 1;
        outcome := NULL;
        IF st.digest <> p_digests[i] OR st.last_tick_us <> p_expected[i]
           OR p_new_last[i] <= p_expected[i] OR p_new_last[i] > now THEN
            outcome := 1;
        ELSIF n > 0 AND p_overlap[i] <> 'allow' AND st.last_job <> '' THEN
            SELECT j.state INTO js FROM {s}.jobs j WHERE j.ns = p_ns AND j.id = st.last_job;
            IF FOUND AND js < 3 THEN
                IF p_overlap[i] = 'queue' THEN
                    outcome := 3;
                ELSE
                    UPDATE {s}.schedules x SET last_tick_us = p_new_last[i],
                        skipped = x.skipped + p_skipped[i] + n
                    WHERE x.ns = p_ns AND x.name = p_names[i]
                    RETURNING x.* INTO st;
                    outcome := 2;
                END IF;
            END IF;
        END IF;
        IF outcome IS NULL THEN
            outcome := 0;
            got := n;
            IF n > 0 THEN
                BEGIN
                    PERFORM {s}.enqueue(p_ns, p_ids[a:b], p_queues[a:b], p_messages[a:b],
                                        p_priorities[a:b], p_etas[a:b], p_delays[a:b],
                                        p_caps[i], p_channel, p_tasks[a:b], p_rate_keys[a:b],
                                        p_conc_keys[a:b]);
                EXCEPTION WHEN SQLSTATE 'TQ001' THEN
                    outcome := 4;
                    got := 0;
                END;
            END IF;
            UPDATE {s}.schedules x SET last_tick_us = p_new_last[i],
                last_job = CASE WHEN got > 0 THEN p_ids[b] ELSE x.last_job END,
                last_fired_us = CASE WHEN got > 0 THEN now ELSE x.last_fired_us END,
                fired = x.fired + got,
                skipped = x.skipped + p_skipped[i] + n - got
            WHERE x.ns = p_ns AND x.name = p_names[i]
            RETURNING x.* INTO st;
        END IF;
        name := st.name;
        digest := st.digest;
        last_tick_us := st.last_tick_us;
        last_job := st.last_job;
        last_fired_us := st.last_fired_us;
        fired := st.fired;
        skipped := st.skipped;
        RETURN NEXT;
    END LOOP;
END $$;

-- The advisory lock of one bucket (kind, task, key), taken without waiting.
CREATE FUNCTION {s}.limit_lock(p_ns text, p_kind text, p_task text, p_key text)
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT pg_try_advisory_xact_lock(hashtext('typedq-limit:{s}'),
        hashtext(p_ns || chr(31) || p_kind || chr(31) || p_task || chr(31) || p_key))
$$;

-- How many slots of (task, key) are held: active holders and live ghosts (the ended go).
CREATE FUNCTION {s}.slots_held(p_ns text, p_task text, p_key text, p_now_us bigint)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {s}.ghosts g
    WHERE g.ns = p_ns AND g.task = p_task AND g.key = p_key AND g.until_us <= p_now_us;
    RETURN (SELECT count(*) FROM {s}.jobs j
            WHERE j.ns = p_ns AND j.state = 2 AND j.slot AND j.task = p_task
              AND j.conc_key = p_key)
         + (SELECT count(*) FROM {s}.ghosts g
            WHERE g.ns = p_ns AND g.task = p_task AND g.key = p_key);
END $$;

-- A rate bucket's start times in (now - per, now], oldest first.
CREATE FUNCTION {s}.rate_window(p_ns text, p_task text, p_key text, p_per bigint,
                                p_now_us bigint)
RETURNS bigint[] LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT array(SELECT s FROM unnest(r.starts) s
                                  WHERE s > p_now_us - p_per ORDER BY s)
                     FROM {s}.rate_windows r
                     WHERE r.ns = p_ns AND r.task = p_task AND r.key = p_key), '{{}}')
$$;

-- Park job p_id by its closed gate, which opens at p_opens (NULL: when a slot is freed).
CREATE FUNCTION {s}.park(p_ns text, p_queue text, p_id text, p_kind text, p_task text,
                         p_key text, p_opens bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    g text := p_kind || chr(31) || p_task || chr(31) || p_key;
BEGIN
    UPDATE {s}.jobs SET gate = g WHERE ns = p_ns AND id = p_id;
    INSERT INTO {s}.gates AS x (ns, queue, gate, kind, task, key, opens_us)
    VALUES (p_ns, p_queue, g, p_kind, p_task, p_key, p_opens)
    ON CONFLICT (ns, queue, gate) DO UPDATE SET opens_us = excluded.opens_us;
END $$;

-- Admit a waiting job under its task's limits (p_rate 0: no rate limit; p_conc 0: no
-- concurrency limit): take its slot and its start (verdict 0), or park it by its closed
-- gate (1); 2: another claim holds its bucket right now (it stays in line, unclaimed).
-- p_held: the slots held of its concurrency bucket, counted under its lock by this
-- claim already (NULL: count them); held: that count after this job (NULL: none).
CREATE FUNCTION {s}.admit(p_ns text, p_queue text, p_id text, p_task text, p_rkey text,
                          p_ckey text, p_rate integer, p_per bigint, p_conc integer,
                          p_spacing bigint, p_early bigint, p_now_us bigint, p_held bigint,
                          OUT verdict smallint, OUT held bigint)
LANGUAGE plpgsql AS $$
DECLARE
    st bigint[];
    n integer;
    turn bigint;
BEGIN
    held := NULL;
    IF p_conc > 0 THEN
        held := p_held;
        IF held IS NULL THEN
            IF NOT {s}.limit_lock(p_ns, 'c', p_task, p_ckey) THEN
                verdict := 2;
                RETURN;
            END IF;
            held := {s}.slots_held(p_ns, p_task, p_ckey, p_now_us);
        END IF;
        IF held >= p_conc THEN
            PERFORM {s}.park(p_ns, p_queue, p_id, 'c', p_task, p_ckey,
                (SELECT min(g.until_us) FROM {s}.ghosts g
                 WHERE g.ns = p_ns AND g.task = p_task AND g.key = p_ckey));
            verdict := 1;
            RETURN;
        END IF;
    END IF;
    IF p_rate > 0 THEN
        IF NOT {s}.limit_lock(p_ns, 'r', p_task, p_rkey) THEN
            verdict := 2;
            RETURN;
        END IF;
        st := {s}.rate_window(p_ns, p_task, p_rkey, p_per, p_now_us);
        n := coalesce(array_length(st, 1), 0);
        -- Closed: open once the start `rate` places back leaves the window; or, spaced,
        -- at the next turn, which may be taken up to p_early before it.
        turn := CASE WHEN n > 0 THEN greatest(p_now_us, st[n] + p_spacing) ELSE p_now_us END;
        IF n >= p_rate OR (p_spacing > 0 AND turn > p_now_us + p_early) THEN
            PERFORM {s}.park(p_ns, p_queue, p_id, 'r', p_task, p_rkey,
                CASE WHEN n >= p_rate THEN st[n - p_rate + 1] + p_per ELSE turn - p_early END);
            verdict := 1;
            RETURN;
        END IF;
        INSERT INTO {s}.rate_windows AS r (ns, task, key, starts)
        VALUES (p_ns, p_task, p_rkey,
                st || CASE WHEN p_spacing > 0 THEN turn ELSE p_now_us END)
        ON CONFLICT (ns, task, key) DO UPDATE SET starts = excluded.starts;
    END IF;
    held := held + 1;
    verdict := 0;
END $$;

-- Give the open gates of p_queues back as many of their parked jobs as their bucket
-- admits now, best first (the claim admits or parks them again); a gate whose task
-- this claim does not limit gives back all of them. A gate whose bucket another claim
-- holds is left for later.
CREATE FUNCTION {s}.unpark(p_ns text, p_queues text[], p_now_us bigint, p_tasks text[],
                           p_rates integer[], p_pers bigint[], p_concs integer[],
                           p_spacings bigint[], p_earlies bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    g record;
    i integer;
    seen bigint[];
    room bigint;
    opens bigint;
    st bigint[];
    n integer;
    turn bigint;
BEGIN
    FOR g IN
        SELECT x.queue, x.gate, x.kind, x.task, x.key FROM {s}.gates x
        WHERE x.ns = p_ns AND x.queue = ANY (p_queues)
          AND (x.opens_us <= p_now_us OR EXISTS (
              SELECT 1 FROM {s}.freed f WHERE f.ns = p_ns AND f.queue = x.queue
                AND f.gate = x.gate AND f.at_us <= p_now_us))
    LOOP
        IF NOT {s}.limit_lock(p_ns, g.kind, g.task, g.key) THEN
            CONTINUE;
        END IF;
        seen := array(SELECT f.id FROM {s}.freed f WHERE f.ns = p_ns AND f.queue = g.queue
                      AND f.gate = g.gate AND f.at_us <= p_now_us);
        i := array_position(p_tasks, g.task);
        room := NULL;  -- all of them
        opens := p_now_us;
        IF i IS NOT NULL AND g.kind = 'c' AND p_concs[i] > 0 THEN
            room := p_concs[i] - {s}.slots_held(p_ns, g.task, g.key, p_now_us);
            opens := (SELECT min(x.until_us) FROM {s}.ghosts x
                      WHERE x.ns = p_ns AND x.task = g.task AND x.key = g.key);
        ELSIF i IS NOT NULL AND g.kind = 'r' AND p_rates[i] > 0 THEN
            st := {s}.rate_window(p_ns, g.task, g.key, p_pers[i], p_now_us);
            n := coalesce(array_length(st, 1), 0);
            room := p_rates[i] - n;
            IF room <= 0 THEN
                opens := st[n - p_rates[i] + 1] + p_pers[i];
            ELSIF p_spacings[i] > 0 AND n > 0 THEN
                -- Spaced: the turns from the next one to now + early.
                turn := greatest(p_now_us, st[n] + p_spacings[i]);
                IF turn > p_now_us + p_earlies[i] THEN
                    room := 0;
                    opens := turn - p_earlies[i];
                ELSE
                    room := least(room, (p_now_us + p_earlies[i] - turn) / p_spacings[i] + 1);
                END IF;
            END IF;
        END IF;
        IF room IS NULL OR room > 0 THEN
            UPDATE {s}.jobs j SET gate = NULL
            FROM (SELECT w.id FROM {s}.jobs w
                  WHERE w.ns = p_ns AND w.queue = g.queue AND w.state = 0 AND w.gate = g.gate
                  ORDER BY w.priority DESC, w.seq
                  LIMIT room
                  FOR UPDATE SKIP LOCKED) o
            WHERE j.ns = p_ns AND j.id = o.id;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM {s}.jobs w WHERE w.ns = p_ns AND w.queue = g.queue
                       AND w.state = 0 AND w.gate = g.gate) THEN
            DELETE FROM {s}.gates x WHERE x.ns = p_ns AND x.queue = g.queue AND x.gate = g.gate;
        ELSE
            -- Full now: closed until `opens`; else open, and the next claim counts again.
            UPDATE {s}.gates x
            SET opens_us = CASE WHEN room IS NOT NULL AND room <= 0 THEN opens ELSE p_now_us END
            WHERE x.ns = p_ns AND x.queue = g.queue AND x.gate = g.gate;
        END IF;
        DELETE FROM {s}.freed f WHERE f.id = ANY (seen);
    END LOOP;
END $$;

-- claim with task limits: p_tasks[i] is limited by p_rates[i] starts per p_pers[i] us
-- (spaced p_spacings[i], taken up to p_earlies[i] early) and p_concs[i] running at once
-- per key (0: none). Open gates first give parked jobs back; with no limits the jobs
-- are taken as migration 1's claim takes them (parked ones excepted), else one by one,
-- best first, each admitted or parked.
CREATE FUNCTION {s}.claim(p_ns text, p_queues text[], p_limit integer, p_worker text,
                          p_lease double precision, p_claim text, p_tasks text[],
                          p_rates integer[], p_pers bigint[], p_concs integer[],
                          p_spacings bigint[], p_earlies bigint[])
RETURNS TABLE (n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    now_us bigint := round(now * 1000000)::bigint;
    got bigint := 0;
    found_any boolean;
    skipped text[] := '{{}}';
    verdict smallint;
    ck text;  -- the concurrency bucket (task, key) whose slots `held` counts
    held bigint;
    i integer;
    r record;
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
    PERFORM {s}.unpark(p_ns, p_queues, now_us, p_tasks, p_rates, p_pers, p_concs,
                       p_spacings, p_earlies);
    IF coalesce(array_length(p_tasks, 1), 0) = 0 THEN
        RETURN QUERY
        WITH picked AS (
            SELECT y.id, row_number() OVER (ORDER BY y.priority DESC, y.seq) AS k
            FROM (
                SELECT x.id, x.priority, x.seq
                FROM unnest(p_queues) AS qn (q),
                LATERAL (
                    SELECT w.id, w.priority, w.seq FROM {s}.jobs w
                    WHERE w.ns = p_ns AND w.queue = qn.q AND w.state = 0 AND w.gate IS NULL
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
    ELSE
        -- Each round takes the best open jobs left; every job it reads is taken, parked
        -- or skipped (its bucket busy), so none is read twice and the rounds end.
        LOOP
            EXIT WHEN got >= p_limit;
            found_any := false;
            FOR r IN
                SELECT x.id, x.queue, x.task, x.rate_key, x.conc_key
                FROM unnest(p_queues) AS qn (q),
                LATERAL (
                    SELECT w.id, w.queue, w.task, w.rate_key, w.conc_key, w.priority, w.seq
                    FROM {s}.jobs w
                    WHERE w.ns = p_ns AND w.queue = qn.q AND w.state = 0 AND w.gate IS NULL
                      AND w.id <> ALL (skipped)
                    ORDER BY w.priority DESC, w.seq
                    LIMIT p_limit - got
                    FOR UPDATE SKIP LOCKED
                ) x
                ORDER BY x.priority DESC, x.seq
                LIMIT p_limit - got
            LOOP
                found_any := true;
                i := array_position(p_tasks, r.task);
                verdict := 0;
                IF i IS NOT NULL THEN
                    -- A run of jobs of one concurrency bucket is counted once.
                    SELECT a.verdict, a.held INTO verdict, held
                    FROM {s}.admit(p_ns, r.queue, r.id, r.task, r.rate_key, r.conc_key,
                                   p_rates[i], p_pers[i], p_concs[i], p_spacings[i],
                                   p_earlies[i], now_us,
                                   CASE WHEN ck = r.task || chr(31) || r.conc_key
                                        THEN held END) a;
                    ck := CASE WHEN held IS NOT NULL THEN r.task || chr(31) || r.conc_key END;
                END IF;
                IF verdict = 0 THEN
                    got := got + 1;
                    RETURN QUERY
                    UPDATE {s}.jobs j
                    SET state = 2, attempt = j.attempt + 1, token = p_claim || '.' || got,
                        lease_until = now + p_lease, started_at = now, worker_id = p_worker,
                        slot = i IS NOT NULL AND p_concs[i] > 0
                    WHERE j.ns = p_ns AND j.id = r.id
                    RETURNING got, j.message, j.token, j.attempt, j.enqueued_at, j.stalls,
                              j.run_at;
                ELSIF verdict = 2 THEN
                    skipped := skipped || r.id;
                END IF;
            END LOOP;
            EXIT WHEN NOT found_any;
        END LOOP;
    END IF;
    IF got > 0 THEN
        INSERT INTO {s}.claims (ns, claim_id, at) VALUES (p_ns, p_claim, now)
        ON CONFLICT (ns, claim_id) DO UPDATE SET at = excluded.at;
    END IF;
END $$;

CREATE FUNCTION {s}.complete_and_claim(p_ns text, p_ids text[], p_tokens text[],
                                       p_results bytea[], p_ttl double precision,
                                       p_cap bigint, p_channel text, p_queues text[],
                                       p_limit integer, p_worker text,
                                       p_lease double precision, p_claim text,
                                       p_tasks text[], p_rates integer[], p_pers bigint[],
                                       p_concs integer[], p_spacings bigint[],
                                       p_earlies bigint[])
RETURNS TABLE (codes smallint[], n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql AS $$
DECLARE
    done smallint[];
BEGIN
    -- As migration 1's: the completions, then the claim; every row carries the
    -- completions' answers, and with nothing claimed one row of them.
    done := {s}.complete(p_ns, p_ids, p_tokens, p_results, p_ttl, p_cap, p_channel);
    RETURN QUERY
    SELECT done, c.* FROM {s}.claim(p_ns, p_queues, p_limit, p_worker, p_lease, p_claim,
                                    p_tasks, p_rates, p_pers, p_concs, p_spacings,
                                    p_earlies) c;
    IF NOT FOUND THEN
        RETURN QUERY SELECT done, NULL::bigint, NULL::bytea, NULL::text, NULL::integer,
                            NULL::double precision, NULL::integer, NULL::double precision;
    END IF;
END $$;

-- A slot of (task, conc_key) is freed for gate g of queue q at p_at_us: noted for the
-- gate (see the module), and the queue's waiters woken.
CREATE FUNCTION {s}.slot_freed(p_ns text, p_queue text, p_task text, p_key text,
                               p_at_us bigint, p_channel text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    g text := 'c' || chr(31) || p_task || chr(31) || p_key;
BEGIN
    -- The lock first: holding it, no claim is parking behind this gate, so a gate not
    -- found is not made until this transaction (and its freed slot) has committed.
    IF {s}.limit_lock(p_ns, 'c', p_task, p_key) THEN
        IF NOT EXISTS (SELECT 1 FROM {s}.gates x
                       WHERE x.ns = p_ns AND x.queue = p_queue AND x.gate = g) THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO {s}.freed (ns, queue, gate, at_us, made)
    VALUES (p_ns, p_queue, g, p_at_us, {s}.now_s());
    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || p_queue);
END $$;

-- A job leaving waiting leaves its gate; one leaving active frees its slot.
CREATE FUNCTION {s}.job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state <> 0 THEN
        NEW.gate := NULL;
    END IF;
    IF OLD.slot AND NEW.state <> 2 THEN
        NEW.slot := false;
        PERFORM {s}.slot_freed(OLD.ns, OLD.queue, OLD.task, OLD.conc_key, 0,
                                'typedq_' || TG_TABLE_SCHEMA);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER job_moved BEFORE UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN ((OLD.gate IS NOT NULL OR OLD.slot) AND NEW.state <> OLD.state)
EXECUTE FUNCTION {s}.job_moved();

-- An active slot holder deleted (remove, purge): a ghost holds its place until its lease
-- would have ended.
CREATE FUNCTION {s}.job_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    ends bigint := floor(OLD.lease_until * 1000000)::bigint;
BEGIN
    IF ends > {s}.now_us() THEN
        INSERT INTO {s}.ghosts AS x (ns, task, key, id, until_us)
        VALUES (OLD.ns, OLD.task, OLD.conc_key, OLD.id, ends)
        ON CONFLICT (ns, task, key, id) DO UPDATE
        SET until_us = greatest(x.until_us, excluded.until_us);
    ELSE
        ends := 0;
    END IF;
    PERFORM {s}.slot_freed(OLD.ns, OLD.queue, OLD.task, OLD.conc_key, ends,
                           'typedq_' || TG_TABLE_SCHEMA);
    RETURN OLD;
END $$;

CREATE TRIGGER job_deleted AFTER DELETE ON {s}.jobs FOR EACH ROW
WHEN (OLD.slot AND OLD.state = 2)
EXECUTE FUNCTION {s}.job_deleted();
"""
