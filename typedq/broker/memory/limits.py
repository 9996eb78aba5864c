"""Task limits at claim time (:mod:`typedq.limits`): rate windows, concurrency slots,
and the gates that park the waiting jobs a closed limit holds back.

The same rules as the Redis claim script: concurrency first, then the sliding window.
Times here are integer microseconds of the broker clock's wall time.

- A rate bucket (task, rate key) keeps its start times within its window.
- A concurrency slot (task, concurrency key) keeps the ids of the jobs holding it, and
  ghosts (``~<id>``) of active jobs an operator deleted while their handler may still
  run: a ghost holds its place until the job's lease would have ended.
- A gate (queue, ``'r'`` | ``'c'``, task, key) is a closed limit of a queue: the jobs
  it parked (out of the line, in a heap of their entries) and when it opens.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from ...limits import LimitSpec
from ..base import JobMessage
from .jobs import WAITING, Entry, Job, JobTable
from .lines import Lines

__all__ = ["MICRO", "Gate", "Limiter"]

#: A limit gate: (queue, 'r' for rate | 'c' for concurrency, task, key).
Gate = tuple[str, str, str, str]
MICRO = 1_000_000


class Limiter:
    """Rate windows, concurrency slots and gates; ``wake`` tells waiting workers when a
    gate opens early (a slot freed)."""

    __slots__ = ("gates", "ghosts", "lines", "parked", "slots", "starts", "table", "wake")

    def __init__(self, table: JobTable, lines: Lines, wake: Callable[[], None]) -> None:
        self.table = table
        self.lines = lines
        self.wake = wake
        #: Each rate bucket's start times in its window, oldest first.
        self.starts: dict[tuple[str, str], deque[int]] = {}
        #: The ids holding each concurrency slot (ghosts included).
        self.slots: dict[tuple[str, str], set[str]] = {}
        #: Ghosts of deleted active jobs in their slots: '~<id>' -> when their lease
        #: would have ended (see ghost_slot).
        self.ghosts: dict[tuple[str, str], dict[str, float]] = {}
        #: The entries each closed gate parked, a heap, and when each gate opens.
        self.parked: dict[Gate, list[Entry]] = {}
        self.gates: dict[Gate, float] = {}

    def admit(self, job: Job, entry: Entry, now_us: int, specs: Mapping[str, LimitSpec]) -> bool:
        """Take ``job``'s rate token and concurrency slot, or park it by its closed gate."""
        message = job.message
        spec = specs.get(message.task)
        if spec is None:
            return True
        slot = (message.task, message.concurrency_key)
        if spec.concurrency and self.held(slot, now_us) >= spec.concurrency:
            self.park((message.queue, "c", *slot), entry, self.ghost_ends(slot))
            return False
        if spec.rate:
            bucket = (message.task, message.rate_key)
            starts = self.window(bucket, spec.per_us, now_us)
            if len(starts) >= spec.rate:
                # Open once the start `rate` places back leaves the window.
                opens = starts[len(starts) - spec.rate] + spec.per_us
                self.park((message.queue, "r", *bucket), entry, opens)
                return False
            # Spaced starts (RateLimit.spacing_us): the next turn, taken up to early_us
            # before it; the start is recorded at its turn.
            turn = max(now_us, starts[-1] + spec.spacing_us) if starts else now_us
            if spec.spacing_us and turn > now_us + spec.early_us:
                self.park((message.queue, "r", *bucket), entry, turn - spec.early_us)
                return False
            starts.append(turn if spec.spacing_us else now_us)
        if spec.concurrency:
            self.slots.setdefault(slot, set()).add(message.id)
            job.slot = slot
        return True

    def window(self, bucket: tuple[str, str], per_us: int, now_us: int) -> deque[int]:
        """The bucket's start times in ``(now - per, now]``, oldest first (older ones go)."""
        starts = self.starts.get(bucket)
        if starts is None:
            starts = self.starts[bucket] = deque()
        while starts and starts[0] <= now_us - per_us:
            starts.popleft()
        return starts

    def park(self, gate: Gate, entry: Entry, opens_us: float) -> None:
        heapq.heappush(self.parked.setdefault(gate, []), entry)
        self.gates[gate] = opens_us

    def unpark(self, queues: Sequence[str], now_us: int, specs: Mapping[str, LimitSpec]) -> None:
        """Give the open gates of ``queues`` back as many of their parked jobs as their
        bucket admits now, best first (heap entries keep their place); the claim admits
        or parks them again. A gate whose task this broker does not limit (any more)
        gives back all of them."""
        wanted = set(queues)
        live = self.table.live
        for gate in [g for g, opens in self.gates.items() if opens <= now_us and g[0] in wanted]:
            queue, kind, task, key = gate
            parked = self.parked.get(gate, [])
            spec = specs.get(task)
            room, opens = len(parked), 0.0
            if spec is not None and kind == "c" and spec.concurrency:
                room = spec.concurrency - self.held((task, key), now_us)
                opens = self.ghost_ends((task, key))
            elif spec is not None and kind == "r" and spec.rate:
                starts = self.window((task, key), spec.per_us, now_us)
                room = spec.rate - len(starts)
                opens = starts[len(starts) - spec.rate] + spec.per_us if room <= 0 else now_us
                if room > 0 and spec.spacing_us and starts:
                    # Spaced: the turns from the next one to now + early_us.
                    turn = max(now_us, starts[-1] + spec.spacing_us)
                    if turn > now_us + spec.early_us:
                        room, opens = 0, turn - spec.early_us
                    else:
                        room = min(room, (now_us + spec.early_us - turn) // spec.spacing_us + 1)
            closed = room <= 0
            back: list[tuple[Entry, JobMessage]] = []
            while parked and room > 0:
                entry = heapq.heappop(parked)
                if (job := live(entry[3], entry[2], WAITING)) is not None:
                    back.append((entry, job.message))
                    room -= 1  # (an entry of a job that left waiting is dropped)
            # At their old places, a fair job at its key's (lines.WaitLine.hand_back).
            self.lines.waiting[queue].hand_back(back, self.lines.live_entry)
            if parked and closed:
                # Full now (so someone holds a slot or a recent start): closed until then.
                # Otherwise it stays open and the next claim counts again.
                self.gates[gate] = opens
            elif not parked:
                del self.gates[gate]
                self.parked.pop(gate, None)

    def held(self, slot: tuple[str, str], now_us: float) -> int:
        """How many of ``slot``'s places are held; ghosts whose lease ended leave first."""
        ghosts = self.ghosts.get(slot)
        if ghosts:
            holders = self.slots.get(slot, set())
            for ghost in [g for g, ends in ghosts.items() if ends <= now_us]:
                del ghosts[ghost]
                holders.discard(ghost)
            if not ghosts:
                del self.ghosts[slot]
            if not holders:
                self.slots.pop(slot, None)
        return len(self.slots.get(slot, ()))

    def ghost_ends(self, slot: tuple[str, str]) -> float:
        """When a full slot frees a place by itself: its first ghost's end, else never."""
        return min(self.ghosts.get(slot, {}).values(), default=float("inf"))

    def ghost_slot(self, job: Job, now_us: float, lease_left: float) -> None:
        """An operator deletes active ``job`` while its handler may still run: its place
        in the slot goes to a ghost until its lease would have ended, ``lease_left``
        seconds from now (by then its worker, told the lease is lost, has cancelled the
        handler); the same rule as the Redis scripts' ghost_slot."""
        slot = job.slot
        if slot is None:
            return
        ends = now_us + lease_left * MICRO
        if ends <= now_us:
            self.free_slot(job)
            return
        job.slot = None
        holders = self.slots.setdefault(slot, set())
        holders.discard(job.message.id)
        ghost = "~" + job.message.id
        holders.add(ghost)
        self.ghosts.setdefault(slot, {})[ghost] = ends
        gate = (job.message.queue, "c", *slot)
        if gate in self.gates and self.gates[gate] > ends:
            self.gates[gate] = ends
            self.wake()

    def free_slot(self, job: Job) -> None:
        """Release the concurrency slot ``job`` holds and open the gate of its key."""
        slot = job.slot
        if slot is None:
            return
        job.slot = None
        holders = self.slots.get(slot)
        if holders is not None:
            holders.discard(job.message.id)
            if not holders:
                del self.slots[slot]
        gate = (job.message.queue, "c", *slot)
        if gate in self.gates:
            self.gates[gate] = 0.0
            self.wake()

    def next_gate(self, queues: Sequence[str]) -> float | None:
        """When (epoch seconds) the earliest gate of ``queues`` opens, if one will."""
        times = [opens for gate, opens in self.gates.items() if gate[0] in queues]
        earliest = min(times, default=float("inf"))
        return None if earliest == float("inf") else earliest / MICRO

    def any_open(self, now_us: float) -> bool:
        """Has some gate opened (so its parked jobs are due)?"""
        return any(opens <= now_us for opens in self.gates.values())

    def forget_idle(self, now_us: float, specs: Mapping[str, LimitSpec]) -> None:
        """Drop the rate buckets with nothing left in any window: as good as new."""
        windows = {spec.per_us for spec in specs.values() if spec.rate}
        longest = max(windows, default=0)
        for bucket in [b for b, s in self.starts.items() if not s or s[-1] <= now_us - longest]:
            del self.starts[bucket]
