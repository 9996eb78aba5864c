"""The PostgreSQL broker's migration 3: schedules (their states, fired by compare-and-set
on the database's clock). Released: never edited (a change is a new migration).

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

__all__ = ["SQL"]

SQL = r"""
-- Schedules (capability Schedules): the state of each schedule, fired by compare-and-set.
-- Times are integer microseconds of the database's clock.
CREATE TABLE {s}.schedules (
    ns text NOT NULL,
    name text NOT NULL,
    digest text NOT NULL,
    last_tick_us bigint NOT NULL,
    last_job text NOT NULL DEFAULT '',
    last_fired_us bigint NOT NULL DEFAULT 0,
    fired bigint NOT NULL DEFAULT 0,
    skipped bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (ns, name)
);

-- The broker's clock in integer microseconds (floor, as Redis TIME).
CREATE FUNCTION {s}.now_us() RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint
$$;

-- Reconcile the states with the definitions (p_names[i], p_digests[i]): a new schedule,
-- or one of another digest, starts over at now; with p_prune the others go. Answers
-- the listed schedules' states, in order.
CREATE FUNCTION {s}.sync_schedules(p_ns text, p_names text[], p_digests text[],
                                   p_prune boolean)
RETURNS SETOF {s}.schedules LANGUAGE plpgsql AS $$
DECLARE
    now bigint := {s}.now_us();
BEGIN
    IF p_prune THEN
        DELETE FROM {s}.schedules x WHERE x.ns = p_ns AND NOT (x.name = ANY (p_names));
    END IF;
    FOR i IN 1 .. coalesce(array_length(p_names, 1), 0) LOOP
        INSERT INTO {s}.schedules AS x (ns, name, digest, last_tick_us)
        VALUES (p_ns, p_names[i], p_digests[i], now)
        ON CONFLICT (ns, name) DO UPDATE
        SET digest = excluded.digest, last_tick_us = excluded.last_tick_us, last_job = '',
            last_fired_us = 0, fired = 0, skipped = 0
        WHERE x.digest <> excluded.digest;
    END LOOP;
    RETURN QUERY
    SELECT x.* FROM unnest(p_names) WITH ORDINALITY AS n (name, ord)
    JOIN {s}.schedules x ON x.ns = p_ns AND x.name = n.name
    ORDER BY n.ord;
END $$;

-- Fire each firing i (its messages: p_ids etc. from p_starts[i], p_counts[i] of them),
-- in order, each atomically: compare-and-set on (digest, last tick), never before its
-- time by the database's clock, the overlap rule against the last fired job, the jobs
-- stored by enqueue (a full queue skips the ticks). Answers per firing its outcome
-- (0 fired, 1 stale, 2 overlap skipped, 3 held, 4 full) and the state after (NULLs: the
-- schedule has none).
CREATE FUNCTION {s}.fire_schedules(p_ns text, p_names text[], p_digests text[],
                                   p_expected bigint[], p_new_last bigint[],
                                   p_skipped integer[], p_overlap text[],
                                   p_starts integer[], p_counts integer[],
                                   p_caps integer[], p_ids text[], p_queues text[],
                                   p_messages bytea[], p_priorities integer[],
                                   p_etas double precision[],
                                   p_delays double precision[], p_channel text)
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
                                        p_caps[i], p_channel);
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
"""
