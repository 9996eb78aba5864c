"""Every Redis key and channel name of the Redis broker, built in one place.

All names of one app share the prefix ``typedq:{<namespace>}:``. The braces are a
Redis Cluster hash tag, so every key of an app lives in one slot and every Lua
script may touch any of them atomically. Names that go into keys (namespace, queue,
job id) are checked by :mod:`typedq.names` before they get here: none contains
``:``, braces, glob characters or whitespace, so two names never share a key.

The layout (``P`` is the prefix)::

    P seq                 string   order counter (FIFO among equal priorities)
    P active              zset     id -> lease deadline (µs, Redis clock)
    P done:c|done:f|done:x zset    id -> finished_at (µs): completed / failed / cancelled,
                                   for retention by age and count
    P j:<id>              hash     one job (fields below)
    P q:<queue>:p         zset     priority levels that have waiting jobs (score -priority)
    P q:<queue>:w:<prio>  list     waiting ids of one level (LPUSH at the tail, RPOP
                                   the head); entries of jobs that left ``waiting`` are
                                   skipped lazily
    P q:<queue>:s         zset     scheduled ids -> run_at (µs)
    P q:<queue>:n         hash     state letter -> number of jobs (O(1) counts)
    P claim:<worker>      string   the worker's last claim (token and ids, short TTL),
                                   so a re-sent claim returns the same jobs

Channels: ``P ev:w`` (a queue got work: space-separated queue names), ``P ev:d``
(jobs reached a final state: space-separated ids), ``P ev:x`` (a running job was
asked to cancel: its id).

Job hash fields: ``m`` encoded JobMessage, ``q`` queue, ``p`` priority (absent = 0),
``s`` state letter (``w s a c f x``), ``o`` order, ``e`` enqueued_at, ``r`` run_at,
``a`` attempt, ``k`` stalls, ``t`` lease token, ``d`` token of the last fenced
transition, ``st`` started_at, ``fa`` finished_at, ``w`` worker id, ``cr`` cancel
requested, ``res`` result, ``err`` FailureRecord, ``pg`` progress. Times are
integer microseconds of the Redis clock (compact in a listpack).

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
        "prefix",
        "seq",
        "work_channel",
    )

    def __init__(self, namespace: str) -> None:
        self.prefix = f"typedq:{{{namespace}}}:"
        p = self.prefix
        self.seq = p + "seq"
        self.active = p + "active"
        self.done_completed = p + "done:c"
        self.done_failed = p + "done:f"
        self.done_cancelled = p + "done:x"
        self.work_channel = p + "ev:w"
        self.done_channel = p + "ev:d"
        self.cancel_channel = p + "ev:x"

    def job(self, job_id: str) -> str:
        """The hash of one job."""
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

    def claim(self, worker_id: str) -> str:
        """The record of a worker's last claim (makes a re-sent claim idempotent)."""
        return f"{self.prefix}claim:{worker_id}"
