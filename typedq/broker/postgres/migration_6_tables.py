"""Migration 6 (:mod:`.migration_6`), its first part: the flows' columns of the jobs
table and index, the flows' tables, and the msgpack that the flows' SQL writes
(``mp_*``, ``job_error``, ``flow_broken``). Released: never edited."""

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
"""
