"""Large fan-outs on Redis, stored in bounded steps (issue 31).

A Lua script blocks Redis while it runs. One ``flow_enqueue`` storing a fan-out of
10,000 members ran ~80 ms (100,000: ~1.1 s; ``bench/fanout_scripts.py``), and every other
client of that Redis waited. A fan-out with more members than :data:`STAGE_MEMBERS` (or
more than :data:`STAGE_BYTES` of bodies) is stored in three kinds of bounded script
calls instead, sent in order in one round trip:

1. **stage** (``flow_stage.lua``), a chunk of members per call: their bodies go to a
   staging hash of the flow on the members' queue, which nothing claims, counts or
   inspects, and which expires (:data:`STAGE_TTL`) unless step 2 stores the flow. A
   client that stops here leaves only that hash, which expires.
2. **store** (``flow_enqueue.lua``, the members marked staged): the flow's record, its
   steps and own job, with its members still staged; from here the flow exists (a
   re-sent enqueue answers ``created=False``), and its counter counts the staged
   members as not settled, so its callback cannot run before every member is released
   and has settled (exactly once, as for any fan-out).
3. **release** (``flow_open.lua``), a chunk per call, in input order: staged members
   become waiting jobs, as step 2 would have stored them at once.

What is not atomic any more: between steps 2 and 3's last call, the flow's first
members may be claimed (and run) while its last ones are still staged (not yet
inspectable or counted as waiting). The release is finished by the client (the same
round trip), by a re-sent enqueue of the flow (same id), or else by the reaper
(``recover.lua``: 200 members per pass once a release made no step for 5 s; see
``flow_ops.release_due`` in ``lua/common/flow_handoffs.lua``); a flow cancelled meanwhile
drops its staged members.

Staged only: a fan-out whose members share one queue on the slot of the flow's own job
(always so on one Redis). A fan-out across slots (Redis Cluster) is stored held, a chunk
of the same bounds per ``flow_part``, and started a chunk per outbox entry (``flows.py``).
The embedded broker stores every flow at once (it needs no bound).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "STAGE_BYTES",
    "STAGE_MEMBERS",
    "STAGE_TTL",
    "chunks",
]

#: The most members one staging or release call handles (each well under ~5 ms of Redis
#: time: ~7 µs per member to store, see bench/results/issue31-fanout-scripts.txt).
STAGE_MEMBERS = 250
#: The most bytes of member bodies one staging or release call handles.
STAGE_BYTES = 1024 * 1024
#: Seconds a staging hash lives after its last chunk unless its flow is stored.
STAGE_TTL = 600.0


def chunks(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` index ranges over bodies of ``sizes`` bytes, each at
    most :data:`STAGE_MEMBERS` members and :data:`STAGE_BYTES` bytes (but at least one
    member)."""
    out: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= STAGE_MEMBERS or size + n > STAGE_BYTES):
            out.append((start, i))
            start, size = i, 0
        size += n
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out
