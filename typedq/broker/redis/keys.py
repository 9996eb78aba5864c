"""Every Redis key and channel name of the Redis broker, built in one place.

Every key of one queue shares the prefix ``tq:{<namespace>:<queue>}``; the braces are
a Redis Cluster hash tag, so all keys of a queue live in one slot (every Lua script that
works on one queue may touch any of them atomically) and different queues land on
different slots, so on Redis Cluster they spread over the shards. The few app-wide keys
(registries, schedules, the app's epoch) share ``typedq:{<namespace>}:``; none is on a
job's path. Names that go into keys (namespace, queue, job id) are checked by
:mod:`typedq.names` before they get here: none contains braces, ``|``, glob characters
or whitespace, and namespaces and queue names contain no ``:`` (so ``{<ns>:<queue>}``
never equals another app's or queue's tag). A job id may contain ``:`` (key-derived ids
are ``<task>:<key>``), but it only ever ends a key right after the tag's ``}`` and starts
with a letter or digit, so two names still never share a key. Per-queue keys start with
``tq:`` (not ``typedq:``): a job key is there once per job, and its length is memory.

A job is found through its queue: a job id is unique *per queue* (enqueue deduplicates
by id within the job's queue; two queues may hold jobs of the same id, and key-derived
ids ``<task>:<key>`` are unique per task, whose jobs go to its queue). Callers that know
the queue (job handles, the worker) pass it; without it (``typedq inspect --job ID``)
the broker looks in every queue of the queue registry.

The per-queue layout (``Q`` is ``tq:{<namespace>:<queue>}:``; a job's key is the tag and
its id, ``tq:{<namespace>:<queue>}<id>``, short because there is one per job: a job id
starts with a letter or digit, so it never equals another key's ``:<suffix>``)::

    Q e                   string   the queue's epoch '<unix time>-<random>', written once
                                   (SET NX) when a process first uses the queue; it
                                   vanishes or changes only when the shard holding the
                                   queue loses its data (see below)
    Q o                   string   order counter (FIFO among equal priorities)
    Q a                   zset     active ids -> lease deadline (µs, Redis clock)
    Q d:c|d:f|d:x         zset     id -> finished_at (µs): completed / failed / cancelled,
                                   for retention by age and count (per queue)
    J <id>                string   a scheduled job no worker has claimed yet, or a
                                   waiting one a limit gate parked: the compact record
                                   below (waiting: also what previous versions wrote)
                          hash     any other job (fields below); claim and cancel turn
                                   the string into the hash
                          (none)   a waiting entry job: a job enqueued waiting (or a
                                   scheduled job string once due) until it is claimed,
                                   cancelled or parked; its list entry holds it
    Q p                   zset     priority levels that have waiting jobs (score -priority)
    Q w:<prio>            list     the waiting jobs of one level (LPUSH at the tail,
                                   RPOP the head): a waiting entry
                                   '<id>|<order>|<enqueued_at>|<run_at>|<body>' (run_at
                                   empty unless it was scheduled: its due time) for a
                                   job with no key, a bare id for
                                   a job with a key (``J``); an id holds no '|'.
                                   Entries of jobs that left ``waiting`` without being
                                   popped stay behind: bare ids, and '|' for a removed
                                   entry (cancel, remove overwrite it in place)
    Q i:<n>               hash     the waiting index, ``n`` = the first 16 bits of the
                                   SHA1 of the id mod 8192 (:meth:`Keys.index`): id ->
                                   '<order>' ('<order>|<prio>' off level 0) of each
                                   waiting entry job; an entry is live while its order
                                   and level are the index's, so stale entries of entry
                                   jobs need no count. 8192 buckets of tiny fields stay
                                   listpacks (``hash-max-listpack-entries`` 512) up to
                                   ~3.5 M waiting jobs per queue
    Q z                   hash     '<prio>|<id>' -> number of stale bare entries of the
                                   id in that level; whoever pops an entry with a count
                                   consumes one and skips it (a job's stale entries in
                                   a level always precede its live one), so a re-used
                                   id is claimed where a fresh job would be
    Q s                   zset     scheduled ids -> run_at (µs)
    Q n                   hash     state letter -> number of jobs (O(1) counts)
    Q h:<minute>          hash     throughput rollup of one minute (minutes since the
                                   epoch, Redis clock): ``c`` completed, ``f`` failed for
                                   good, ``r`` retried; written once per queue per script
                                   call, expires 25 h after its first write (24 h shown)
    Q E                   hash     the queue's event stream is on (typedq.events) while it
                                   has ``cap`` (about how many events it keeps); ``n`` the
                                   number of the last event written; written by
                                   enable_events. ``u`` '1': some job of the queue held a
                                   unique key (read with ``cap``, so finalize pays nothing
                                   more to know it)
    Q ev                  stream   the queue's events, entry id ``<n>-1``: ``i`` job id,
                                   ``k`` task, ``s`` final state letter, ``d`` result or
                                   failure record, ``a`` attempt; XADD MAXLEN ~ cap in
                                   the scripts' finalize (only while ``E`` exists)
    Q js:<id>             stream   the job's stream (typedq.streams, ``emits=``): the
                                   items its current run emitted, entry fields ``a``
                                   attempt, ``n`` number in the run, ``d`` the item; then
                                   the end entry (``e`` the final state letter, no
                                   ``d``), written after the job is final. XADD MAXLEN ~
                                   STREAM_MAX (10,000) by stream_append.lua, fenced by the
                                   run's token; a run's first append empties it (XTRIM
                                   MAXLEN 0, keeping the last id). Expires STREAM_LIVE_TTL
                                   (a day) after each append while the job runs, and the
                                   retention TTL of its final state after the end entry
    Q jr:<id>             zset     the readers of the job's stream (``job.stream()``):
                                   member a reader's id, score (ms, the Redis clock)
                                   when it stops counting unless it reads again
                                   (READER_TTL after its read's wait); written by
                                   stream_reader.lua every few seconds of a reader's
                                   reads and when it leaves, never by the emit path;
                                   read by flow_keys.lua (ZCOUNT). Expires with its last
                                   member
    Q f:<flow id>         hash     a running workflow (typedq/broker/flow.py), on the
                                   queue of the flow's own job: ``S`` steps, ``n``
                                   members, ``c`` members not settled, ``col`` collector,
                                   ``pol`` fan-in policy, ``mq``/``sq`` the members' and
                                   steps' queues (space-separated; one name when all
                                   share it), per member ``d<i>`` settled and ``r<i>``
                                   its fan-in element, ``fi fst fe`` the first failed
                                   member; deleted when the flow ends; ``x`` '1' in a
                                   flow across slots (Redis Cluster, see below); ``g go
                                   gp ge`` while a large fan-out's staged members are
                                   being released (staging.py): how many are released,
                                   the order number before member 0's, their priority,
                                   the flow's enqueue time; ``E Ee Ec Eo Et`` while the
                                   flow's end is under way, a chunk of jobs per script
                                   (lua/common/flow_settle.lua's flow_end)
    Q fE:<flow id>        hash     on a queue of a flow across slots but its root's: the
                                   flow's end under way there (``E Ee Ec Eo Et S n mq
                                   sq``, as the record's), which that slot's claims read
    Q fg:<flow id>        hash     a large fan-out's staged members (staging.py), on the
                                   members' queue: member index -> body; nothing reads
                                   it but the release (flow_open.lua, recover.lua), which
                                   deletes each member's field as it releases it;
                                   expires (PEXPIRE, ten minutes) until its flow is
                                   stored (flow_enqueue.lua PERSISTs it then)
    Q fR                  zset     the queue's large fan-outs whose release is under way:
                                   '<queue of the flow's own job>|<flow id>' -> when the
                                   release last made a step (µs); the reaper pass
                                   (recover.lua) releases a chunk of one that made none
                                   for 5 s
    Q ho                  zset     the queue's outbox (flows across slots): entry id ->
                                   when it was written (µs); an entry is a hand-off that
                                   a script on this slot made to a job or flow record on
                                   another queue, applied there by a second call
                                   (flow_apply), then deleted; the reaper pass applies
                                   the entries left behind. An entry id is the settling
                                   job's id and the kind (``<id>|m``, ``<id>|r``,
                                   ``<flow>|e|<queue>`` ...)
    Q ho:<entry id>       string   one outbox entry: '<target queue>|<record>', the record
                                   a msgpack array (see lua/common/flows.lua)
    Q P                   hash     the jobs a limit gate holds parked now: id -> its
                                   gate (a gate's list keeps stale entries too: this
                                   tells the live one, for listings)
    Q G                   zset     limit gates (typedq.limits) that parked waiting jobs
                                   -> when the gate opens (µs; +inf until a concurrency
                                   slot frees, 0 once one did); a gate is
                                   '<r|c>|<task>|<key>' (rate or concurrency)
    Q fk:<task>|<key>:<prio>
                          list     fair shares (typedq.fair): the waiting jobs of one
                                   fair key at one level, bare ids (a fair job waits as
                                   a job string, ``J``), LPUSH at the tail, RPOP the
                                   head. While it has jobs, the level list ``Q w:<prio>``
                                   holds one marker for it, '~<taken>|<weight>|<task>|
                                   <key>': a claim popping it takes up to ``weight`` jobs
                                   of the lane (``taken`` of them so far, when a claim
                                   ran out of room mid-turn: then the marker goes back
                                   at the head) and pushes it back at the tail while the
                                   lane has jobs. A retried, handed-back or unparked
                                   fair job goes back to its lane (the job hash's
                                   ``fk``, or its 16-field body: lanes.lua fair_of); one
                                   pushed to a level list as a bare id (claimed before
                                   ``fk`` existed) moves to its lane when the claim pops
                                   it
    Q F                   hash     the fair lanes that have jobs, '<prio>|<task>|<key>'
                                   -> the weight of the key's next turn, its newest
                                   job's (listing and purge find the lanes here); a
                                   field goes with its lane
    Q FC                  set      the lanes of ``Q F`` whose weight a new job changed
                                   since their marker was written: a claim starting the
                                   key's turn takes the weight from ``Q F`` (one EXISTS
                                   per claim while this is empty); a lane leaves it then,
                                   or when it goes
    Q g:<gate>            list     the waiting jobs a gate parked, '<prio>|<id>', FIFO;
                                   still waiting (counted, cancellable), never claimed
                                   and put back: the claim skips past them
    Q rl:<task>|<key>     zset     a rate bucket's starts in its window: '<id>@<µs>' ->
                                   its turn (µs; spaced starts, up to ``early`` ahead);
                                   expires ``per + early`` after its last start.
                                   Limits hold per task and queue (a task's jobs go to
                                   its queue)
    Q cc:<task>|<key>     set      ids of the active jobs holding a concurrency slot
                                   (the job hash's ``ck`` names it), and '~<id>' ghosts
                                   of active jobs an operator deleted
    Q cc:<task>|<key>:g   zset     those ghosts -> when their lease would have ended
                                   (µs); a claim counting the slot drops ended ones
    Q uk:<task>|<key>     string   a unique key's marker (typedq.flowcontrol): the id of
                                   the job holding the key; no TTL while that job is not
                                   final, PEXPIRE its window once it completed (finalize:
                                   common/finish.lua release_unique); deleted when it
                                   failed or was cancelled. A marker without a TTL whose
                                   job is gone (removed, purged) is stale: replaced
    Q uj:<id>             string   the unique key job ``id`` holds, '<window ms>|<task>|<key>',
                                   until it finishes; finalize reads it only in queues
                                   whose ``E`` hash has ``u`` '1' (set by the first unique
                                   enqueue): no cost to queues without unique tasks
    Q db:<task>|<key>     string   a debounce key's marker: the id of the job collecting
                                   the key's enqueues while it is a scheduled job string
                                   not due yet; expires a second after the job's latest
                                   run time (max_wait after its first enqueue)
    Q W                   string   the waiter mark '1': a claim of the queue came up
                                   short (took fewer jobs than asked for), so its worker
                                   is about to wait for work; the next call that gives
                                   the queue work deletes it and publishes the work
                                   notice (no mark: no notice, nobody waits). No TTL: a
                                   mark that expired under a waiter would lose its
                                   wake-up; one key per queue that ever waited
    Q H                   hash     direct hand-off (broker/redis/direct.py): the
                                   registrations of idle workers of the queue,
                                   registration token -> its home queue; expires with
                                   the last registration (10 s unless renewed)
    Q I:<token>           list     a registration's inbox (on its home queue, the
                                   first of its worker's queues): jobs handed to it,
                                   '<id>|<token>|<enqueued_at>|<queue>|<body>', or ''
                                   (ended: work was stored); ``:c`` string
                                   '<slots>|<lease_us>|<ttl_ms>|<worker>' while it
                                   takes jobs, ``:h`` list '<queue>|<id>' of the jobs
                                   handed to it; all expire with the registration
    Q u:<run id>          hash     a durable run (typedq/broker/runs.py), on the run's
                                   queue (a partitioned durable task's: the partition of
                                   the run id): ``sp`` its RunSpec (msgpack), ``tb`` the
                                   body of its turn jobs, ``st`` state letter (``r``
                                   running, ``c f x``), ``ca``/``fa`` created/finished
                                   (µs), ``res``/``err`` result or FailureRecord, ``wj``
                                   the jobs it waits on (space-separated), ``ws`` the
                                   signal it waits for, ``wa`` its timer (µs), ``n``
                                   turns enqueued (turn ``<run id>:t<n>``), ``t`` the
                                   last immediate turn's id (no second one while it
                                   waits)
    Q ul:<run id>         list     its log: encoded entries, oldest first (compare-and-
                                   append: LLEN is the length a writer expects)
    Q uo:<run id>         hash     its step jobs (``<run id>:<position>``) that ended:
                                   id -> state letter and the result (``c``) or
                                   FailureRecord (``f x``) until an append records it,
                                   then '' (the step has ended: a wait on it is over, a
                                   late hand-off is dropped); written by the script
                                   that finishes the step (a job whose body
                                   names the run's queue: ``run_queue``), through the
                                   outbox when the run is on another slot (Cluster)
    Q uS:<run id>         set      the signals that have an inbox
    Q us:<run id>|<sig>   list     one signal's inbox: payloads delivered and not taken
    Q ud:c|ud:f|ud:x      zset     finished runs of the queue -> finished_at (µs), for
                                   retention as finished jobs (completed: completed_ttl/
                                   completed_max, failed and cancelled: failed_*); an
                                   expired run reads as none, and is deleted by the next
                                   run to finish or the next read of it
    Q S                   hash     schedule name -> its firing state on Redis Cluster
                                   (as ``P schedules``): the schedules whose ticks go to
                                   this queue fire here, in the slot of their jobs, and
                                   the app-wide state follows it (typedq.schedule)
    Q r:<token>           string   a request record (60 s TTL) keyed by the token the
                                   client made for one call, on the slot the call ran
                                   on: a claim's token and '<queue>|<id>' lines, an
                                   enqueue's created flags ('0'/'1' per job), a cancel's
                                   answer; a re-sent script (lost reply, automatic
                                   retry) finds it and returns the first copy's answer

The app-wide layout (``P`` is ``typedq:{<namespace>}:``)::

    P epoch               string   the app's epoch (as ``Q e``), written at connect
    P workers             zset     worker registry: worker id -> heartbeat expiry (µs)
    P wk:<worker id>      string   a worker's msgpack WorkerInfo, expiring with its heartbeat
    P queues              set      queue registry: every queue a worker served or a
                                   producer enqueued to (added once per queue and process)
    P runs                hash     durable run id -> its queue (where its keys are);
                                   written by create_runs, an entry deleted with its run
    P schedules           hash     schedule name -> its state (typedq.schedule):
                                   'digest|last_tick|fired_at|fired|skipped|last_job';
                                   one field per declared schedule (pruned at start-up)
    P schemas             hash     schema registry (typedq verify): '<task>|<fingerprint>'
                                   -> '<first seen µs>|<msgpack [task, fingerprint,
                                   input schema, output schema]>'; written once per
                                   process and fingerprint (at connect), never pruned

Data loss: each shard may lose its data on its own (a failover to an empty replica).
The broker checks the app's epoch and the epoch of every queue it uses (at connect,
then at most every few seconds): a vanished or changed one means the slot holding it
lost its data, and is reported as :class:`~typedq.errors.RedisDataLost` naming that key.

Channels (not keys). Standalone Redis, app-wide (``PUBLISH``): ``P ev:w`` (a queue got
work while a worker waited for it, see ``Q W``: space-separated queue names), ``P ev:d`` (jobs reached a final state:
space-separated ids; a durable run whose log grew or that ended: ``~<run id>``), ``P ev:x`` (a running job was asked to cancel: its id). Redis
Cluster, per queue (sharded pub/sub, ``SPUBLISH``/``SSUBSCRIBE``): ``Q ev:w`` (the queue
got work while a worker waited: its name), ``Q ev:d`` (its jobs reached a final state: ids; and ``~<run id>`` as on ``P ev:d``), ``Q ev:x`` (one
of its running jobs was asked to cancel: its id); each carries the queue's hash tag, so
it lives on the shard that holds the queue and a notice reaches only that shard.

The job body (``m``): a msgpack array ``[task, payload, fingerprint, priority,
max_retries, timeout, eta, delay, rate_key, concurrency_key, scheduled_for,
trace_context]`` with trailing
default values left out; the id and the queue (from the key) complete it into the
JobMessage. Old records that hold a whole encoded JobMessage are still read.

Memory of a waiting job (docs/brokers.md has the figures): its waiting entry in the
level list (~200 bytes for a 100-byte payload) and ~37 bytes in a listpack bucket of the
index, instead of a key per job (~315 bytes as a job string, ~700 as a hash whose body is
over ``hash-max-listpack-value``). Reading a waiting entry job's body (``get``, cancel)
finds its entry by its order (interpolation, else binary search: O(log n) calls); its
state and dedup by id read the index only.

The job string (one key, no hash)::

    <state>|<order>|<enqueued_at>|<priority>|<run_at>|<body>

``state`` is ``w`` or ``s``; ``priority`` is empty for 0 and ``run_at`` unless the
job was scheduled (a promoted job keeps its due time, in its waiting entry too). Every
other field of a job string is absent (attempt 0, no stalls, ...). Waiting job strings
with a bare list entry (what versions before waiting entries wrote for every waiting
job) are still read and claimed. Records of the layout before carry the queue name
after the state letter (``<state><queue>|...``) and are still read.

Job hash fields: ``m`` body, ``q`` queue, ``p`` priority (absent = 0),
``s`` state letter (``w s a c f x``), ``o`` order, ``e`` enqueued_at, ``r`` run_at (the
due time of a scheduled job; kept once due, and set when the job is due again: a
retry, hand-back, stall recovery or workflow hand-off; its queue wait counts from it),
``a`` attempt, ``k`` stalls, ``ck`` the concurrency slot held, ``fk`` the fair key
(typedq.fair) of a job a claim took from its lane, '<weight>|<task>|<key>' (a retry
or hand-back puts it back into that lane), ``t`` lease token, ``d`` token of the last fenced
transition, ``st`` started_at, ``fa`` finished_at, ``w`` worker id, ``cr`` cancel
requested, ``res`` result, ``err`` FailureRecord, ``eh`` every failed attempt's
FailureRecord (a msgpack array of their bytes, the last 10; absent on jobs stored before
it), ``pg`` progress. Times are
integer microseconds of the Redis clock. A job of a workflow (always a hash) adds ``fl``
flow id, ``fq`` the queue of the flow's own job (where the flow record is), ``fm``
member index or ``fs`` step index, while held ``mh``/``mt`` (its body around the
payload), and on the flow's own job ``fS``/``fn`` (the flow's shape). In a flow across
slots (Redis Cluster) every job holds ``fx`` '1', each step also ``fS`` and ``fsq`` (the
steps' queues, to release the next step without the record), and a job stored before
its root (another queue than the flow's own job's) ``fp`` '1' until the root starts it.

The Lua scripts derive per-job and per-queue names with the helper functions of
``lua/common/keys.lua`` (``k_job(q, id)``, ``k_counts(q)``, ...), which mirror this module;
a test checks that both agree. Scripts get the app prefix as ``ARGV[1]`` and declare a
key of the slot they work on first in ``KEYS`` (Redis Cluster routes by it).

The previous layout (every key under ``P``, e.g. ``P j:<id>``, ``P q:<queue>:w:<prio>``,
``P active``, ``P seq``) is migrated at connect on standalone Redis
(:mod:`typedq.broker.redis.migrate`).
"""

