"""The PostgreSQL broker's migration 10: fair shares (``fair=``, typedq.fair), claimed
round-robin across keys by weight, as docs/flow-control.md states the rules (the
embedded broker's ``memory/lines.py`` is the reference, the Redis Lua the other
statement of them). Released: never edited (a change is a new migration).

A fair job is a job whose envelope ends with a ``fair_key`` and a ``fair_weight`` above
0. A trigger (``fair_job``, before insert) reads both from the envelope's last bytes,
so every path that stores a job (enqueue, a flow's members and steps, a keyed enqueue)
stores fair jobs without a change; its ``WHEN`` clause reads the last bytes alone
(a plain job's envelope ends with ``fair_weight`` 0: ``00``), so a plain job pays no
call. The job keeps its lane in ``fair`` (``'f' || chr(31) || task || chr(31) || key``)
and its weight in ``fair_weight``.

A waiting fair job is *in its key's lane*: its ``gate`` is its ``fair`` (as a job a
limit parked carries its limit's gate), so the plain claim's line (index ``jobs_open``:
``gate IS NULL``) holds plain jobs only and a lane's jobs are read, oldest first, from
``jobs_parked`` (``(ns, queue, gate, priority DESC, seq)``). A lane's place in its
priority level's line, and its turn, is a row of ``fair_lanes``: ``seq`` (the order the
lane holds among the level's plain jobs, whose ``seq`` it shares), ``weight`` (the jobs
the current turn takes), ``next_weight`` (the weight its next turn takes: its newest new
job's) and ``taken`` (how many the current turn took).

Where a fair job comes to wait, the lane is joined (``fair_join``, an upsert that
holds the lane's row until the transaction commits, so a claim never drops a lane a
job is joining): a new job (inserted waiting, or scheduled and due without having been
claimed) sets the lane's ``next_weight``; any other (a retry, a hand-back, a chain's
first step, a released step) leaves it, and a key with no lane joins with that job's
own weight. A key with no lane joins at the tail of its level (``seq``: the job's
own fresh ``seq``, or a new one for a job handed back unrun), a released step of a flow
(its ``seq`` negative: at the head) at the head. Within the lane, jobs go by ``seq``:
a retried job has a new one (last); a job handed back unrun (release, an expired lease
recovered, a gate giving a parked job back) or a released step gets one below every
other (minus its transaction's stamp times 2^31, plus its old ``seq``'s low bits:
first, the latest call's first, one call's jobs in their order).

The claim (``claim``): migration 4's, word for word, with one step more after due jobs
are promoted and gates give their jobs back: over queues with no lane it goes on as
before, after one look at ``fair_lanes`` (``fair_lined``); otherwise ``claim_fair``
merges the levels' plain jobs and lanes by ``(priority, seq)`` and takes each participant's turn in order: a plain job one job, a
lane up to its turn's count (``weight - taken``, a turn starting with ``next_weight``);
a lane whose turn ended goes to the tail (a new ``seq``), a lane left with no job
waiting is deleted (its turn state with it), a lane left with jobs and turn goes on at
the next claim. Without limits a pass is one statement (``fair_pass``) over the first
participants of the best level, as many as the claim has room for, each locked ``FOR
UPDATE SKIP LOCKED`` (a lane locked is this claim's alone: concurrent claims take other
lanes); passes repeat while the claim has room and jobs come. A claim that limits tasks
admits or parks each job one at a time (as migration 4's limited claim does); a parked
job counts in its key's turn, as on the other brokers. A waiting fair job that
leaves otherwise than by a claim (cancelled, removed, purged) leaves its place as a row
of ``fair_ghosts`` (triggers ``fair_left``, ``fair_gone``): a lane's entries are its jobs
and ghosts by ``seq``, and a ghost counts in its key's turn when it comes up and goes,
as a stale entry does on the other brokers.

``run_step`` (migration 9) reads a job's ``run_queue`` in the envelope's third byte
from the end, which holds only for a job with an empty ``fair_key``: a fair job's final
state calls it, and it looks the run up by the job's id (a fair job that is no step of
a run finds none).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from . import migration_4

__all__ = ["CLAIM_FAIR_HOOK", "CLAIM_HOOK_AFTER", "SQL"]

SQL = r"""
ALTER TABLE {s}.jobs
    ADD COLUMN fair text,
    ADD COLUMN fair_weight integer;

CREATE TABLE {s}.fair_lanes (
    ns text NOT NULL,
    queue text NOT NULL,
    priority integer NOT NULL,
    gate text NOT NULL,
    seq bigint NOT NULL,
    weight integer NOT NULL,
    next_weight integer NOT NULL,
    taken integer NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, queue, priority, gate)
);
-- The lanes of a queue in line order.
CREATE INDEX fair_lanes_line ON {s}.fair_lanes (ns, queue, priority DESC, seq);

