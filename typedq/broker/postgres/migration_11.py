"""The PostgreSQL broker's migration 11: the claim of limited tasks takes its jobs in
batches. Released: never edited (a change is a new migration). It replaces
migration 10's ``claim`` (same signature, same answers): migration 4's, with the same
step migration 10 added (over queues with a fair lane, ``claim_fair`` takes the jobs).

Migration 4's claim admitted a limited task's jobs one at a time: per job a call of
``admit`` (its bucket's lock, a count of the slots held, a read of the rate window), an
upsert of the rate window and an update of the job. This one reads a round of candidates
(the best open jobs, ``FOR UPDATE SKIP LOCKED``, as before), and decides each of them in
memory, best first, by the same rules: each bucket (a concurrency key's slots, a rate
key's window) is locked and counted once per claim, at its first job, and its count then
follows this claim's own admissions (a job whose bucket another claim holds is left in
line, and the lock tried again at the bucket's next job, as before). The round's writes are then one statement
each: the admitted jobs (one update, up to the free slots and rate tokens), the parked
jobs and their gates; each rate window grown is written once, at the end. The bucket
locks are held to the commit as before, so the rules stay exact under concurrent claims:
a second claim counts after the first has committed, or skips the bucket.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from .migration_10 import CLAIM_FAIR_HOOK, CLAIM_HOOK_AFTER

__all__ = ["SQL"]

SQL = r"""
-- As migration 4's claim; the limited jobs are decided in memory, a round at a time, and
-- each round's writes are one statement each (see the module).
CREATE OR REPLACE FUNCTION {s}.claim(p_ns text, p_queues text[], p_limit integer,
                                     p_worker text, p_lease double precision, p_claim text,
                                     p_tasks text[], p_rates integer[], p_pers bigint[],
                                     p_concs integer[], p_spacings bigint[],
                                     p_earlies bigint[])