from __future__ import annotations

import hashlib

__all__ = ["INDEX_BUCKETS", "STATE_LETTERS", "Keys", "index_bucket"]

#: Buckets of a queue's waiting index (``IDX_BUCKETS`` of lua/common/keys.lua).
INDEX_BUCKETS = 8192


def index_bucket(job_id: str) -> str:
    """The bucket of the waiting index that holds ``job_id`` (its number as text): the
    first 16 bits of the SHA1 of the id modulo :data:`INDEX_BUCKETS` (``idx_bucket`` of
    lua/common/keys.lua computes the same)."""
    digest = hashlib.sha1(job_id.encode(), usedforsecurity=False).digest()
    return str(((digest[0] << 8) | digest[1]) % INDEX_BUCKETS)


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
        "cancel_channel",
        "done_channel",
        "epoch",
        "namespace",
        "prefix",
        "queues",
        "runs",
        "schedules",
        "schemas",
        "work_channel",
        "workers",
    )

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        #: The app-wide prefix ``typedq:{<namespace>}:`` (``ARGV[1]`` of every script).
        self.prefix = f"typedq:{{{namespace}}}:"
        p = self.prefix
        self.epoch = p + "epoch"
        self.schedules = p + "schedules"
        self.schemas = p + "schemas"
        self.work_channel = p + "ev:w"
        self.done_channel = p + "ev:d"
        self.cancel_channel = p + "ev:x"
        self.workers = p + "workers"
        self.queues = p + "queues"
        #: Durable run id -> its queue.
        self.runs = p + "runs"

    def queue_prefix(self, queue: str) -> str:
        """The prefix of the keys of ``queue`` but its jobs': ``tq:{<namespace>:<queue>}:``."""
        return f"tq:{{{self.namespace}:{queue}}}:"

    def queue_epoch(self, queue: str) -> str:
        """The epoch of ``queue``'s slot (data-loss detection per shard)."""
        return self.queue_prefix(queue) + "e"

    def seq(self, queue: str) -> str:
        """The order counter of ``queue``."""
        return self.queue_prefix(queue) + "o"

    def active(self, queue: str) -> str:
        """The zset of ``queue``'s active job ids by lease deadline."""
        return self.queue_prefix(queue) + "a"

    def done(self, queue: str, letter: str) -> str:
        """The zset of ``queue``'s finished jobs of one final state (``c f x``)."""
        return f"{self.queue_prefix(queue)}d:{letter}"

    def job(self, queue: str, job_id: str) -> str:
        """The key of one job (a string until the job is claimed or cancelled, then a hash)."""
        return f"tq:{{{self.namespace}:{queue}}}{job_id}"

    def index(self, queue: str, job_id: str) -> str:
        """The bucket of ``queue``'s waiting index that holds ``job_id``: a small hash
        (a listpack) picked by the first 16 bits of the SHA1 of the id."""
        return f"{self.queue_prefix(queue)}i:{index_bucket(job_id)}"

    def levels(self, queue: str) -> str:
        """The zset of priority levels that have waiting jobs in ``queue``."""
        return self.queue_prefix(queue) + "p"

    def waiting(self, queue: str, priority: int) -> str:
        """The list of waiting job ids of one priority level of ``queue``."""
        return f"{self.queue_prefix(queue)}w:{priority}"

    def scheduled(self, queue: str) -> str:
        """The zset of scheduled job ids of ``queue`` by run time."""
        return self.queue_prefix(queue) + "s"

    def counts(self, queue: str) -> str:
        """The hash of job counts per state of ``queue``."""
        return self.queue_prefix(queue) + "n"

    def minute(self, queue: str, minute: int) -> str:
        """The throughput rollup hash of ``queue`` for one minute (minutes since the epoch)."""
        return f"{self.queue_prefix(queue)}h:{minute}"

    def stale(self, queue: str) -> str:
        """The hash counting stale waiting entries of ``queue`` by ``'<prio>|<id>'``."""
        return self.queue_prefix(queue) + "z"

    def flow(self, queue: str, flow_id: str) -> str:
        """The record of a running workflow, on the queue of the flow's own job."""
        return f"{self.queue_prefix(queue)}f:{flow_id}"

    def ending(self, queue: str, flow_id: str) -> str:
        """The end of a flow across slots under way on ``queue`` (not the flow's root)."""
        return f"{self.queue_prefix(queue)}fE:{flow_id}"

    def staged(self, queue: str, flow_id: str) -> str:
        """The staged members of a large fan-out (staging.py), on the members' queue."""
        return f"{self.queue_prefix(queue)}fg:{flow_id}"

    def releasing(self, queue: str) -> str:
        """The zset of ``queue``'s large fan-outs whose members are being released."""
        return self.queue_prefix(queue) + "fR"

    def gates(self, queue: str) -> str:
        """The zset of ``queue``'s limit gates that parked jobs, by opening time."""
        return self.queue_prefix(queue) + "G"

    def lane(self, queue: str, task: str, key: str, priority: int) -> str:
        """The waiting jobs of one fair key (typedq.fair) at one priority level."""
        return f"{self.queue_prefix(queue)}fk:{task}|{key}:{priority}"

    def lanes(self, queue: str) -> str:
        """The hash of ``queue``'s fair lanes that have jobs, ``'<prio>|<task>|<key>'`` ->
        the weight of the key's next turn (its newest job's)."""
        return self.queue_prefix(queue) + "F"

    def lanes_changed(self, queue: str) -> str:
        """The set of ``queue``'s fair lanes whose weight changed since their turn marker
        was written (the claim reads the new weight from :meth:`lanes` at the key's next
        turn)."""
        return self.queue_prefix(queue) + "FC"

    def gate(self, queue: str, gate: str) -> str:
        """The list of waiting jobs one limit gate of ``queue`` parked."""
        return f"{self.queue_prefix(queue)}g:{gate}"

    def events(self, queue: str) -> str:
        """The capped stream of ``queue``'s events (typedq.events)."""
        return self.queue_prefix(queue) + "ev"

    def job_stream(self, queue: str, job_id: str) -> str:
        """The stream of one job's emitted items (typedq.streams)."""
        return f"{self.queue_prefix(queue)}js:{job_id}"

    def job_readers(self, queue: str, job_id: str) -> str:
        """The readers of one job's stream (typedq.streams): reader id -> when it stops
        counting."""
        return f"{self.queue_prefix(queue)}jr:{job_id}"

    def events_config(self, queue: str) -> str:
        """The hash that turns ``queue``'s event stream on: its cap and last event number."""
        return self.queue_prefix(queue) + "E"

    def rate(self, queue: str, task: str, key: str) -> str:
        """A rate bucket's start times within its window (sliding-window log)."""
        return f"{self.queue_prefix(queue)}rl:{task}|{key}"

    def slots(self, queue: str, task: str, key: str) -> str:
        """The set of active job ids holding a concurrency slot of one bucket."""
        return f"{self.queue_prefix(queue)}cc:{task}|{key}"

    def unique(self, queue: str, marker: str) -> str:
        """A unique key's marker (``marker`` is ``<task>|<key>``): the id of the job that
        holds the key; it expires the job's window after the job completed."""
        return f"{self.queue_prefix(queue)}uk:{marker}"

    def unique_job(self, queue: str, job_id: str) -> str:
        """The unique key job ``job_id`` holds until it finishes: ``<window ms>|<marker>``."""
        return f"{self.queue_prefix(queue)}uj:{job_id}"

    def debounce(self, queue: str, marker: str) -> str:
        """A debounce key's marker: the id of the job collecting the key's enqueues."""
        return f"{self.queue_prefix(queue)}db:{marker}"

    def waiter(self, queue: str) -> str:
        """The waiter mark of ``queue``: set by a claim that came up short (a worker is
        about to wait), consumed by the next call giving the queue work, which then
        publishes the work notice."""
        return self.queue_prefix(queue) + "W"

    def handoffs(self, queue: str) -> str:
        """The hand-off registrations of ``queue``'s idle workers (see .direct)."""
        return self.queue_prefix(queue) + "H"

    def inbox(self, home: str, token: str) -> str:
        """The inbox of hand-off registration ``token``, on its home queue's slot."""
        return f"{self.queue_prefix(home)}I:{token}"

    def schedule_firing(self, queue: str) -> str:
        """The firing states (Redis Cluster) of the schedules whose ticks go to ``queue``:
        firing runs in the slot of the jobs it stores (schedule_fire.lua)."""
        return self.queue_prefix(queue) + "S"

    def request(self, queue: str, token: str) -> str:
        """The record of one call (claim, enqueue, cancel) under its client-made token,
        on the slot of ``queue``: a re-sent script returns the answer it holds instead
        of acting again."""
        return f"{self.queue_prefix(queue)}r:{token}"

    def queue_channel(self, queue: str, kind: str) -> str:
        """A sharded pub/sub channel of ``queue`` (Redis Cluster), in the queue's slot:
        ``kind`` ``w`` work, ``d`` finished jobs, ``x`` cancel requests."""
        return f"{self.queue_prefix(queue)}ev:{kind}"

    def outbox(self, queue: str) -> str:
        """The outbox of ``queue`` (flows across slots): entry id -> when it was written."""
        return self.queue_prefix(queue) + "ho"

    def handoff(self, queue: str, entry: str) -> str:
        """One entry of ``queue``'s outbox: its target queue and record."""
        return f"{self.queue_prefix(queue)}ho:{entry}"

    def run(self, queue: str, run_id: str) -> str:
        """The record of a durable run (a hash) on ``queue``."""
        return f"{self.queue_prefix(queue)}u:{run_id}"

    def run_log(self, queue: str, run_id: str) -> str:
        """The log of a durable run (a list of encoded entries)."""
        return f"{self.queue_prefix(queue)}ul:{run_id}"

    def run_outcomes(self, queue: str, run_id: str) -> str:
        """The kept outcomes of a durable run's ended steps not yet recorded."""
        return f"{self.queue_prefix(queue)}uo:{run_id}"

    def run_signals(self, queue: str, run_id: str) -> str:
        """The names of a durable run's signals that have an inbox (a set)."""
        return f"{self.queue_prefix(queue)}uS:{run_id}"

    def run_inbox(self, queue: str, run_id: str, signal: str) -> str:
        """One signal's inbox of a durable run (a list of payloads, oldest first)."""
        return f"{self.queue_prefix(queue)}us:{run_id}|{signal}"

    def runs_done(self, queue: str, letter: str) -> str:
        """The finished durable runs of ``queue`` in one final state (``c f x``)."""
        return f"{self.queue_prefix(queue)}ud:{letter}"

    def worker(self, worker_id: str) -> str:
        """The key of one worker's registry entry."""
        return f"{self.prefix}wk:{worker_id}"