-- The places in their lanes of fair jobs that left waiting otherwise than by a claim
-- (cancelled, removed, purged): each counts in its key's turn when it comes up, as a
-- stale entry does on the other brokers, and goes then.
CREATE TABLE {s}.fair_ghosts (
    ns text NOT NULL,
    queue text NOT NULL,
    gate text NOT NULL,
    priority integer NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (ns, queue, gate, priority, seq)
);

-- The fair key and weight at the end of envelope m (msgpack: ..., str fair_key,
-- int fair_weight): the weight an int of 1 to 3 bytes, the key a str whose bytes are
-- ASCII (Fair hashes other keys), read back from the weight to its header.
CREATE FUNCTION {s}.fair_of(m bytea, OUT key text, OUT weight integer)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    e integer := octet_length(m);
    kend integer;
    b integer;
BEGIN
    IF get_byte(m, e - 3) = 205 THEN
        weight := get_byte(m, e - 2) * 256 + get_byte(m, e - 1);
        kend := e - 3;
    ELSIF get_byte(m, e - 2) = 204 THEN
        weight := get_byte(m, e - 1);
        kend := e - 2;
    ELSE
        weight := get_byte(m, e - 1);
        kend := e - 1;
    END IF;
    FOR l IN 0 .. least(kend - 2, 255) LOOP
        b := get_byte(m, kend - l - 1);
        IF (l < 32 AND b = 160 + l)
           OR (l >= 32 AND b = l AND get_byte(m, kend - l - 2) = 217) THEN
            key := convert_from(substr(m, kend - l + 1, l), 'UTF8');
            RETURN;
        END IF;
    END LOOP;
    key := '';
END $$;

