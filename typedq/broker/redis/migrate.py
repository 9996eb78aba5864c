"""Moving an app's data from the previous Redis key layout to the per-queue one.

Before typedq 0.x (this release) every key of an app lived under ``typedq:{<ns>}:``
(one hash tag: a whole app in one Redis Cluster slot). Now every key of a queue lives
under ``tq:{<ns>:<queue>}`` (:mod:`typedq.broker.redis.keys`). At connect, a broker on
standalone Redis looks for the old layout's order counter ``typedq:{<ns>}:seq`` (one
EXISTS) and, when it is there, moves every old key, a chunk per script call
(``lua/migrate.lua``), in steps that each finish before the next starts:

1. ``f`` running flows, to the queue of the flow's own job (their jobs' queues listed);
2. ``z`` the app-wide active and finished sets, entry by entry to each job's queue;
3. ``b`` limit buckets (concurrency holders, rate windows), to their jobs' queues;
4. ``j`` jobs, to ``{<ns>:<queue>}`` (each queue's order counter continues from the
   old one, so FIFO holds across the move);
5. ``q`` each queue's own keys (waiting lists, levels, scheduled set, counts, ...);
6. ``r`` request records (kept a minute for re-sent calls) are dropped;

and last deletes the old order counter. Each chunk is atomic and an old key is gone
once moved, so the migration is idempotent and safe to interrupt: a restart (or a
second process connecting at the same time) carries on with what is left. Stop
processes of the previous version first: what they write in the old layout after the
move is not seen.

On Redis Cluster the old layout (one slot) is refused with one line saying how to
migrate (a move across slots is not atomic there).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...errors import ConfigError

if TYPE_CHECKING:
    from .broker import RedisBroker

__all__ = ["migrate_layout"]

log = logging.getLogger("typedq.broker.redis")

#: Old keys per script call.
_CHUNK = 200
#: The steps, in order (see the module docstring), with the old key patterns they move.
_STEPS = (
    ("f", ("f:*",)),
    ("z", ("active", "done:c", "done:f", "done:x")),
    ("b", ("cc:*", "rl:*")),
    ("j", ("j:*",)),
    ("q", ("q:*",)),
    ("r", ("r:*",)),
)


async def migrate_layout(broker: RedisBroker) -> int:
    """Move the app's keys of the previous layout, if any; the number of keys moved."""
    redis: Any = broker._conn()
    prefix = broker.keys.prefix
    old_seq = prefix + "seq"
    with broker._translate("layout migration"):
        if not await redis.exists(old_seq):
            return 0
        if broker.cluster:
            raise ConfigError(
                f"{broker._where} holds app {broker.settings.namespace!r} in the previous "
                "key layout (one slot per app), which typedq does not move on Redis "
                "Cluster: drain it with the previous typedq version first, or copy it to a "
                "standalone Redis and connect once with redis:// (that migrates it)"
            )
        seq = await redis.get(old_seq) or b"0"
    log.warning(
        "%s holds app %r in the previous key layout; moving it to the per-queue layout",
        broker._where,
        broker.settings.namespace,
    )
    moved = 0
    for step, patterns in _STEPS:
        for pattern in patterns:
            moved += await _move_matching(broker, step, seq, prefix + pattern)
    with broker._translate("layout migration"):
        await redis.delete(prefix + "mig:fq", old_seq)
    log.warning(
        "%s: moved %d keys of app %r to the per-queue layout",
        broker._where,
        moved,
        broker.settings.namespace,
    )
    return moved


async def _move_matching(broker: RedisBroker, step: str, seq: Any, pattern: str) -> int:
    redis: Any = broker._conn()
    moved = 0
    prefix = broker.keys.prefix
    old_seq = prefix + "seq"
    if "*" not in pattern:
        # One key (an app-wide zset) moved a chunk of entries per call.
        while True:
            with broker._translate("layout migration"):
                if not await redis.exists(pattern):
                    return moved
            moved += int(await broker._eval("migrate", [old_seq], [prefix, step, seq, pattern]))
    # Keys matching a pattern: SCAN finds them; moved keys leave the old names, so the
    # scan repeats until one pass finds none (keys of the new layout never match).
    while True:
        found = 0
        cursor = 0
        while True:
            with broker._translate("layout migration"):
                cursor, batch = await redis.scan(cursor, match=pattern, count=1000)
            for i in range(0, len(batch), _CHUNK):
                chunk = batch[i : i + _CHUNK]
                found += len(chunk)
                moved += int(await broker._eval("migrate", [old_seq], [prefix, step, seq, *chunk]))
            if cursor == 0:
                break
        if not found:
            return moved
