"""Every Redis key and channel name of the Redis broker, built in one place.

All names of one app share the prefix ``typedq:{<namespace>}:``. The braces are a
Redis Cluster hash tag, so every key of an app lives in one slot and every Lua
script may touch any of them atomically. Names that go into keys (namespace, queue,
job id) are checked by :mod:`typedq.names` before they get here: none contains
braces, ``|``, glob characters or whitespace, and namespaces and queue names contain
no ``:``. A job id may contain ``:`` (key-derived ids are ``<task>:<key>``), but it
only ever ends a key after ``j:``, so two names still never share a key.

The layout (``P`` is the prefix)::

    P epoch               string   '<unix time>-<random>', written once (SET NX) when an
                                   app first connects; it vanishes or changes only when
                                   Redis loses its data (restart without persistence,
                                   FLUSHALL, failover to an empty replica)
    P seq                 string   order counter (FIFO among equal priorities)
    P active              zset     id -> lease deadline (µs, Redis clock)
    P done:c|done:f|done:x zset    id -> finished_at (µs): completed / failed / cancelled,
                                   for retention by age and count
    P j:<id>              string   a job no worker has claimed yet (waiting or scheduled
                                   since enqueue): the compact record below
                          hash     any other job (fields below); claim and cancel turn
                                   the string into the hash
    P q:<queue>:p         zset     priority levels that have waiting jobs (score -priority)
    P q:<queue>:w:<prio>  list     waiting ids of one level (LPUSH at the tail, RPOP
                                   the head); entries of jobs that left ``waiting``
                                   without being popped (cancel, remove) stay behind
    P q:<queue>:z         hash     '<prio>|<id>' -> number of such stale entries of the
                                   id in that level; whoever pops an entry with a count
                                   consumes one and skips it (a job's stale entries in
                                   a level always precede its live one), so a re-used
                                   id is claimed where a fresh job would be
    P q:<queue>:s         zset     scheduled ids -> run_at (µs)
    P q:<queue>:n         hash     state letter -> number of jobs (O(1) counts)
    P q:<queue>:h:<minute> hash    throughput rollup of one minute (minutes since the
                                   epoch, Redis clock): ``c`` completed, ``f`` failed for
                                   good, ``r`` retried; written once per queue per script
                                   call, expires 25 h after its last write (24 h shown)
    P workers             zset     worker registry: worker id -> heartbeat expiry (µs)
    P wk:<worker id>      string   a worker's msgpack WorkerInfo, expiring with its heartbeat
    P queues              set      queue registry: every queue a worker registered or a
                                   producer process enqueued to (SADD at its first enqueue)
    P f:<flow id>         hash     a running workflow (typedq/broker/flow.py): ``S`` steps,
                                   ``n`` members, ``c`` members not settled, ``col``
                                   collector, ``pol`` fan-in policy, per member ``d<i>``
                                   settled and ``r<i>`` its fan-in element, ``fi fst fe``
                                   the first failed member; deleted when the flow ends
    P schedules           hash     schedule name -> its state (typedq.schedule):
                                   'digest|last_tick|fired_at|fired|skipped|last_job';
                                   one field per declared schedule (pruned at start-up)
    P q:<queue>:G         zset     limit gates (typedq.limits) that parked waiting jobs
                                   -> when the gate opens (µs; +inf until a concurrency
                                   slot frees, 0 once one did); a gate is
                                   '<r|c>|<task>|<key>' (rate or concurrency)
    P q:<queue>:E         hash     the queue's event stream is on (typedq.events): ``cap``
                                   (about how many events it keeps) and ``n`` the number
                                   of the last event written; written by enable_events
    P q:<queue>:e         stream   the queue's events, entry id ``<n>-1``: ``i`` job id,
                                   ``k`` task, ``s`` final state letter, ``d`` result or
                                   failure record, ``a`` attempt; XADD MAXLEN ~ cap in
                                   the scripts' finalize (only while ``E`` exists)
    P q:<queue>:g:<gate>  list     the waiting jobs a gate parked, '<prio>|<id>', FIFO;
                                   still waiting (counted, cancellable), never claimed
                                   and put back: the claim skips past them
    P rl:<task>|<key>     zset     a rate bucket's starts in its window: '<id>@<µs>' ->
                                   start time (µs); expires ``per`` after its last start
    P cc:<task>|<key>     set      ids of the active jobs holding a concurrency slot
                                   (the job hash's ``ck`` names it)
    P r:<token>           string   a request record (60 s TTL) keyed by the token the
                                   client made for one call: a claim's token and ids,
                                   an enqueue's created flags ('0'/'1' per job), a
                                   cancel's answer; a re-sent script (lost reply,
                                   automatic retry) finds it and returns the first
                                   copy's answer

Channels: ``P ev:w`` (a queue got work: space-separated queue names), ``P ev:d``
(jobs reached a final state: space-separated ids), ``P ev:x`` (a running job was
asked to cancel: its id).

The job body (``m``): a msgpack array ``[task, payload, fingerprint, priority,
max_retries, timeout, eta, delay, rate_key, concurrency_key, scheduled_for, trace_context]`` with trailing
default values left out; the id (from the key) and the queue (from the record) complete it
into the JobMessage. Old
records that hold a whole encoded JobMessage are still read.

The job string (memory: one key, no hash, about 300 bytes for a 100-byte payload
instead of ~700 for a hash whose body is over ``hash-max-listpack-value``)::

    <state><queue>|<order>|<enqueued_at>|<priority>|<run_at>|<body>

``state`` is ``w`` or ``s``; ``priority`` is empty for 0 and ``run_at`` unless
scheduled. Every other field of a job string is absent (attempt 0, no stalls, ...).

Job hash fields: ``m`` body, ``q`` queue, ``p`` priority (absent = 0),
``s`` state letter (``w s a c f x``), ``o`` order, ``e`` enqueued_at, ``r`` run_at,
``a`` attempt, ``k`` stalls, ``ck`` the concurrency slot held, ``t`` lease token, ``d`` token of the last fenced
transition, ``st`` started_at, ``fa`` finished_at, ``w`` worker id, ``cr`` cancel
requested, ``res`` result, ``err`` FailureRecord, ``eh`` every failed attempt's
FailureRecord (a msgpack array of their bytes, the last 10; absent on jobs stored before
it), ``pg`` progress. Times are
integer microseconds of the Redis clock. A job of a workflow (always a hash) adds ``fl``
flow id, ``fm`` member index or ``fs`` step index, while held ``mh``/``mt`` (its body
around the payload), and on the flow's own job ``fS``/``fn`` (the flow's shape).

The Lua scripts derive per-job and per-queue names from the prefix with the helper
functions of ``lua/common.lua``, which mirror this module; a test checks that both
agree.
"""

