"""The PostgreSQL broker's statements: each call of the schema's functions and each read,
as SQL text for a schema (quoted), made once per broker."""

from __future__ import annotations

import math

from ..base import JobState
from ..memory.listing import CURSOR_LETTERS, cursor_place
from .rows import CODE

__all__ = [
    "BOUND_BY_INTEGER",
    "RECORD_COLUMNS",
    "count_statements",
    "page_args",
    "page_statement",
    "statements",
]

#: The order of each state's listing (Broker.list_jobs).
_LIST_ORDER = {
    JobState.WAITING: "priority DESC, seq",
    JobState.SCHEDULED: "run_at, seq",
    JobState.ACTIVE: "started_at, seq",
}

#: A job's place in its state's order for paging (``page_jobs``), as memory's listing
#: has it: (number, order), then the id.
_PLACES = {
    # (bigint before the negation: -(-2147483648) is no integer, MIN_PRIORITY is)
    JobState.WAITING: ("-priority::bigint", "seq"),
    JobState.SCHEDULED: ("run_at", "seq"),
    JobState.ACTIVE: ("started_at", "seq"),
    JobState.COMPLETED: ("-seq", "0"),
    JobState.FAILED: ("-seq", "0"),
    JobState.CANCELLED: ("-seq", "0"),
}

RECORD_COLUMNS = (
    "id, message, state, attempt, enqueued_at, run_at, started_at, finished_at, result, "
    "error, errors, progress, stalls, cancel_requested, worker_id, br_kind, br_message"
)