-- Join the lane p_gate of (p_queue, p_priority) with a job of weight p_weight (p_new:
-- a new job, whose weight the key's next turn takes); a key with no lane joins at p_seq.
CREATE FUNCTION {s}.fair_join(p_ns text, p_queue text, p_priority integer, p_gate text,
                              p_weight integer, p_seq bigint, p_new boolean)
RETURNS void LANGUAGE sql AS $$
    INSERT INTO {s}.fair_lanes AS l (ns, queue, priority, gate, seq, weight, next_weight)
    VALUES (p_ns, p_queue, p_priority, p_gate, p_seq, p_weight, p_weight)
    ON CONFLICT (ns, queue, priority, gate) DO UPDATE
    SET next_weight = CASE WHEN p_new THEN excluded.next_weight ELSE l.next_weight END
$$;

-- A fair job stored: its key and weight from its envelope; waiting, it is in its lane.
CREATE FUNCTION {s}.fair_job() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    k text;
    w integer;
BEGIN
    SELECT f.key, f.weight INTO k, w FROM {s}.fair_of(NEW.message) f;
    IF w <= 0 THEN
        RETURN NEW;
    END IF;
    NEW.fair := 'f' || chr(31) || coalesce(NEW.task, '') || chr(31) || k;
    NEW.fair_weight := w;
    IF NEW.state = 0 AND NEW.gate IS NULL THEN
        NEW.gate := NEW.fair;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER fair_job BEFORE INSERT ON {s}.jobs FOR EACH ROW
WHEN (get_byte(NEW.message, octet_length(NEW.message) - 1) <> 0
      OR get_byte(NEW.message, octet_length(NEW.message) - 3) = 205)
EXECUTE FUNCTION {s}.fair_job();

-- After the row is in (an id that exists stores nothing, and joins nothing): a new
-- job joins its lane; a chain's first step leaves the key's weight.
CREATE FUNCTION {s}.fair_stored() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {s}.fair_join(NEW.ns, NEW.queue, NEW.priority, NEW.fair, NEW.fair_weight,
                          NEW.seq, NEW.flow_step IS NULL);
    RETURN NULL;
END $$;

CREATE TRIGGER fair_stored AFTER INSERT ON {s}.jobs FOR EACH ROW
WHEN (NEW.fair IS NOT NULL AND NEW.state = 0 AND NEW.gate = NEW.fair)
EXECUTE FUNCTION {s}.fair_stored();

-- A fair job waiting again (or given back by its gate): into its lane. Handed back
-- unrun (active before with its seq kept, or parked) or released as a flow's step
-- (seq negative): first in its lane, the latest call's first and one call's jobs in
-- their order (seq: minus this transaction's stamp, a value of job_seq, times 2^31, plus
-- its old seq's low bits); a key with no lane joins at the tail, or for a released
-- step at the head. Due after a delay without ever having been claimed: a new job.
CREATE FUNCTION {s}.fair_back() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    back boolean := OLD.state = 0 OR (OLD.state = 2 AND NEW.seq = OLD.seq);
    head boolean := OLD.state = 1 AND NEW.seq < 0;
    stamp bigint;
BEGIN
    NEW.gate := NEW.fair;
    IF back OR head THEN
        stamp := nullif(current_setting('typedq.fair_stamp', true), '')::bigint;
        IF stamp IS NULL THEN
            stamp := nextval('{s}.job_seq');
            PERFORM set_config('typedq.fair_stamp', stamp::text, true);
        END IF;
        NEW.seq := -(stamp * 2147483648)
                   + CASE WHEN back THEN OLD.seq & 2147483647 ELSE 0 END;
    END IF;
    PERFORM {s}.fair_join(NEW.ns, NEW.queue, NEW.priority, NEW.fair, NEW.fair_weight,
                          CASE WHEN back THEN nextval('{s}.job_seq') ELSE NEW.seq END,
                          OLD.state = 1 AND NOT head AND OLD.worker_id IS NULL);
    RETURN NEW;
END $$;

CREATE TRIGGER fair_back BEFORE UPDATE OF state, gate ON {s}.jobs FOR EACH ROW
WHEN (NEW.fair IS NOT NULL AND NEW.state = 0 AND NEW.gate IS NULL)
EXECUTE FUNCTION {s}.fair_back();

-- A fair job left its lane otherwise than by a claim: its place stays, as a ghost.
CREATE FUNCTION {s}.fair_left() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.fair_ghosts (ns, queue, gate, priority, seq)
    VALUES (OLD.ns, OLD.queue, OLD.gate, OLD.priority, OLD.seq)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER fair_left AFTER UPDATE OF state ON {s}.jobs FOR EACH ROW
WHEN (OLD.state = 0 AND OLD.gate = OLD.fair AND NEW.state NOT IN (0, 2))
EXECUTE FUNCTION {s}.fair_left();

CREATE TRIGGER fair_gone AFTER DELETE ON {s}.jobs FOR EACH ROW
WHEN (OLD.state = 0 AND OLD.gate = OLD.fair)
EXECUTE FUNCTION {s}.fair_left();

-- Has a queue of p_queues a lane? Read in the lanes' index: an EXISTS on the
-- namespace and queue alone can be planned (a generic plan, whose estimates take every
-- lane for the namespace's) as a scan of the table, which for a namespace with no lane
-- reads every other namespace's.
CREATE FUNCTION {s}.fair_lined(p_ns text, p_queues text[])
RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM unnest(p_queues) AS qn (q),
                   LATERAL (SELECT l.seq FROM {s}.fair_lanes l
                            WHERE l.ns = p_ns AND l.queue = qn.q
                            ORDER BY l.priority DESC, l.seq LIMIT 1) x)
$$;

-- A lane's first p_n entries, oldest first: its jobs and its ghosts (id NULL).
CREATE FUNCTION {s}.fair_head(p_ns text, p_queue text, p_gate text, p_priority integer,
                              p_n integer)
RETURNS TABLE (id text, seq bigint) LANGUAGE sql STABLE AS $$
    SELECT e.id, e.seq FROM (
        (SELECT j.id, j.seq FROM {s}.jobs j
         WHERE j.ns = p_ns AND j.queue = p_queue AND j.state = 0 AND j.gate = p_gate
           AND j.priority = p_priority
         ORDER BY j.seq
         LIMIT p_n)
        UNION ALL
        (SELECT NULL::text, g.seq FROM {s}.fair_ghosts g
         WHERE g.ns = p_ns AND g.queue = p_queue AND g.gate = p_gate
           AND g.priority = p_priority
         ORDER BY g.seq
         LIMIT p_n)
    ) e
    ORDER BY e.seq
    LIMIT p_n
$$;

-- One pass of a claim with no limits (claim_fair): the first p_room participants of the
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

#: Where migration 4's claim has promoted due jobs and given gates' jobs back.
CLAIM_HOOK_AFTER = """    PERFORM {s}.unpark(p_ns, p_queues, now_us, p_tasks, p_rates, p_pers, p_concs,
                       p_spacings, p_earlies);
"""
CLAIM_FAIR_HOOK = """    IF {s}.fair_lined(p_ns, p_queues) THEN
        RETURN QUERY
        SELECT * FROM {s}.claim_fair(p_ns, p_queues, p_limit, p_worker, p_lease, p_claim,
                                     p_tasks, p_rates, p_pers, p_concs, p_spacings,
                                     p_earlies);
        RETURN;
    END IF;
"""


def _claim() -> str:
    """Migration 4's claim, word for word (a released migration never changes), with
    one step more: over queues with a lane (once due jobs joined theirs and gates gave
    theirs back), ``claim_fair`` takes the jobs. A plain claim pays one look at the
    lanes' index."""
    sql = migration_4.SQL
    start = sql.index("CREATE FUNCTION {s}.claim(")
    body = sql[start : sql.index("END $$;", start) + len("END $$;")]
    assert body.count(CLAIM_HOOK_AFTER) == 1
    body = body.replace(CLAIM_HOOK_AFTER, CLAIM_HOOK_AFTER + CLAIM_FAIR_HOOK)
    return "-- Migration 4's claim, and claim_fair over queues with a lane.\n" + body.replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
    )


SQL += _claim() + "\n"