RETURNS TABLE (n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql AS $$
DECLARE
    now double precision := {s}.now_s();
    now_us bigint := round(now * 1000000)::bigint;
    got bigint := 0;
    found_any boolean;
    skipped text[] := '{{}}';
    r record;
    i integer;
    b integer;
    cb integer;
    bname text;
    turn bigint;
    start bigint;
    opens bigint;
    -- The buckets this claim has met: kind || chr(31) || task || chr(31) || key; locked
    -- (false: another claim holds it); count (slots held, or starts in the window);
    -- last start; opens (not NULL once closed: when its gate opens).
    b_names text[] := '{{}}';
    b_kinds text[] := '{{}}';
    b_tasks text[] := '{{}}';
    b_keys text[] := '{{}}';
    b_locked boolean[] := '{{}}';
    b_count bigint[] := '{{}}';
    b_last bigint[] := '{{}}';
    b_opens bigint[] := '{{}}';
    b_grew boolean[] := '{{}}';
    -- The starts of the rate windows met, tagged by bucket.
    w_starts bigint[] := '{{}}';
    w_bucket integer[] := '{{}}';
    -- A round's decisions.
    a_ids text[];
    a_slots boolean[];
    k_ids text[];
    k_gates text[];
    g_queues text[];
    g_names text[];
    g_kinds text[];
    g_tasks text[];
    g_keys text[];
    g_opens bigint[];
    gi integer;
    took bigint;
    cnt bigint;
    last bigint;
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
        IF got > 0 THEN
            INSERT INTO {s}.claims (ns, claim_id, at) VALUES (p_ns, p_claim, now)
            ON CONFLICT (ns, claim_id) DO UPDATE SET at = excluded.at;
        END IF;
        RETURN;
    END IF;
    -- Each round takes the best open jobs left; every job it reads is taken, parked or
    -- skipped (its bucket busy), so none is read twice and the rounds end.
    LOOP
        EXIT WHEN got >= p_limit;
        found_any := false;
        a_ids := '{{}}'; a_slots := '{{}}'; k_ids := '{{}}'; k_gates := '{{}}';
        g_queues := '{{}}'; g_names := '{{}}'; g_kinds := '{{}}'; g_tasks := '{{}}';
        g_keys := '{{}}'; g_opens := '{{}}';
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
            IF i IS NULL THEN
                a_ids := a_ids || r.id;
                a_slots := a_slots || false;
                CONTINUE;
            END IF;
            cb := NULL;
            b := NULL;
            IF p_concs[i] > 0 THEN
                bname := 'c' || chr(31) || r.task || chr(31) || r.conc_key;
                cb := array_position(b_names, bname);
                IF cb IS NULL THEN
                    b_names := b_names || bname;
                    b_kinds := b_kinds || 'c'::text;
                    b_tasks := b_tasks || r.task;
                    b_keys := b_keys || r.conc_key;
                    cb := cardinality(b_names);
                    b_locked[cb] := false;
                END IF;
                IF NOT b_locked[cb] THEN
                    -- Tried again at each job of a bucket another claim holds (it may
                    -- have committed since), counted once taken.
                    b_locked[cb] := {s}.limit_lock(p_ns, 'c', r.task, r.conc_key);
                    b_count[cb] := CASE WHEN b_locked[cb]
                        THEN {s}.slots_held(p_ns, r.task, r.conc_key, now_us) END;
                END IF;
                IF NOT b_locked[cb] THEN
                    skipped := skipped || r.id;
                    CONTINUE;
                END IF;
                IF b_count[cb] >= p_concs[i] THEN
                    IF b_opens[cb] IS NULL THEN
                        -- Closed (for good in this claim): open when a ghost ends, if any.
                        b_opens[cb] := coalesce(
                            (SELECT min(g.until_us) FROM {s}.ghosts g
                             WHERE g.ns = p_ns AND g.task = r.task AND g.key = r.conc_key),
                            -1);
                    END IF;
                    opens := nullif(b_opens[cb], -1);
                    b := cb;
                END IF;
            END IF;
            IF b IS NULL AND p_rates[i] > 0 THEN
                bname := 'r' || chr(31) || r.task || chr(31) || r.rate_key;
                b := array_position(b_names, bname);
                IF b IS NULL THEN
                    b_names := b_names || bname;
                    b_kinds := b_kinds || 'r'::text;
                    b_tasks := b_tasks || r.task;
                    b_keys := b_keys || r.rate_key;
                    b := cardinality(b_names);
                    b_locked[b] := false;
                    b_grew[b] := false;
                END IF;
                IF NOT b_locked[b] THEN
                    b_locked[b] := {s}.limit_lock(p_ns, 'r', r.task, r.rate_key);
                    IF b_locked[b] THEN
                        SELECT count(*), max(u.s),
                               w_starts || coalesce(array_agg(u.s), '{{}}'),
                               w_bucket || coalesce(array_agg(b), '{{}}')
                        INTO cnt, last, w_starts, w_bucket
                        FROM unnest({s}.rate_window(p_ns, r.task, r.rate_key, p_pers[i],
                                                    now_us)) AS u (s);
                        b_count[b] := cnt;
                        b_last[b] := last;
                    END IF;
                END IF;
                IF NOT b_locked[b] THEN
                    skipped := skipped || r.id;
                    CONTINUE;
                END IF;
                turn := CASE WHEN b_count[b] > 0
                             THEN greatest(now_us, b_last[b] + p_spacings[i]) ELSE now_us END;
                IF b_count[b] >= p_rates[i]
                   OR (p_spacings[i] > 0 AND turn > now_us + p_earlies[i]) THEN
                    -- Closed (for good in this claim): open once the start `rate` places
                    -- back leaves the window; or, spaced, at the next turn less `early`.
                    IF b_opens[b] IS NULL THEN
                        b_opens[b] := CASE WHEN b_count[b] >= p_rates[i]
                            THEN (SELECT u.s FROM unnest(w_starts, w_bucket) AS u (s, bk)
                                  WHERE u.bk = b ORDER BY u.s
                                  OFFSET b_count[b] - p_rates[i] LIMIT 1) + p_pers[i]
                            ELSE turn - p_earlies[i] END;
                    END IF;
                    opens := b_opens[b];
                ELSE
                    start := CASE WHEN p_spacings[i] > 0 THEN turn ELSE now_us END;
                    w_starts := w_starts || start;
                    w_bucket := w_bucket || b;
                    b_count[b] := b_count[b] + 1;
                    b_last[b] := greatest(b_last[b], start);
                    b_grew[b] := true;
                    b := NULL;
                END IF;
            END IF;
            IF b IS NOT NULL THEN
                -- Parked by the gate of bucket b, which opens at `opens` (NULL: when a
                -- slot is freed); a gate met twice keeps the latest time.
                k_ids := k_ids || r.id;
                k_gates := k_gates || b_names[b];
                gi := NULL;
                FOR o IN 1 .. coalesce(cardinality(g_names), 0) LOOP
                    IF g_names[o] = b_names[b] AND g_queues[o] = r.queue THEN
                        gi := o;
                    END IF;
                END LOOP;
                IF gi IS NULL THEN
                    g_names := g_names || b_names[b];
                    g_queues := g_queues || r.queue;
                    g_kinds := g_kinds || b_kinds[b];
                    g_tasks := g_tasks || b_tasks[b];
                    g_keys := g_keys || b_keys[b];
                    g_opens := g_opens || opens;
                ELSE
                    g_opens[gi] := opens;
                END IF;
                CONTINUE;
            END IF;
            IF cb IS NOT NULL THEN
                b_count[cb] := b_count[cb] + 1;
            END IF;
            a_ids := a_ids || r.id;
            a_slots := a_slots || (cb IS NOT NULL);
        END LOOP;
        EXIT WHEN NOT found_any;
        IF cardinality(k_ids) > 0 THEN
            -- By the primary key (= ANY: an index scan whatever the table's size).
            UPDATE {s}.jobs j SET gate = k_gates[array_position(k_ids, j.id)]
            WHERE j.ns = p_ns AND j.id = ANY (k_ids);
            INSERT INTO {s}.gates AS x (ns, queue, gate, kind, task, key, opens_us)
            SELECT p_ns, g.queue, g.name, g.kind, g.task, g.key, g.opens
            FROM unnest(g_queues, g_names, g_kinds, g_tasks, g_keys, g_opens)
                AS g (queue, name, kind, task, key, opens)
            ON CONFLICT (ns, queue, gate) DO UPDATE SET opens_us = excluded.opens_us;
        END IF;
        IF cardinality(a_ids) > 0 THEN
            RETURN QUERY
            UPDATE {s}.jobs j
            SET state = 2, attempt = j.attempt + 1,
                token = p_claim || '.' || (got + array_position(a_ids, j.id)),
                lease_until = now + p_lease, started_at = now, worker_id = p_worker,
                slot = a_slots[array_position(a_ids, j.id)]
            WHERE j.ns = p_ns AND j.id = ANY (a_ids)
            RETURNING got + array_position(a_ids, j.id), j.message, j.token, j.attempt,
                      j.enqueued_at, j.stalls, j.run_at;
            GET DIAGNOSTICS took = ROW_COUNT;
            got := got + took;
        END IF;
    END LOOP;
    -- The rate windows that gained starts, each written once.
    INSERT INTO {s}.rate_windows AS x (ns, task, key, starts)
    SELECT p_ns, b_tasks[u.b], b_keys[u.b],
           array(SELECT w.s FROM unnest(w_starts, w_bucket) AS w (s, bk)
                 WHERE w.bk = u.b ORDER BY w.s)
    FROM generate_subscripts(b_names, 1) AS u (b)
    WHERE b_grew[u.b]
    ON CONFLICT (ns, task, key) DO UPDATE SET starts = excluded.starts;
    IF got > 0 THEN
        INSERT INTO {s}.claims (ns, claim_id, at) VALUES (p_ns, p_claim, now)
        ON CONFLICT (ns, claim_id) DO UPDATE SET at = excluded.at;
    END IF;
END $$;
"""

# Migration 10's step, as migration 10 put it into migration 4's claim: over queues with
# a fair lane (once due jobs joined theirs and gates gave theirs back), claim_fair.
assert SQL.count(CLAIM_HOOK_AFTER) == 1
SQL = SQL.replace(CLAIM_HOOK_AFTER, CLAIM_HOOK_AFTER + CLAIM_FAIR_HOOK)