def statements(schema: str) -> tuple[dict[str, str], dict[JobState, str], dict[JobState, str]]:
    """The broker's statements for ``schema``: its calls and reads by name, the page of
    each state by cursor (``page_jobs``), and the listing of each state (``list_jobs``)."""
    s = f'"{schema}"'
    sql = {
        # The transactional enqueue's (.within): it notifies its queues always.
        "enqueue": f"SELECT {s}.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        # The plain enqueue's (migration 17): it notifies only queues a worker waits for.
        "enqueue_waking": f"SELECT {s}.enqueue_waking($1, $2, $3, $4, $5, $6, $7, $8, $9, "
        "$10, $11, $12)",
        # A waiter's mark on a job (migration 17): its end is notified.
        "watch": f"SELECT {s}.watch($1, $2)",
        # A worker about to wait: its queues marked, then whether a claim may find work
        # now, else in how many seconds (NULL: no job due).
        "sleep_due": f"SELECT * FROM {s}.sleep_due($1, $2)",
        # Durable runs (migration 9, .runs).
        "run_create": f"SELECT * FROM {s}.run_create($1, $2, $3, $4, $5, $6, $7, $8, $9, "
        "$10, $11, $12)",
        "run_get": f"SELECT * FROM {s}.run_rows($1, $2, $3)",
        "run_page": f"SELECT id FROM {s}.runs WHERE ns = $1 AND id > $2 ORDER BY id LIMIT $3",
        "run_append": f"SELECT {s}.run_append($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, "
        "$12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28)",
        "run_signal": f"SELECT {s}.run_signal($1, $2, $3, $4, $5)",
        "run_wake": f"SELECT {s}.run_wake_runs($1, $2, $3, $4)",
        "run_cancel": f"SELECT * FROM {s}.run_cancel($1, $2, $3, $4, $5)",
        "enqueue_controlled": f"SELECT * FROM {s}.enqueue_controlled($1, $2, $3, $4, $5, "
        "$6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        "claim": f"SELECT * FROM {s}.claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        "complete": f"SELECT {s}.complete($1, $2, $3, $4, $5, $6, $7)",
        "complete_and_claim": f"SELECT * FROM {s}.complete_and_claim($1, $2, $3, $4, $5, "
        "$6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)",
        "fail": f"SELECT {s}.fail($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        "release": f"SELECT {s}.release($1, $2, $3, $4, $5, $6, $7)",
        "cancel": f"SELECT {s}.cancel_job($1, $2, $3, $4, $5, $6, $7)",
        "recover": f"SELECT {s}.recover($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        "retry": f"SELECT {s}.retry($1, $2, $3, $4)",
        "enqueue_flow": f"SELECT {s}.enqueue_flow($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, "
        "$11, $12, $13, $14, $15, $16, $17, $18, $19)",
        "enqueue_flows": f"SELECT * FROM {s}.enqueue_flows($1, $2, $3, $4, $5, $6, $7, $8, "
        "$9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        "note_spans": f"SELECT {s}.flow_note_spans($1, $2, $3, $4, $5)",
        "flow_finish": f"SELECT {s}.flow_finish($1)",
        # A flow by its id or the id of one of its jobs: running (its flows row), or
        # ended (its own job's shape).
        "flow_state": (
            f"WITH j AS (SELECT coalesce((SELECT x.flow_id FROM {s}.jobs x "
            "WHERE x.ns = $1 AND x.id = $2), $2) AS fid) "
            "SELECT j.fid, f.steps, f.members, f.remaining, f.completed, f.failed, "
            "f.cancelled, o.flow_shape AS shape "
            f"FROM j LEFT JOIN {s}.flows f ON f.ns = $1 AND f.id = j.fid "
            f"LEFT JOIN {s}.jobs o ON o.ns = $1 AND o.id = j.fid"
        ),
        "history": (
            f"WITH c AS (SELECT floor({s}.now_s() / 60)::bigint AS cur) "
            "SELECT c.cur, r.queue, r.minute, sum(r.completed)::bigint AS completed, "
            "sum(r.failed)::bigint AS failed, sum(r.retried)::bigint AS retried "
            f"FROM c LEFT JOIN {s}.rollups r ON r.ns = $1 AND r.queue = ANY ($2) "
            "AND r.minute > c.cur - $3 AND r.minute <= c.cur "
            "GROUP BY c.cur, r.queue, r.minute"
        ),
        "register_worker": (
            f"WITH d AS (DELETE FROM {s}.workers WHERE ns = $1 AND id <> $2 "
            f"AND until <= {s}.now_s()), "
            f"q AS (INSERT INTO {s}.queues (ns, queue) "
            "SELECT $1, u FROM unnest($5::text[]) u ORDER BY 1 ON CONFLICT DO NOTHING) "
            f"INSERT INTO {s}.workers AS w (ns, id, until, info) "
            f"VALUES ($1, $2, {s}.now_s() + $3, $4) "
            "ON CONFLICT (ns, id) DO UPDATE SET until = excluded.until, info = excluded.info"
        ),
        "unregister_worker": f"DELETE FROM {s}.workers WHERE ns = $1 AND id = $2",
        "list_workers": f"SELECT info FROM {s}.workers WHERE ns = $1 "
        f"AND until > {s}.now_s() ORDER BY id",
        "register_queues": f"INSERT INTO {s}.queues (ns, queue) "
        "SELECT $1, u FROM unnest($2::text[]) u ORDER BY 1 ON CONFLICT DO NOTHING",
        "list_queues": f"SELECT queue FROM {s}.queues WHERE ns = $1 ORDER BY queue",
        "now_us": f"SELECT {s}.now_us()",
        "sync_schedules": f"SELECT * FROM {s}.sync_schedules($1, $2, $3, $4)",
        "fire_schedules": f"SELECT * FROM {s}.fire_schedules($1, $2, $3, $4, $5, $6, $7, "
        "$8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        "schedule_states": f"SELECT * FROM {s}.schedules WHERE ns = $1 ORDER BY name",
        "remove": f"SELECT {s}.remove($1, $2, $3, $4, $5)",
        "get": f"SELECT {RECORD_COLUMNS} FROM {s}.jobs WHERE ns = $1 AND id = ANY ($2)",
        "counts": f"SELECT state, count(*) FROM {s}.jobs WHERE ns = $1 AND queue = $2 "
        "GROUP BY state",
        # Per lease: 0 renewed, 1 lost, 2 renewed and a cancel requested. A renewal never
        # waits for a row lock (SKIP LOCKED): a job whose row another transaction holds
        # (its settle in flight, a recovery, a cancel) is left as it is and answered by
        # what this statement's snapshot shows (the next renewal sees the outcome). Were
        # it to wait, it would hold the rows it renewed first while it waits, and the
        # worker's own settle of several of its jobs, locking them in another order,
        # deadlocks with it: PostgreSQL sees that only after deadlock_timeout (1 s by
        # default), by when the worker's other leases may have run out and another
        # worker recovered and started them (a job run twice by live workers).
        "renew": (
            "WITH i AS (SELECT * FROM unnest($2::text[], $3::text[]) WITH ORDINALITY "
            "AS t(id, token, ord)), "
            f"l AS (SELECT j.id FROM {s}.jobs j JOIN i ON j.id = i.id AND j.token = i.token "
            "WHERE j.ns = $1 AND j.state = 2 FOR NO KEY UPDATE OF j SKIP LOCKED), "
            f"u AS (UPDATE {s}.jobs j SET lease_until = {s}.now_s() + $4 FROM l "
            "WHERE j.ns = $1 AND j.id = l.id RETURNING j.id, j.token, j.cancel_requested) "
            "SELECT CASE WHEN u.id IS NOT NULL THEN "
            "CASE WHEN u.cancel_requested THEN 2 ELSE 0 END "
            f"WHEN EXISTS (SELECT 1 FROM {s}.jobs x WHERE x.ns = $1 AND x.id = i.id "
            "AND x.token = i.token AND x.state = 2) THEN 0 ELSE 1 END::smallint "
            "FROM i LEFT JOIN u ON u.id = i.id AND u.token = i.token ORDER BY i.ord"
        ),
        "progress": f"UPDATE {s}.jobs SET progress = $4 WHERE ns = $1 AND id = $2 "
        "AND state = 2 AND token = $3",
        # The reaper's pass of a broker that limits tasks: the rate windows of its
        # tasks ($2, windows $3 us) with no start left in them (a bucket another claim
        # holds is left for the next pass; CASE: its lock is tried only for an idle one),
        # and freed notes older than a minute whose gate is gone.
        "forget_idle": (
            f"WITH w AS (DELETE FROM {s}.rate_windows r "
            "USING unnest($2::text[], $3::bigint[]) AS l (task, per) "
            "WHERE r.ns = $1 AND r.task = l.task AND l.per > 0 AND CASE WHEN "
            f"r.starts[array_upper(r.starts, 1)] <= {s}.now_us() - l.per "
            f"THEN {s}.limit_lock(r.ns, 'r', r.task, r.key) ELSE false END), "
            f"f AS (DELETE FROM {s}.freed f WHERE f.id IN (SELECT o.id FROM {s}.freed o "
            f"WHERE o.ns = $1 AND o.made < {s}.now_s() - 60 AND NOT EXISTS (SELECT 1 "
            f"FROM {s}.gates x WHERE x.ns = o.ns AND x.queue = o.queue AND x.gate = o.gate) "
            "LIMIT 10000 FOR UPDATE SKIP LOCKED)) "
            "SELECT 1"
        ),
        "cancels": f"SELECT id FROM {s}.jobs WHERE ns = $1 AND id = ANY ($2) "
        "AND state = 2 AND cancel_requested",
        "stats": (
            "SELECT queue, 'c' AS kind, state, count(*)::float8 AS v "
            f"FROM {s}.jobs WHERE ns = $1 AND queue = ANY ($2) GROUP BY queue, state "
            "UNION ALL "
            "SELECT queue, 'o', 0, min(CASE WHEN run_at > 0 THEN run_at ELSE enqueued_at END) "
            f"FROM {s}.jobs WHERE ns = $1 AND queue = ANY ($2) "
            f"AND (state = 0 OR (state = 1 AND run_at <= {s}.now_s())) GROUP BY queue "
            "UNION ALL "
            # Counted in trimmed and in the connections' parts (migration 16).
            "SELECT t.queue, 't', t.state, sum(t.n)::float8 FROM ("
            f"SELECT queue, state, n FROM {s}.trimmed WHERE ns = $1 AND queue = ANY ($2) "
            f"UNION ALL SELECT queue, state, n FROM {s}.trimmed_parts "
            "WHERE ns = $1 AND queue = ANY ($2)) t GROUP BY t.queue, t.state "
            f"UNION ALL SELECT '', 'n', 0, {s}.now_s()"
        ),
        # Event streams and job streams (.streams).
        "enable_events": f"INSERT INTO {s}.event_queues AS e (ns, queue, cap) "
        "VALUES ($1, $2, $3) ON CONFLICT (ns, queue) DO UPDATE SET cap = excluded.cap "
        "RETURNING e.n",
        "read_events": "SELECT seq, id, task, state, data, attempt, br_kind, br_message, "
        f"worker_id, finished_at FROM {s}.events WHERE ns = $1 AND queue = $2 AND seq > $3 "
        "ORDER BY seq LIMIT $4",
        "append_streams": f"SELECT {s}.stream_append($1, $2, $3, $4, $5, $6, $7, $8, $9, "
        "$10, $11, $12)",
        "read_stream": "SELECT e.pos, e.attempt, e.seq, e.data, e.fin "
        f"FROM {s}.streams s JOIN {s}.stream_entries e ON e.ns = s.ns AND e.job_id = s.job_id "
        f"WHERE s.ns = $1 AND s.job_id = $2 AND s.expires > {s}.now_s() AND e.pos > $3 "
        "ORDER BY e.pos LIMIT $4",
        "join_stream": f"INSERT INTO {s}.stream_readers AS r (ns, job_id, reader, until) "
        f"VALUES ($1, $2, $3, {s}.now_s() + $4) ON CONFLICT (ns, job_id, reader) "
        "DO UPDATE SET until = excluded.until",
        "leave_stream": f"DELETE FROM {s}.stream_readers WHERE ns = $1 AND job_id = $2 "
        "AND reader = $3",
        "sweep_streams": f"SELECT {s}.sweep_streams($1, $2)",
        # The schema registry (.schemas): $2.. the records' columns, in call order. Per
        # record whether it was kept now: the first of its pair in the call, when the
        # table had no row of it (the insert takes pairs in key order: two concurrent
        # calls lock their rows in one order).
        "record_schemas": (
            "WITH i AS (SELECT * FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) "
            "WITH ORDINALITY AS t (task, fp, inp, outp, ord)), "
            "f AS (SELECT DISTINCT ON (task, fp) * FROM i ORDER BY task, fp, ord), "
            f"n AS (INSERT INTO {s}.schemas (ns, task, fingerprint, input_schema, "
            f"output_schema, first_seen) SELECT $1, task, fp, inp, outp, {s}.now_s() FROM f "
            "ORDER BY task, fp ON CONFLICT DO NOTHING RETURNING task, fingerprint) "
            "SELECT n.task IS NOT NULL AS kept FROM i LEFT JOIN f ON f.ord = i.ord "
            "LEFT JOIN n ON n.task = f.task AND n.fingerprint = f.fp ORDER BY i.ord"
        ),
        "schema_records": "SELECT task, fingerprint, input_schema, output_schema, first_seen "
        f"FROM {s}.schemas WHERE ns = $1 ORDER BY task, first_seen, fingerprint",
        "forget_schemas": (
            "WITH i AS (SELECT * FROM unnest($2::text[], $3::text[]) "
            "WITH ORDINALITY AS t (task, fp, ord)), "
            "f AS (SELECT DISTINCT ON (task, fp) * FROM i ORDER BY task, fp, ord), "
            f"d AS (DELETE FROM {s}.schemas x USING f WHERE x.ns = $1 AND x.task = f.task "
            "AND x.fingerprint = f.fp RETURNING x.task, x.fingerprint) "
            "SELECT d.task IS NOT NULL AS gone FROM i LEFT JOIN f ON f.ord = i.ord "
            "LEFT JOIN d ON d.task = f.task AND d.fingerprint = f.fp ORDER BY i.ord"
        ),
    }
    page = {state: page_statement(s, state) for state in JobState}
    listing = {
        state: f"SELECT id FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = $3 "
        f"ORDER BY {_LIST_ORDER.get(state, 'seq DESC')} OFFSET $4 LIMIT $5"
        for state in JobState
    }
    return sql, page, listing


