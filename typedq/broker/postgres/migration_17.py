"""The PostgreSQL broker's migration 17: notifications only for those who wait (issue 30).
Released: never edited (a change is a new migration).

PostgreSQL serializes the commits of every transaction that called ``pg_notify``: at
commit, such a transaction takes one lock per database (the notify queue's,
``PreCommit_Notify``) and holds it until its commit record is flushed, so notifying
commits wait for each other's WAL flush one by one where other commits share one
(bench/results/pg-finished-counter.txt: 0.3-0.6 backends per sample waited there on the
end-to-end benchmark). Every enqueue notified its queue (``w:``) and every completion
its jobs (``f:``), whether anybody waited or not. Now:

- **A job's end is notified only when someone waits for it.** ``watch`` marks the job's
  row (``watched``), and ``wait_finished`` calls it before its first read of the job;
  ``complete`` and ``fail`` notify ``f:`` only for a watched job or one whose mark is
  unknown (NULL: any enqueue but ``enqueue_waking``, which marks its jobs unwatched, and
  every enqueue of an earlier version, whose waiters do not watch) (``RETURNING``, read
  with the row lock the finish holds). No wake-up is lost: ``watch`` updates the row, so
  a finish holding it makes ``watch`` wait for its commit, after which the job is final
  and ``watch`` skips it (the waiter's next read sees the end); a ``watch`` committed
  first is seen by the finish, which reads the row's newest version once it holds it.
  The other ends (cancel, recovery, remove, purge, flows' and runs' ends) notify as
  before: they are rare.

- **An enqueue notifies a queue only when a worker waits for its work.** A worker that
  is about to wait calls ``sleep_due`` (in place of the read of what is due it made
  before): it marks its queues in ``sleepers`` (``waiting``), then reads whether work is
  there or when it is due. ``enqueue_waking`` (the plain enqueue of this version; the
  transactional enqueue keeps ``enqueue``, which notifies always) clears the marks of its
  queues it finds set and notifies those (``wake``); a queue whose mark is clear gets no
  notification: its workers are busy, and read the queue themselves before they wait
  again. No wake-up is lost, by a transaction-level advisory lock per queue (the
  ``typedq-sleep`` class): ``wake`` holds it shared from before it reads the marks
  until its commit, and ``sleep_due`` takes it exclusive before it sets the mark and
  reads the queue. So either the enqueue held it first, and the worker's read waits
  for the enqueue's commit and sees its jobs; or the worker held it first, and the
  enqueue reads the marks after the worker's commit and sees the mark. Enqueues share
  the lock (they do not wait for each other); a worker going idle waits for the
  enqueues in flight to commit. Under another isolation than read committed (the
  server's default changed), ``wake`` notifies every queue as before: its reads would
  see a snapshot taken before the lock. (``sleep_due`` under such a default has the
  same snapshot problem, covered by the same rule: the enqueues of that server notify.)

Workers of an earlier version set no marks: an enqueue of this version does not wake
them (they claim at their 5 s fallback: latency, not loss). Upgrade workers before
producers, as on Redis. A process of an earlier version waiting for a job's end
(``job.result()``) does not watch the job: the jobs an earlier version enqueued (its
own, as a rolling deploy has them) keep a NULL mark and their ends are notified as
before; only a job this version's plain enqueue made and an earlier version's process
waits for (by its id) is woken at that waiter's timeout, not at its end.

``{s}`` is the broker's schema, quoted (:func:`typedq.broker.postgres.schema.migrate_sql`).
"""

from __future__ import annotations

from . import migration_2, migration_4, migration_6_changes
from .released import function_of

__all__ = ["SQL"]