from __future__ import annotations

__all__ = ["STATE_LETTERS", "Keys"]

#: State letters stored in the job hash and the counts hash, by JobState value.
STATE_LETTERS = {
    "waiting": "w",
    "scheduled": "s",
    "active": "a",
    "completed": "c",
    "failed": "f",
    "cancelled": "x",
}


class Keys:
    """The names of one app's keys and channels.

    :param namespace: the app name (already checked against the name grammar)
    """

    __slots__ = (
        "active",
        "cancel_channel",
        "done_cancelled",
        "done_channel",
        "done_completed",
        "done_failed",
        "epoch",
        "prefix",
        "queues",
        "schedules",
        "seq",
        "work_channel",
        "workers",
    )

    def __init__(self, namespace: str) -> None:
        self.prefix = f"typedq:{{{namespace}}}:"
        p = self.prefix
        self.epoch = p + "epoch"
        self.seq = p + "seq"
        self.schedules = p + "schedules"
        self.active = p + "active"
        self.done_completed = p + "done:c"
        self.done_failed = p + "done:f"
        self.done_cancelled = p + "done:x"
        self.work_channel = p + "ev:w"
        self.done_channel = p + "ev:d"
        self.cancel_channel = p + "ev:x"
        self.workers = p + "workers"
        self.queues = p + "queues"

    def job(self, job_id: str) -> str:
        """The key of one job (a string until the job is claimed or cancelled, then a hash)."""
        return f"{self.prefix}j:{job_id}"

    def levels(self, queue: str) -> str:
        """The zset of priority levels that have waiting jobs in ``queue``."""
        return f"{self.prefix}q:{queue}:p"

    def waiting(self, queue: str, priority: int) -> str:
        """The list of waiting job ids of one priority level of ``queue``."""
        return f"{self.prefix}q:{queue}:w:{priority}"

    def scheduled(self, queue: str) -> str:
        """The zset of scheduled job ids of ``queue`` by run time."""
        return f"{self.prefix}q:{queue}:s"

    def counts(self, queue: str) -> str:
        """The hash of job counts per state of ``queue``."""
        return f"{self.prefix}q:{queue}:n"

    def minute(self, queue: str, minute: int) -> str:
        """The throughput rollup hash of ``queue`` for one minute (minutes since the epoch)."""
        return f"{self.prefix}q:{queue}:h:{minute}"

    def stale(self, queue: str) -> str:
        """The hash counting stale waiting entries of ``queue`` by ``'<prio>|<id>'``."""
        return f"{self.prefix}q:{queue}:z"

    def flow(self, flow_id: str) -> str:
        """The record of a running workflow (its counter and fan-in results)."""
        return f"{self.prefix}f:{flow_id}"

    def gates(self, queue: str) -> str:
        """The zset of ``queue``'s limit gates that parked jobs, by opening time."""
        return f"{self.prefix}q:{queue}:G"

    def gate(self, queue: str, gate: str) -> str:
        """The list of waiting jobs one limit gate of ``queue`` parked."""
        return f"{self.prefix}q:{queue}:g:{gate}"

    def events(self, queue: str) -> str:
        """The capped stream of ``queue``'s events (typedq.events)."""
        return f"{self.prefix}q:{queue}:e"

    def events_config(self, queue: str) -> str:
        """The hash that turns ``queue``'s event stream on: its cap and last event number."""
        return f"{self.prefix}q:{queue}:E"

    def rate(self, task: str, key: str) -> str:
        """A rate bucket's start times within its window (sliding-window log)."""
        return f"{self.prefix}rl:{task}|{key}"

    def slots(self, task: str, key: str) -> str:
        """The set of active job ids holding a concurrency slot of one bucket."""
        return f"{self.prefix}cc:{task}|{key}"

    def request(self, token: str) -> str:
        """The record of one call (claim, enqueue, cancel) under its client-made token:
        a re-sent script returns the answer it holds instead of acting again."""
        return f"{self.prefix}r:{token}"

    def worker(self, worker_id: str) -> str:
        """The key of one worker's registry entry."""
        return f"{self.prefix}wk:{worker_id}"