def _str_len(b: str, o: str) -> tuple[str, str]:
    """The header length and the length of the msgpack str or bin whose first byte,
    ``b``, is at offset ``o`` of ``m`` (fixstr, str/bin 8, 16, 32)."""
    head = (
        f"CASE WHEN {b} BETWEEN 160 AND 191 THEN 1 WHEN {b} IN (196, 217) THEN 2 "
        f"WHEN {b} IN (197, 218) THEN 3 ELSE 5 END"
    )
    size = (
        f"CASE WHEN {b} BETWEEN 160 AND 191 THEN {b} - 160 "
        f"WHEN {b} IN (196, 217) THEN get_byte(m, {o} + 1) "
        f"WHEN {b} IN (197, 218) THEN get_byte(m, {o} + 1) * 256 + get_byte(m, {o} + 2) "
        f"ELSE get_byte(m, {o} + 1) * 16777216 + get_byte(m, {o} + 2) * 65536 "
        f"+ get_byte(m, {o} + 3) * 256 + get_byte(m, {o} + 4) END"
    )
    return head, size


#: The page of each state (``page_jobs``' order and cursor place, $3..$5; $6 the size:
#: ``$6 + 1`` rows are read, the one after the page tells a page follows), written so
#: an index gives it in order from the cursor on, not a sort of the whole state: waiting
#: jobs from ``jobs_waiting`` (the cursor's priority level after its seq, then the lower
#: levels: $7 the cursor's priority), scheduled ones from ``jobs_scheduled_order`` and
#: active ones from ``jobs_active_order`` (migration 12; the row comparison on the
#: index's columns starts the scan at the cursor, however many jobs tie on its time),
#: final ones backwards on ``jobs_queue_state`` ($7 the cursor's seq). ``seq`` is unique
#: (each is a ``nextval`` of ``job_seq``), so ordering by it orders by ``(seq, id)`` as
#: the place does, and the index needs no sort by id after it. The state is written in
#: each state's statement (not a parameter): the statement's generic plan, once the
#: prepared statement has one, may use the state's partial index as its custom plans do.
_PAGES = {
    JobState.WAITING: (
        "(SELECT {cols} FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = {code} "
        "AND priority = $7::bigint AND seq >= $4 AND (seq, id) > ($4, $5) "
        "ORDER BY priority DESC, seq LIMIT $6 + 1) "
        "UNION ALL (SELECT {cols} FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = {code} "
        "AND priority < $7::bigint ORDER BY priority DESC, seq LIMIT $6 + 1)"
    ),
    JobState.SCHEDULED: (
        "SELECT {cols} FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = {code} "
        "AND (run_at, seq) >= ($3, $4) AND (run_at, seq, id) > ($3, $4, $5) "
        "ORDER BY run_at, seq LIMIT $6 + 1"
    ),
    JobState.ACTIVE: (
        "SELECT {cols} FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = {code} "
        "AND (started_at, seq) >= ($3, $4) AND (started_at, seq, id) > ($3, $4, $5) "
        "ORDER BY started_at, seq LIMIT $6 + 1"
    ),
    **{
        state: (
            "SELECT {cols} FROM {s}.jobs WHERE ns = $1 AND queue = $2 AND state = {code} "
            "AND seq <= $7::bigint AND ((-seq)::float8, 0::bigint, id) > ($3, $4, $5) "
            "ORDER BY seq DESC LIMIT $6 + 1"
        )
        for state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
    },
}