TABLES = """-- A job someone waits for (wait_finished): its end is notified.
-- false: enqueued by this version's plain enqueue, unwatched; true: watched; NULL: by
-- another enqueue, or an earlier version's (whose waiters do not watch): notified.
ALTER TABLE {s}.jobs ADD COLUMN watched boolean;

-- A queue a worker waits for work of (sleep_due), until an enqueue notifies it (wake).
-- Unlogged: a worker's mark writes no WAL, so its commit does not wait for a flush
-- while it holds the queue's lock (enqueues wait for that commit). A crash empties the
-- table, and loses nothing: every connection is lost with it, and every worker whose
-- listener is remade wakes and claims (it marks its queues again before it waits).
CREATE UNLOGGED TABLE {s}.sleepers (
    ns text NOT NULL,
    queue text NOT NULL,
    waiting boolean NOT NULL,
    PRIMARY KEY (ns, queue)
);

-- A waiter's mark on a job not final yet (see the module). A finish holding the row
-- makes this wait for its commit; the job is final then and left alone.
CREATE FUNCTION {s}.watch(p_ns text, p_id text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    UPDATE {s}.jobs SET watched = true
    WHERE ns = p_ns AND id = p_id AND state < 3 AND watched IS NOT TRUE;
END $$;

-- The enqueue side: notify the queues a worker waits for, clearing their marks. The
-- shared lock is held from before the marks are read until the commit (see the module).
CREATE FUNCTION {s}.wake(p_ns text, p_queues text[], p_channel text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || u)
        FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('typedq-sleep:{s}'),
                                         hashtext(p_ns || ':' || u))
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u ORDER BY 1) d;
    -- One queue at a time, in order: two enqueues clearing the same marks lock their
    -- rows in one order (no deadlock). A mark another enqueue is clearing is waited for
    -- (its commit), then found clear: one notification per mark.
    FOR q IN SELECT DISTINCT u FROM unnest(p_queues) u ORDER BY 1 LOOP
        UPDATE {s}.sleepers w SET waiting = false
        WHERE w.ns = p_ns AND w.queue = q AND w.waiting;
        IF FOUND THEN
            PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || q);
        END IF;
    END LOOP;
END $$;

-- The worker side, before it waits: its queues marked, then whether a claim may find
-- work now (a waiting job no gate parked, a fair lane, a gate open, a slot freed for a
-- gate), else in how many seconds (a scheduled job due, a gate opening, a ghost's slot
-- ending; NULL: none): the statement the worker read before this migration.
-- The exclusive locks first (queue order, as wake's): held, no enqueue is between its
-- read of the marks and its commit, so the read below sees every job enqueued without
-- a notification.
CREATE FUNCTION {s}.sleep_due(p_ns text, p_queues text[])
RETURNS TABLE (ready boolean, due_in double precision) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('typedq-sleep:{s}'), hashtext(p_ns || ':' || u))
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u ORDER BY 1) d;
    -- Only a mark not set yet is written: a worker waiting again writes nothing.
    UPDATE {s}.sleepers w SET waiting = true
    WHERE w.ns = p_ns AND w.queue = ANY (p_queues) AND NOT w.waiting;
    INSERT INTO {s}.sleepers (ns, queue, waiting)
    SELECT p_ns, u, true FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d
    WHERE NOT EXISTS (SELECT 1 FROM {s}.sleepers x WHERE x.ns = p_ns AND x.queue = d.u)
    ORDER BY 2
    ON CONFLICT DO NOTHING;
    RETURN QUERY
    WITH g AS (SELECT min(x.opens_us) AS opens FROM {s}.gates x
               WHERE x.ns = p_ns AND x.queue = ANY (p_queues)),
    f AS (SELECT min(f.at_us) AS at FROM {s}.freed f JOIN {s}.gates x
          ON x.ns = f.ns AND x.queue = f.queue AND x.gate = f.gate
          WHERE f.ns = p_ns AND f.queue = ANY (p_queues)),
    n AS (SELECT {s}.now_s() AS s)
    SELECT EXISTS (SELECT 1 FROM {s}.jobs j WHERE j.ns = p_ns AND j.queue = ANY (p_queues)
                   AND j.state = 0 AND j.gate IS NULL)
           OR {s}.fair_lined(p_ns, p_queues)
           OR g.opens <= n.s * 1e6 OR f.at <= n.s * 1e6,
           least((SELECT min(j.run_at) FROM {s}.jobs j WHERE j.ns = p_ns
                  AND j.queue = ANY (p_queues) AND j.state = 1) - n.s,
                 g.opens / 1e6 - n.s, f.at / 1e6 - n.s)::float8
    FROM g, f, n;
END $$;

"""

