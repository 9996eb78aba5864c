"""What the Redis broker watches about its server: configuration, data loss, maxmemory.

- Configuration, at connect: an eviction policy other than ``noeviction`` (Redis may evict
  job data), and no persistence typedq can see (a restart loses every job).
- Data loss: on connect the broker writes the app's epoch key if it is missing and
  remembers its value, and so for the epoch key of each queue it uses (a queue's keys
  live in one slot; on Redis Cluster each shard can lose its data on its own);
  :class:`EpochWatch` notices when one vanished or changed (a restart without
  persistence, FLUSHALL, a failover to an empty replica), logs one error naming the key
  and records :class:`~typedq.errors.RedisDataLost`; the broker carries on with the new
  epoch.
  Looked at, at most every :data:`EPOCH_CHECK_INTERVAL` seconds, by a worker's recovery
  pass and before an enqueue.
- Maxmemory: :class:`MemoryWatch` reads ``INFO memory`` at most every
  :data:`MEMORY_CHECK_INTERVAL` seconds (a worker's recovery pass) and logs one warning
  when Redis reaches maxmemory and one info line when it is below again.

This module decides and words; the broker does the I/O.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from typing import Any

from redis.crc import key_slot

from ...errors import RedisDataLost
from .codec import as_int, mb, text, utc
from .keys import Keys

__all__ = [
    "EPOCH_CHECK_INTERVAL",
    "check_slots",
    "MEMORY_CHECK_INTERVAL",
    "EpochWatch",
    "MemoryWatch",
    "check_config",
]

log = logging.getLogger("typedq.broker.redis")

#: At most one check of the epoch key per this many seconds (recovery passes and enqueues).
#: 2 s; the test suite shortens it for worker processes through ``$_TYPEDQ_TEST_EPOCH_CHECK``
#: (internal, undocumented on purpose: unset, as in production, it is 2 s).
EPOCH_CHECK_INTERVAL = float(os.environ.get("_TYPEDQ_TEST_EPOCH_CHECK") or 2.0)
#: At most one look at ``INFO memory`` (is Redis at maxmemory?) per this many seconds.
MEMORY_CHECK_INTERVAL = 5.0
#: Used memory at or over this share of maxmemory counts as "at maxmemory" (Redis
#: refuses writes just past the limit; a little slack catches it before the refusal).
_FULL_AT = 0.98
#: ... and below this share as "below maxmemory again" (a margin, so one warning per
#: episode instead of one per pass while memory hovers around the limit).
_BELOW_AT = 0.95

#: Persistence warnings already given in this process, as (address, kind): producers
#: and inspect runs connect often, and the setting rarely changes; once is enough.
WARNED: set[tuple[str, str]] = set()


def _warn_once(where: str, kind: str, message: str, *args: Any) -> None:
    if (where, kind) not in WARNED:
        WARNED.add((where, kind))
        log.warning(message, *args)


def check_config(where: str, memory: dict[str, Any], persistence: dict[str, Any]) -> None:
    """Warn about settings that lose jobs, from ``INFO memory`` and ``INFO persistence``."""
    policy = memory.get("maxmemory_policy")
    if policy is not None and text(policy) != "noeviction":
        log.warning(
            "%s has maxmemory-policy %s: Redis may evict job data and leases under "
            "memory pressure; set `maxmemory-policy noeviction` for a task queue",
            where,
            text(policy),
        )
    if as_int(persistence.get("aof_enabled"), 1) != 0:
        return
    # INFO cannot show the `save` setting (and CONFIG GET is often denied): no
    # snapshot since Redis started is the sign that RDB is off too.
    if as_int(persistence.get("rdb_saves"), 0) == 0:
        _warn_once(
            where,
            "persistence",
            "%s runs without persistence that typedq can see (appendonly no, and no "
            "RDB snapshot since it started): a restart loses every job; typedq will "
            "report it as RedisDataLost. Set `appendonly yes` for a task queue",
            where,
        )
    else:
        _warn_once(
            where,
            "persistence",
            "%s runs with RDB snapshots only (appendonly no): a crash loses the jobs "
            "enqueued and finished since the last snapshot. Set `appendonly yes` for a "
            "task queue",
            where,
        )


def check_slots(keys: Keys, queues: Sequence[str]) -> str | None:
    """On Redis Cluster: None when every key and wake-up channel of each queue maps to the
    queue's one slot, else one line naming those that do not (a script on a queue may touch
    any of its keys and ``SPUBLISH`` on its channels, so they must share a slot)."""
    bad: list[str] = []
    for queue in queues:
        names = [
            keys.job(queue, "id"),
            keys.levels(queue),
            keys.waiting(queue, 0),
            keys.scheduled(queue),
            keys.counts(queue),
            keys.stale(queue),
            keys.index(queue, "id"),
            keys.active(queue),
            keys.done(queue, "c"),
            keys.seq(queue),
            keys.queue_epoch(queue),
            keys.gates(queue),
            keys.gate(queue, "c|t|k"),
            keys.rate(queue, "t", "k"),
            keys.slots(queue, "t", "k"),
            keys.flow(queue, "id"),
            keys.request(queue, "tok"),
            keys.events(queue),
            keys.events_config(queue),
            keys.unique(queue, "t|k"),
            keys.unique_job(queue, "id"),
            keys.debounce(queue, "t|k"),
            keys.minute(queue, 0),
            *(keys.queue_channel(queue, kind) for kind in "wdx"),
        ]
        slot = key_slot(names[0].encode())
        bad += [
            f"{n} (slot {key_slot(n.encode())}, not {slot})"
            for n in names
            if key_slot(n.encode()) != slot
        ]
    if not bad:
        return None
    return (
        "these keys or channels of a queue would not map to its one Redis Cluster slot: "
        f"{', '.join(bad)}; "
        "check the app and queue names (no braces)"
    )


class EpochWatch:
    """The epochs last seen: the app's, and one per queue this broker uses (each queue's
    keys live in one slot, and on Redis Cluster each shard can lose its data on its
    own); notices when one vanished or changed."""

    def __init__(self, namespace: str, epoch_key: str) -> None:
        self.namespace = namespace
        self.epoch_key = epoch_key
        #: Epoch key -> the value seen last, and when (unix time).
        self.known: dict[str, tuple[str, float]] = {}
        self.due = 0.0
        #: The last loss of data noticed, or None.
        self.data_lost: RedisDataLost | None = None

    def reset(self) -> None:
        """Forget every epoch seen (a new connection)."""
        self.known.clear()

    def is_due(self) -> bool:
        """True when the next look is due."""
        return time.monotonic() >= self.due

    def looking(self) -> None:
        """A look starts now: the next one is due in :data:`EPOCH_CHECK_INTERVAL` seconds."""
        self.due = time.monotonic() + EPOCH_CHECK_INTERVAL

    def saw(self, seen: list[tuple[str, str, str]], where: str) -> bool:
        """Take the epochs the scripts answered, as (key, epoch, candidate) (a script
        wrote ``candidate`` if its key was missing); False, logged once and recorded in
        :attr:`data_lost`, when one is not the one seen last."""
        now = time.time()
        lost: list[tuple[str, str, float, str, str]] = []
        for key, epoch, candidate in seen:
            before = self.known.get(key)
            self.known[key] = (epoch, now)
            if before is not None and before[0] != epoch:
                lost.append((key, before[0], before[1], epoch, candidate))
        if not lost:
            return True
        key, known, seen_at, epoch, candidate = lost[0]
        created = as_int(epoch.partition("-")[0])
        how = "vanished" if epoch.endswith("-" + candidate) else f"changed to {epoch!r}"
        more = ""
        if len(lost) > 1:
            more = f" (so did {len(lost) - 1} more: {', '.join(k for k, *_ in lost[1:])})"
        self.data_lost = RedisDataLost(
            f"{where} lost its data: the epoch key {key} was {known!r} "
            f"when last seen at {utc(seen_at)} and has {how} (new epoch written at "
            f"{utc(created)}){more}. Redis restarted without persistence, was flushed "
            "(FLUSHALL/FLUSHDB) or failed over to an empty replica: the jobs of app "
            f"{self.namespace!r} in the slots of these keys enqueued before it are gone "
            "(waiting, scheduled and running jobs, results, failure records), and running "
            "jobs end as NOT_FOUND. Continuing with the new epoch; set `appendonly yes` to "
            "survive restarts"
        )
        log.error("%s", self.data_lost)
        return False


class MemoryWatch:
    """Whether Redis was at maxmemory at the last look, and when to look again."""

    def __init__(self) -> None:
        self.at_maxmemory = False
        self.due = 0.0

    def is_due(self) -> bool:
        """True when the next look is due."""
        return time.monotonic() >= self.due

    def looking(self) -> None:
        """A look starts now: the next one is due in :data:`MEMORY_CHECK_INTERVAL` seconds."""
        self.due = time.monotonic() + MEMORY_CHECK_INTERVAL

    def denied(self) -> None:
        """The ACL user may not run INFO: denied once, denied always; stop asking."""
        self.due = math.inf

    def saw(self, info: dict[str, Any], where: str) -> bool:
        """Take ``INFO memory``; True when Redis is at maxmemory (logged on each change)."""
        used, limit = as_int(info.get("used_memory")), as_int(info.get("maxmemory"))
        if limit <= 0:
            full = False
        elif self.at_maxmemory:
            full = used >= limit * _BELOW_AT
        else:
            full = used >= limit * _FULL_AT
        if full and not self.at_maxmemory:
            policy = text(info.get("maxmemory_policy", b"noeviction"))
            log.warning(
                "%s is at maxmemory (used %s of %s, policy %s): enqueues are refused; "
                "workers keep draining (claim, complete, fail, recover still run) and "
                "memory comes back as retention removes finished jobs. Raise maxmemory or "
                "lower the retention (completed_ttl/completed_max) to recover sooner",
                where,
                mb(used),
                mb(limit),
                policy,
            )
        elif self.at_maxmemory and not full:
            log.info(
                "%s is below maxmemory again (used %s of %s): enqueues are accepted",
                where,
                mb(used),
                mb(limit),
            )
        self.at_maxmemory = full
        return full