#: The states whose page and counting statements take $7 (the cursor's priority or seq).
BOUND_BY_INTEGER = frozenset(
    {JobState.WAITING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED}
)


def page_statement(s: str, state: JobState) -> str:
    """``page_jobs``' statement of ``state`` in the quoted schema ``s`` (parameters as
    :func:`page_args`): the ids and places of the page and of the job after it. The
    waiting page's two branches (the cursor's level, the lower ones) are put in order
    again: at most twice the page's rows, a sort that does not grow with the state; the
    place compared again there is what the branches' bounds already keep (and types $3)."""
    a, b = _PLACES[state]
    cols = f"id, ({a})::float8 AS a, ({b})::bigint AS b"
    page = _PAGES[state].format(cols=cols, s=s, code=CODE[state])
    if state is not JobState.WAITING:
        return page
    return (
        f"SELECT id, a, b FROM ({page}) p WHERE (a, b, id) > ($3, $4, $5) "
        "ORDER BY a, b, id LIMIT $6 + 1"
    )


def page_args(state: JobState, cursor: str | None, limit: int) -> list[float | int | str]:
    """The parameters $3.. of ``state``'s page (:func:`page_statement`) or count
    (:func:`count_statements`) statement: the place after which the page starts
    (``cursor``'s, or before all), the page's size, and in :data:`BOUND_BY_INTEGER`'s
    states the integer bound the index compares."""
    letter = CURSOR_LETTERS[state]
    after = (-math.inf, 0, "") if cursor is None else cursor_place(cursor, letter)
    a, b = float(after[0]), int(after[1]) if cursor is not None else -(2**62)
    if state is JobState.WAITING and not a.is_integer():
        b = 2**62  # between two priorities: none of the cursor's level follows it
    args: list[float | int | str] = [a, b, after[2], limit]
    if state in BOUND_BY_INTEGER:
        # The cursor's priority (waiting) or seq (final), whose negation is its
        # place's first part, as an integer the index compares (rounded up: the
        # jobs below a place's priority are those below this integer).
        bound = math.ceil(-after[0]) if cursor is not None else 2**62
        args.append(max(-(2**62), min(2**62, bound)))
    return args


