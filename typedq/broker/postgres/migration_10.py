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
from .migration_10_claim import CLAIM_FAIR_SQL

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


SQL += CLAIM_FAIR_SQL + _claim() + "\n"