#: enqueue (migration 4) waking only the workers that wait (``wake``).
_NOTIFY_QUEUES = """    PERFORM pg_notify(p_channel, 'w:' || p_ns || ':' || u)
    FROM (SELECT DISTINCT u FROM unnest(p_queues) u) d;"""
_WAKE_QUEUES = """    PERFORM {s}.wake(p_ns, p_queues, p_channel);"""
#: ... and its jobs marked unwatched (false): their ends are notified once watched only.
_INSERT_COLUMNS = "task, rate_key, conc_key)"
_INSERT_COLUMNS_W = "task, rate_key, conc_key, watched)"
_INSERT_VALUES = "p_tasks[i], p_rate_keys[i], p_conc_keys[i])"
_INSERT_VALUES_W = "p_tasks[i], p_rate_keys[i], p_conc_keys[i], false)"

#: complete (migration 2): ``f:`` only for a watched job.
_COMPLETE_DECLARE = """    q text;
    rq text[] := '{{}}';"""
_COMPLETE_DECLARE_W = """    q text;
    w boolean;
    rq text[] := '{{}}';"""
_COMPLETE_RETURNING = "RETURNING queue INTO q;"
_COMPLETE_RETURNING_W = "RETURNING queue, watched INTO q, w;"
_COMPLETE_NOTIFY = """            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE"""
_COMPLETE_NOTIFY_W = """            IF w IS NOT FALSE THEN
                PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
            END IF;
        ELSE"""

#: fail (migration 6): ``f:`` only for a watched job.
_FAIL_READ = "SELECT x.cancel_requested, x.errors, x.queue, x.flow_id INTO j"
_FAIL_READ_W = "SELECT x.cancel_requested, x.errors, x.queue, x.flow_id, x.watched INTO j"
_FAIL_NOTIFY = """            PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
        ELSE"""
_FAIL_NOTIFY_W = """            IF j.watched IS NOT FALSE THEN
                PERFORM pg_notify(p_channel, 'f:' || p_ns || ':' || p_ids[i]);
            END IF;
        ELSE"""

_ENQUEUE = function_of(
    migration_4.SQL,
    "CREATE FUNCTION {s}.enqueue(",
    (
        (_NOTIFY_QUEUES, _WAKE_QUEUES),
        (_INSERT_COLUMNS, _INSERT_COLUMNS_W),
        (_INSERT_VALUES, _INSERT_VALUES_W),
    ),
    "Migration 4's enqueue as enqueue_waking: only the queues a worker waits for are "
    "notified (wake); its jobs' ends only once watched.",
).replace("CREATE OR REPLACE FUNCTION {s}.enqueue(", "CREATE FUNCTION {s}.enqueue_waking(", 1)

SQL = (
    TABLES
    + _ENQUEUE
    + function_of(
        migration_2.SQL,
        "CREATE OR REPLACE FUNCTION {s}.complete(",
        (
            (_COMPLETE_DECLARE, _COMPLETE_DECLARE_W),
            (_COMPLETE_RETURNING, _COMPLETE_RETURNING_W),
            (_COMPLETE_NOTIFY, _COMPLETE_NOTIFY_W),
        ),
        "Migration 2's complete; a job's end notified only when it is watched.",
    )
    + function_of(
        migration_6_changes.SQL,
        "CREATE FUNCTION {s}.fail(",
        ((_FAIL_READ, _FAIL_READ_W), (_FAIL_NOTIFY, _FAIL_NOTIFY_W)),
        "Migration 6's fail; a job's end notified only when it is watched.",
    )
)