def count_statements(schema: str) -> dict[JobState, str]:
    """``count_fingerprints``' statement of each state for ``schema``: the page
    ``page_jobs`` would answer ($1 ns, $2 queue, $3..$5 the place after which it
    starts, $6 the page's size; $7 in :data:`BOUND_BY_INTEGER`'s states, the
    cursor's priority or seq as an integer, for the index), its jobs counted by task and
    fingerprint where they are stored.

    Rows: one per ``(task, fingerprint)`` with its jobs (``n``), and, when a job follows
    the page, one with the place of the page's last job (``a``, ``b``, ``id``; task
    NULL). The task and fingerprint are read from the stored message, a msgpack array
    as :data:`.rows.encode` writes a JobMessage (id, task, queue, payload, fingerprint,
    ...): no column holds the fingerprint, and the message never leaves the database.
    The message is walked one element a step, each step a materialized CTE holding the
    offset ``o`` of an element and its first byte ``b`` (inlined, each offset's
    expression would be copied into the next one's several times over)."""
    s = f'"{schema}"'
    array = (
        "CASE WHEN get_byte(m, 0) BETWEEN 144 AND 159 THEN 1 "
        "WHEN get_byte(m, 0) = 220 THEN 3 ELSE 5 END"
    )
    head, size = _str_len("b", "o")
    after = f"o + {head} + {size}"
    text = f"convert_from(substring(m FROM o + {head} + 1 FOR {size}), 'UTF8')"
    # e0: the id; e1: the task; e2: the queue (the task taken); e3: the payload; e4:
    # the fingerprint.
    steps = [
        f"e0 AS MATERIALIZED (SELECT m, {array} AS o, get_byte(m, {array}) AS b "
        "FROM r WHERE k <= $6)"
    ]
    for k in range(1, 5):
        task = {1: "", 2: f"{text} AS task, "}.get(k, "task, ")
        steps.append(
            f"e{k} AS MATERIALIZED (SELECT m, {task}{after} AS o, get_byte(m, {after}) AS b "
            f"FROM e{k - 1})"
        )
    out = {}
    for state, (a, b) in _PLACES.items():
        cols = f"id, ({a})::float8 AS a, ({b})::bigint AS b, message AS m"
        page = _PAGES[state].format(cols=cols, s=s, code=CODE[state])
        out[state] = (
            f"WITH p AS MATERIALIZED ({page}), "
            "r AS MATERIALIZED (SELECT p.*, row_number() OVER (ORDER BY a, b, id) AS k "
            f"FROM p), {', '.join(steps)} "
            f"SELECT task, {text} AS fp, count(*) AS n, "
            "NULL::float8 AS a, NULL::bigint AS b, NULL::text AS id FROM e4 GROUP BY 1, 2 "
            # ($3 is typed here too: the waiting page compares no float with it.)
            "UNION ALL SELECT NULL, NULL, 0, a, b, id FROM r WHERE k = $6 "
            "AND $3::float8 IS NOT NULL AND EXISTS (SELECT 1 FROM r WHERE k = $6 + 1)"
        )
    return out
