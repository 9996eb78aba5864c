"""Migration 10's claim over queues with a fair lane (``fair_pass``, ``claim_fair``): a
part of migration 10's SQL (typedq.broker.postgres.migration_10, whose docstring tells
the rules), kept in a module of its own for its size; joined after the lanes' tables,
triggers and reads, before migration 4's claim with its step to ``claim_fair``."""

__all__ = ["CLAIM_FAIR_SQL"]

CLAIM_FAIR_SQL = r"""-- One pass of a claim with no limits (claim_fair): the first p_room participants of the
-- queues' lines (plain jobs, each locked, and lanes, each locked: a lane's jobs are
-- then this claim's alone), best first; each takes its turn in order, up to p_room jobs
-- in all: a plain job itself, a lane up to its turn's count (its head jobs, read with
-- one more to learn whether any is left). The jobs taken are claimed (numbered from
-- p_got + 1), and in the same statement each lane reached goes on, goes to the tail
-- (its turn over) or goes (no job left).
CREATE FUNCTION {s}.fair_pass(p_ns text, p_queues text[], p_room bigint, p_got bigint,
                              p_worker text, p_lease double precision, p_claim text,
                              p_now double precision)
RETURNS TABLE (n bigint, message bytea, token text, attempt integer,
               enqueued_at double precision, stalls integer, run_at double precision)
LANGUAGE plpgsql
-- Planned once per session: a custom plan of this statement takes longer to make than to
-- run, and the generic one reads every table by its index (ORDER BY, keys).
SET plan_cache_mode = force_generic_plan AS $$
BEGIN
    -- (PL/pgSQL for its cached plan: an SQL function's statement is planned at each call.)
    RETURN QUERY
    -- The first participants of the best priority level among them: a lane whose turn
    -- ends goes to the tail of its level, still ahead of the levels below.
    WITH cand AS (SELECT v.* FROM (
        SELECT z.*, row_number() OVER (ORDER BY z.priority DESC, z.seq) AS o,
               max(z.priority) OVER () AS top FROM (
            SELECT x.id, x.queue, x.priority, x.seq, NULL::text AS gate, 1 AS turn,
                   0 AS taken
            FROM unnest(p_queues) AS qn (q),
            LATERAL (
                SELECT w.id, w.queue, w.priority, w.seq FROM {s}.jobs w
                WHERE w.ns = p_ns AND w.queue = qn.q AND w.state = 0 AND w.gate IS NULL
                ORDER BY w.priority DESC, w.seq
                LIMIT p_room
                FOR UPDATE SKIP LOCKED
            ) x
            UNION ALL
            SELECT NULL, y.queue, y.priority, y.seq, y.gate,
                   CASE WHEN y.taken = 0 THEN y.next_weight ELSE y.weight END, y.taken
            FROM unnest(p_queues) AS qn (q),
            LATERAL (
                SELECT l.queue, l.priority, l.seq, l.gate, l.weight, l.next_weight, l.taken
                FROM {s}.fair_lanes l
                WHERE l.ns = p_ns AND l.queue = qn.q
                ORDER BY l.priority DESC, l.seq
                LIMIT p_room
                FOR UPDATE SKIP LOCKED
            ) y
            ORDER BY 3 DESC, 4
            LIMIT p_room
        ) z
    ) v WHERE v.priority = v.top),
    heads AS (
        SELECT c.o, c.id, 0::bigint AS seq, 1::bigint AS rn FROM cand c WHERE c.gate IS NULL
        UNION ALL
        SELECT c.o, h.id, h.seq, row_number() OVER (PARTITION BY c.o ORDER BY h.seq)
        FROM cand c, LATERAL {s}.fair_head(p_ns, c.queue, c.gate, c.priority,
                                           c.turn - c.taken + 1) h
        WHERE c.gate IS NOT NULL
    ),
    -- The entries the turns take, in order, until p_room jobs (a ghost counts in its
    -- turn, not in the claim).
    picked AS (
        SELECT x.id, x.o, x.seq FROM (
            SELECT h.id, h.o, h.seq,
                   count(h.id) OVER (ORDER BY h.o, h.seq) - (h.id IS NOT NULL)::int AS before
            FROM heads h JOIN cand c ON c.o = h.o
            WHERE h.rn <= c.turn - c.taken
        ) x
        WHERE x.before < p_room
    ),
    taking AS (
        SELECT p.id, p.o, row_number() OVER (ORDER BY p.o, p.seq) AS k
        FROM picked p WHERE p.id IS NOT NULL
    ),
    spent AS (
        DELETE FROM {s}.fair_ghosts g USING picked p, cand c
        WHERE p.id IS NULL AND c.o = p.o AND g.ns = p_ns AND g.queue = c.queue
          AND g.gate = c.gate AND g.priority = c.priority AND g.seq = p.seq
    ),
    claimed AS (
        UPDATE {s}.jobs j
        SET state = 2, attempt = j.attempt + 1, token = p_claim || '.' || (p_got + p.k),
            lease_until = p_now + p_lease, started_at = p_now, worker_id = p_worker
        FROM taking p
        WHERE j.ns = p_ns AND j.id = p.id AND j.state = 0
        RETURNING p_got + p.k AS n, p.o, j.message, j.token, j.attempt, j.enqueued_at,
                  j.stalls, j.run_at
    ),
    reached AS (
        SELECT c.queue, c.priority, c.gate, c.turn, c.taken,
               (SELECT count(*) FROM picked t WHERE t.o = c.o) AS took,
               (SELECT count(*) FROM heads h WHERE h.o = c.o) AS seen
        FROM cand c
        WHERE c.gate IS NOT NULL
          -- Reached: before the last participant that took a job, or every one when
          -- the pass had room left.
          AND (c.o <= (SELECT max(p.o) FROM picked p)
               OR (SELECT count(*) FROM taking) < p_room)
    ),
    gone AS (
        DELETE FROM {s}.fair_lanes l USING reached r
        WHERE l.ns = p_ns AND l.queue = r.queue AND l.priority = r.priority
          AND l.gate = r.gate AND r.seen <= r.took
    ),
    moved AS (
        UPDATE {s}.fair_lanes l
        SET weight = r.turn,
            taken = CASE WHEN r.taken + r.took >= r.turn THEN 0 ELSE r.taken + r.took END,
            seq = CASE WHEN r.taken + r.took >= r.turn THEN nextval('{s}.job_seq')
                       ELSE l.seq END
        FROM reached r
        WHERE l.ns = p_ns AND l.queue = r.queue AND l.priority = r.priority
          AND l.gate = r.gate AND r.seen > r.took AND r.took > 0
    )
    SELECT c.n, c.message, c.token, c.attempt, c.enqueued_at, c.stalls, c.run_at
    FROM claimed c
    UNION ALL
    -- A row per ghost taken (n NULL): the pass made progress.
    SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM picked p WHERE p.id IS NULL;
END $$;

-- The claim over queues with lanes (see the module), due jobs promoted and open gates
-- given back already (claim).
CREATE FUNCTION {s}.claim_fair(p_ns text, p_queues text[], p_limit integer, p_worker text,
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
    limited boolean := coalesce(array_length(p_tasks, 1), 0) > 0;
    -- Plain jobs whose bucket another claim holds, and lanes left for this claim.
    skipped text[] := '{{}}';
    passed text[] := '{{}}';
    progress boolean;
    c record;
    r record;
    v_lane {s}.fair_lanes;
    v_id text;
    v_weight integer;
    v_taken integer;
    v_took bigint;
    v_left boolean;
    v_busy boolean;
    v_verdict smallint;
    v_i integer;
    v_task text;
    v_idle integer := 0;
    v_base bigint;
    v_ghosts bigint;
    v_ghost bigint;
BEGIN
    -- No limits: each pass takes the turns of the first participants in one statement
    -- (see fair_pass); a pass that takes nothing ends the claim (after a second look: it
    -- may have dropped lanes whose jobs all left).
    IF NOT limited THEN
        -- Jobs are numbered from v_base + 1 in a pass (a job another transaction took
        -- meanwhile leaves its number unused: the next pass starts after the room).
        v_base := got;
        LOOP
            EXIT WHEN got >= p_limit;
            v_took := 0;
            v_ghosts := 0;
            FOR r IN SELECT * FROM {s}.fair_pass(p_ns, p_queues, p_limit - got, v_base,
                                                 p_worker, p_lease, p_claim, now) LOOP
                IF r.n IS NULL THEN
                    v_ghosts := v_ghosts + 1;
                    CONTINUE;
                END IF;
                v_took := v_took + 1;
                n := r.n;
                message := r.message;
                token := r.token;
                attempt := r.attempt;
                enqueued_at := r.enqueued_at;
                stalls := r.stalls;
                run_at := r.run_at;
                RETURN NEXT;
            END LOOP;
            v_base := v_base + (p_limit - got);
            got := got + v_took;
            IF v_took + v_ghosts = 0 THEN
                v_idle := v_idle + 1;
                EXIT WHEN v_idle >= 2;
            END IF;
        END LOOP;
    END IF;
    LOOP
        EXIT WHEN got >= p_limit OR NOT limited;
        progress := false;
        FOR c IN
            -- (The best level's only: see fair_pass.)
            SELECT v.id, v.queue, v.priority, v.seq, v.gate FROM (
            SELECT z.*, max(z.priority) OVER () AS top FROM (
                SELECT x.id, x.queue, x.priority, x.seq, NULL::text AS gate
                FROM unnest(p_queues) AS qn (q),
                LATERAL (
                    SELECT w.id, w.queue, w.priority, w.seq FROM {s}.jobs w
                    WHERE w.ns = p_ns AND w.queue = qn.q AND w.state = 0 AND w.gate IS NULL
                      AND w.id <> ALL (skipped)
                    ORDER BY w.priority DESC, w.seq
                    LIMIT p_limit - got
                ) x
                UNION ALL
                SELECT NULL, y.queue, y.priority, y.seq, y.gate
                FROM unnest(p_queues) AS qn (q),
                LATERAL (
                    SELECT l.queue, l.priority, l.seq, l.gate FROM {s}.fair_lanes l
                    WHERE l.ns = p_ns AND l.queue = qn.q
                      AND l.queue || chr(30) || l.priority || chr(30) || l.gate <> ALL (passed)
                    ORDER BY l.priority DESC, l.seq
                    LIMIT p_limit - got
                ) y
            ) z
            ORDER BY z.priority DESC, z.seq
            LIMIT p_limit - got
            ) v WHERE v.priority = v.top ORDER BY v.seq
        LOOP
            EXIT WHEN got >= p_limit;
            IF c.gate IS NULL THEN
                -- A plain job: one job.
                SELECT j.id, j.queue, j.task, j.rate_key, j.conc_key INTO r FROM {s}.jobs j
                WHERE j.ns = p_ns AND j.id = c.id AND j.state = 0 AND j.gate IS NULL
                FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    skipped := skipped || c.id;
                    CONTINUE;
                END IF;
                v_verdict := 0;
                v_i := CASE WHEN limited THEN array_position(p_tasks, r.task) END;
                IF v_i IS NOT NULL THEN
                    SELECT a.verdict INTO v_verdict
                    FROM {s}.admit(p_ns, r.queue, r.id, r.task, r.rate_key, r.conc_key,
                                   p_rates[v_i], p_pers[v_i], p_concs[v_i], p_spacings[v_i],
                                   p_earlies[v_i], now_us, NULL) a;
                END IF;
                IF v_verdict = 2 THEN
                    skipped := skipped || r.id;
                    CONTINUE;
                END IF;
                progress := true;
                IF v_verdict = 0 THEN
                    got := got + 1;
                    RETURN QUERY
                    UPDATE {s}.jobs j
                    SET state = 2, attempt = j.attempt + 1, token = p_claim || '.' || got,
                        lease_until = now + p_lease, started_at = now, worker_id = p_worker,
                        slot = v_i IS NOT NULL AND p_concs[v_i] > 0
                    WHERE j.ns = p_ns AND j.id = r.id
                    RETURNING got, j.message, j.token, j.attempt, j.enqueued_at, j.stalls,
                              j.run_at;
                END IF;
                CONTINUE;
            END IF;
            -- A lane: its turn.
            SELECT * INTO v_lane FROM {s}.fair_lanes l
            WHERE l.ns = p_ns AND l.queue = c.queue AND l.priority = c.priority
              AND l.gate = c.gate
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                passed := passed || (c.queue || chr(30) || c.priority || chr(30) || c.gate);
                CONTINUE;
            END IF;
            IF v_lane.seq <> c.seq THEN
                progress := true;  -- moved since this pass read it: read again
                CONTINUE;
            END IF;
            v_weight := CASE WHEN v_lane.taken = 0 THEN v_lane.next_weight
                             ELSE v_lane.weight END;
            v_took := 0;
            v_busy := false;
            v_task := split_part(v_lane.gate, chr(31), 2);
            v_i := array_position(p_tasks, v_task);
            -- Entry by entry: a ghost counts in the turn and goes; a job of a limited
            -- task is admitted or parked (both count in the turn).
            WHILE v_lane.taken + v_took < v_weight AND got < p_limit LOOP
                SELECT g.seq INTO v_ghost FROM {s}.fair_ghosts g
                WHERE g.ns = p_ns AND g.queue = v_lane.queue AND g.gate = v_lane.gate
                  AND g.priority = v_lane.priority
                ORDER BY g.seq LIMIT 1;
                SELECT j.id, j.seq, j.rate_key, j.conc_key INTO r FROM {s}.jobs j
                WHERE j.ns = p_ns AND j.queue = v_lane.queue AND j.state = 0
                  AND j.gate = v_lane.gate AND j.priority = v_lane.priority
                ORDER BY j.seq LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF v_ghost IS NOT NULL AND (NOT FOUND OR v_ghost < r.seq) THEN
                    DELETE FROM {s}.fair_ghosts g
                    WHERE g.ns = p_ns AND g.queue = v_lane.queue AND g.gate = v_lane.gate
                      AND g.priority = v_lane.priority AND g.seq = v_ghost;
                    v_took := v_took + 1;
                    CONTINUE;
                END IF;
                IF NOT FOUND THEN
                    v_busy := true;
                    EXIT;
                END IF;
                v_verdict := 0;
                IF v_i IS NOT NULL THEN
                    SELECT a.verdict INTO v_verdict
                    FROM {s}.admit(p_ns, v_lane.queue, r.id, v_task, r.rate_key, r.conc_key,
                                   p_rates[v_i], p_pers[v_i], p_concs[v_i], p_spacings[v_i],
                                   p_earlies[v_i], now_us, NULL) a;
                END IF;
                IF v_verdict = 2 THEN
                    v_busy := true;
                    EXIT;
                END IF;
                v_took := v_took + 1;
                IF v_verdict = 0 THEN
                    got := got + 1;
                    RETURN QUERY
                    UPDATE {s}.jobs j
                    SET state = 2, attempt = j.attempt + 1, token = p_claim || '.' || got,
                        lease_until = now + p_lease, started_at = now, worker_id = p_worker,
                        slot = v_i IS NOT NULL AND p_concs[v_i] > 0
                    WHERE j.ns = p_ns AND j.id = r.id
                    RETURNING got, j.message, j.token, j.attempt, j.enqueued_at, j.stalls,
                              j.run_at;
                END IF;
            END LOOP;
            v_taken := v_lane.taken + v_took;
            v_left := EXISTS (SELECT 1 FROM {s}.fair_head(p_ns, v_lane.queue, v_lane.gate,
                                                          v_lane.priority, 1));
            IF NOT v_left THEN
                -- No job waiting: the key leaves the line (its next job joins it again).
                DELETE FROM {s}.fair_lanes l
                WHERE l.ns = p_ns AND l.queue = v_lane.queue AND l.priority = v_lane.priority
                  AND l.gate = v_lane.gate;
                progress := true;
            ELSIF v_taken >= v_weight THEN
                -- Its turn is over: back to the tail.
                UPDATE {s}.fair_lanes l
                SET weight = v_weight, taken = 0, seq = nextval('{s}.job_seq')
                WHERE l.ns = p_ns AND l.queue = v_lane.queue AND l.priority = v_lane.priority
                  AND l.gate = v_lane.gate;
            ELSE
                UPDATE {s}.fair_lanes l SET weight = v_weight, taken = v_taken
                WHERE l.ns = p_ns AND l.queue = v_lane.queue AND l.priority = v_lane.priority
                  AND l.gate = v_lane.gate;
                IF v_busy THEN
                    -- Its jobs held by other claims, or its bucket busy: left for now.
                    passed := passed || (c.queue || chr(30) || c.priority || chr(30) || c.gate);
                END IF;
            END IF;
            IF v_took > 0 THEN
                progress := true;
            END IF;
        END LOOP;
        EXIT WHEN NOT progress;
    END LOOP;
    IF got > 0 THEN
        INSERT INTO {s}.claims (ns, claim_id, at) VALUES (p_ns, p_claim, now)
        ON CONFLICT (ns, claim_id) DO UPDATE SET at = excluded.at;
    END IF;
END $$;
"""
