"""Where jobs wait: a line per queue, best first, and the heap of scheduled jobs.

A queue's line (:class:`WaitLine`) is a FIFO per priority level; scheduled jobs wait in
one heap by due time until a claim promotes the due ones. Both use lazy deletion (see
:mod:`.jobs`): an entry is skipped when it comes up if its job has moved on.
"""

from __future__ import annotations

import bisect
import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

from ..base import EnqueueOutcome, JobMessage, JobState
from .jobs import SCHEDULED, WAITING, Entry, Job, JobTable

__all__ = ["PLACE_SCAN", "Level", "Lines", "Turn", "WaitLine"]

#: How many entries at the head of a level a hand-back looks at to find its job's old
#: place in a level that holds fair keys' turns (the Redis broker's PLACE_SCAN,
#: common/bookkeeping.lua: past it, the job goes behind the entries looked at).
PLACE_SCAN = 64

#: Is this waiting entry its job's live one (not left meanwhile)?
Live = Callable[[Entry], bool]


class Turn:
    """One fair key's place in its level's line (typedq.fair): the key's own waiting
    entries (``lane``, a :class:`Level`), the jobs the current turn takes (``weight``),
    the weight of the key's next turn (``next_weight``: its newest new job's, see
    :meth:`Level.push_fair`), how many this turn took so far (``taken``), and the order
    it holds in the level's FIFO (``order``: where it joined, or went back to the
    tail)."""

    __slots__ = ("group", "lane", "next_weight", "order", "taken", "weight")

    def __init__(self, group: tuple[str, str], order: int, weight: int) -> None:
        self.group = group
        self.lane = Level()
        self.order = order
        self.weight = weight
        self.next_weight = weight
        self.taken = 0


def _order(item: Entry | Turn) -> int:
    return item.order if type(item) is Turn else item[1]  # type: ignore[index]


class Level:
    """The entries of one priority level of a queue, in order.

    Jobs mostly arrive in order (a new job's order is above every other's) or at the head
    (a flow's released step): those go to the ends of ``fifo``, O(1) both ways. The rest
    (a job handed back to its old place) go to the small heap ``late``; the next entry is
    the smaller of the two heads.

    A fair key (typedq.fair) is one :class:`Turn` in ``fifo`` however many jobs it has
    waiting (``turns`` finds it by (task, key)): its jobs wait in its own lane, a turn
    takes up to its weight of them, and the turn goes back to the tail while jobs remain.
    A job handed back into a level with turns is placed in ``fifo`` itself
    (:meth:`place_back`), where the turns are, not in ``late``.
    """

    __slots__ = ("fifo", "late", "turns")

    def __init__(self) -> None:
        self.fifo: deque[Entry | Turn] = deque()
        self.late: list[Entry] = []
        self.turns: dict[tuple[str, str], Turn] = {}

    def push(self, entry: Entry) -> None:
        fifo = self.fifo
        if not fifo or entry[1] > _order(fifo[-1]):
            fifo.append(entry)
        elif entry[1] < _order(fifo[0]):
            fifo.appendleft(entry)
        else:
            heapq.heappush(self.late, entry)

    def push_fair(
        self, entry: Entry, group: tuple[str, str], weight: int, again: bool = False
    ) -> None:
        """Add ``entry`` to fair key ``group``'s lane; a key with no turn in the line
        joins it at the tail. An entry placed at the head (a flow's released step: a
        flow under way finishes before new work starts) goes first in its key's lane,
        and a key with no turn joins at the head of the line. A hand-back does not come
        here (:meth:`WaitLine.hand_back`). The Redis broker does the same
        (common/flow_settle.lua's release).

        A key's weight is its newest job's, from the key's next turn on: a new job
        (``again`` False) sets ``next_weight``, which :meth:`pop` takes when the key's
        turn starts (the turn under way keeps its count). A retry or a released step
        (``again``: no new job) leaves it; a key it makes join the line gets the job's
        weight. The Redis broker does the same (common/lanes.lua lane_push)."""
        turn = self.turns.get(group)
        if turn is None:
            fifo = self.fifo
            if fifo and entry[1] < _order(fifo[0]):
                turn = self.turns[group] = Turn(group, entry[1], weight)
                fifo.appendleft(turn)
                turn.lane.push(entry)
            else:
                self.join(group, entry, weight)
        else:
            if not again:
                turn.next_weight = weight
            turn.lane.push(entry)

    def join(self, group: tuple[str, str], entry: Entry, weight: int) -> Turn:
        """Fair key ``group`` joins the line at the tail, its lane holding ``entry``."""
        if self.late:
            self._merge_late()
        turn = self.turns[group] = Turn(group, entry[1], weight)
        fifo = self.fifo
        if fifo:
            turn.order = max(entry[1], _order(fifo[-1]))
        fifo.append(turn)
        turn.lane.push(entry)
        return turn

    def _merge_late(self) -> None:
        """Merge the out-of-order entries into ``fifo``, in the order :meth:`pop` takes
        them: a level with fair turns keeps none aside (:meth:`place_back` places them)."""
        late = sorted(self.late)
        merged: deque[Entry | Turn] = deque()
        i = 0
        for item in self.fifo:
            while i < len(late) and late[i][1] < _order(item):
                merged.append(late[i])
                i += 1
            merged.append(item)
        merged.extend(late[i:])
        self.fifo = merged
        self.late = []

    def place_back(self, entry: Entry, live: Live) -> None:
        """A plain job handed back (release, stall recovery, a gate giving it back): at
        its old place by its order. In a level with fair turns: right behind the last
        live plain entry older than it among the first PLACE_SCAN entries, or first when
        there is none, so it goes ahead of every turn from there on (each of them went to
        the tail after it was claimed from the head, or is a turn it was ahead of) and
        the turns keep their places among the plain entries (the Redis broker's
        push_back_in_order, entry for entry)."""
        if not self.turns:
            self.push(entry)
            return
        if self.late:
            self._merge_late()
        at = 0
        for i, item in enumerate(islice(self.fifo, PLACE_SCAN)):
            if not isinstance(item, Turn) and item[1] < entry[1] and live(item):
                at = i + 1
        self.fifo.insert(at, entry)

    def _late_first(self) -> bool:
        fifo, late = self.fifo, self.late
        return bool(late) and (not fifo or late[0][1] < _order(fifo[0]))

    def peek(self) -> Entry:
        if self._late_first():
            return self.late[0]
        head = self.fifo[0]
        return head.lane.peek() if type(head) is Turn else head  # type: ignore[return-value]

    def pop(self) -> Entry:
        fifo, late = self.fifo, self.late
        if late and (not fifo or late[0][1] < _order(fifo[0])):  # _late_first, inline
            return heapq.heappop(late)
        head = fifo[0]
        if type(head) is not Turn:
            return fifo.popleft()  # type: ignore[return-value]
        lane = head.lane
        entry = lane.pop()
        if not head.taken:
            head.weight = head.next_weight  # a new turn: the key's newest job's weight
        head.taken += 1
        if not lane.fifo and not lane.late:
            # The key has no job left: it leaves the line (a new job joins it again).
            fifo.popleft()
            del self.turns[head.group]
        elif head.taken >= head.weight:
            # Its turn is over: back to the tail, after every entry that joined since.
            fifo.popleft()
            head.taken = 0
            if fifo:
                head.order = _order(fifo[-1])
            fifo.append(head)
        return entry

    def __iter__(self) -> Iterator[Entry]:
        for item in self.fifo:
            if type(item) is Turn:
                yield from item.lane
            else:
                yield item  # type: ignore[misc]
        yield from self.late


class WaitLine:
    """The waiting entries of one queue, best first: a level per priority.

    Taking the next entry is O(1) (plus the number of priority levels in use, which is
    small), where one heap of every waiting job costs O(log n) tuple comparisons a job.
    Entries are never removed out of turn: an entry whose job has moved on (its version
    no longer matches) is skipped when it comes up.
    """

    __slots__ = ("keys", "levels")

    def __init__(self) -> None:
        #: -priority -> level; ``keys`` holds the levels' keys in ascending order.
        self.levels: dict[int, Level] = {}
        self.keys: list[int] = []

    def push(self, entry: Entry, message: JobMessage | None = None, again: bool = False) -> None:
        """Add ``entry`` (of the job of ``message``) to its level: a fair job's to its
        key's lane (``again``: no new job, see :meth:`Level.push_fair`)."""
        if message is not None and message.fair_weight:
            self.level(entry[0]).push_fair(
                entry, (message.task, message.fair_key), message.fair_weight, again
            )
        else:
            self.level(entry[0]).push(entry)

    def hand_back(self, items: Sequence[tuple[Entry, JobMessage]], live: Live) -> None:
        """Jobs handed back unrun (release, stall recovery, a limit's gate giving parked
        jobs back), each ``(entry, message)``, oldest first whatever their order here.

        A plain job goes back to its old place (:meth:`Level.place_back`). A fair job
        (typedq.fair) keeps its *key's* place: it goes first in its key's lane (the
        jobs of one call in their order, ahead of the key's other jobs: it was the key's
        oldest when a turn took it), and its key's place in the line does not move; a
        key with no job waiting joins the line at the tail, as a key whose turn just
        ended would have gone there. So a hand-back neither moves a key ahead of the
        others nor costs it its next turn: the job is what that turn takes. (A job's own
        old place would hand its key a second turn before the keys behind it: a worker
        that keeps handing a key's jobs back would jump that key ahead.) The Redis
        broker does the same (common/bookkeeping.lua push_back_in_order)."""
        firsts: dict[tuple[int, tuple[str, str]], int] = {}
        for entry, message in sorted(items, key=lambda item: item[0][1]):
            level = self.level(entry[0])
            if not message.fair_weight:
                level.place_back(entry, live)
                continue
            group = (message.task, message.fair_key)
            turn = level.turns.get(group)
            if turn is None:
                level.join(group, entry, message.fair_weight)
                firsts[entry[0], group] = 1
                continue
            # Behind the jobs this call put first already (the oldest first out).
            at = firsts.get((entry[0], group), 0)
            turn.lane.fifo.insert(at, entry)
            firsts[entry[0], group] = at + 1

    def level(self, key: int) -> Level:
        """The level of ``key`` (-priority), made if missing."""
        level = self.levels.get(key)
        if level is None:
            level = self.levels[key] = Level()
            bisect.insort(self.keys, key)
        return level

    def peek(self) -> Entry | None:
        """The best entry, or None when empty."""
        keys = self.keys
        return self.levels[keys[0]].peek() if keys else None

    def pop(self) -> Entry | None:
        """Take the best entry (None when empty); an emptied level goes."""
        keys = self.keys
        if not keys:
            return None
        key = keys[0]
        level = self.levels[key]
        entry = level.pop()
        if not level.fifo and not level.late:
            del self.levels[key]
            del keys[0]
        return entry

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __iter__(self) -> Iterator[Entry]:
        for level in self.levels.values():
            yield from level


def best(line: WaitLine) -> Entry:
    """The best entry of a non-empty line (the key that picks the line to claim from)."""
    entry = line.peek()
    assert entry is not None  # only non-empty lines are compared
    return entry


class Lines:
    """The waiting lines by queue and the scheduled jobs' heap, over one job table.

    This object places jobs; it never finishes them. ``scheduled`` holds
    (due time, version, id), smallest due time first.
    """

    __slots__ = ("queues", "scheduled", "table", "waiting")

    def __init__(self, table: JobTable, queues: set[str]) -> None:
        self.table = table
        #: The queue registry (observe.Registry.queues): a new job's queue joins it.
        self.queues = queues
        self.waiting: defaultdict[str, WaitLine] = defaultdict(WaitLine)
        self.scheduled: list[tuple[float, int, str]] = []

    # -- placing jobs ------------------------------------------------------------------

    def add(self, messages: Sequence[JobMessage], now: float) -> list[EnqueueOutcome]:
        """Store the new jobs of ``messages`` (an id that exists, or repeats within the
        batch, adds nothing), waiting or scheduled by their delay or ETA.

        One pass, no per-job calls: the job, its entry and its outcome. Counters and
        per-queue lookups live in locals and are stored back once.
        """
        table = self.table
        jobs = table.jobs
        all_counts = table.counts
        waiting = self.waiting
        scheduled = self.scheduled
        seq = table.seq
        version = table.versions
        outcomes: list[EnqueueOutcome] = []
        append = outcomes.append
        last_queue = None
        last_key = 0
        counts: dict[JobState, int] = {}
        fifo: deque[Entry | Turn] | None = None  # the level of (last_queue, last_key), once used
        for message in messages:
            job_id = message.id
            if job_id in jobs:
                append(EnqueueOutcome(job_id, False))
                continue
            queue = message.queue
            key = -message.priority
            if queue != last_queue:
                last_queue, last_key, fifo = queue, key, None
                counts = all_counts[queue]
                self.queues.add(queue)  # the queue registry: producers' queues too
            elif key != last_key:
                last_key, fifo = key, None
            seq += 1
            version += 1
            eta = message.eta
            run_at = eta if eta > 0 else (now + message.delay if message.delay > 0 else 0.0)
            if run_at > now:
                jobs[job_id] = Job(message, now, seq, version, SCHEDULED, run_at=run_at)
                counts[SCHEDULED] += 1
                heapq.heappush(scheduled, (run_at, version, job_id))
            else:
                jobs[job_id] = Job(message, now, seq, version)
                counts[WAITING] += 1
                if message.fair_weight:
                    waiting[queue].push((key, seq, version, job_id), message)
                else:
                    if fifo is None:
                        fifo = waiting[queue].level(key).fifo
                    # A new order is above every order given before: the tail of its level.
                    fifo.append((key, seq, version, job_id))
            append(EnqueueOutcome(job_id, True))
        table.seq = seq
        table.versions = version
        return outcomes

    def to_waiting(
        self,
        job: Job,
        *,
        keep_order: bool,
        at_head: bool = False,
        due: float | None = None,
        again: bool = False,
    ) -> None:
        """Waiting: at its old place (``keep_order``), at the tail of its priority level,
        or at its head (``at_head``: the latest so placed first out). ``due``: it is due
        again from then (a retry, hand-back, recovery, hand-off; its queue wait counts
        from it); None keeps its due time (a scheduled job's, or none). ``again``: a
        retry, no new job (a fair key's weight stays: :meth:`Level.push_fair`; so does a
        step placed at the head)."""
        table = self.table
        table.move(job, WAITING)
        if at_head:
            job.order = -table.next_order()
        elif not keep_order:
            job.order = table.next_order()
        if due is not None:
            job.run_at = due
        message = job.message
        self.waiting[message.queue].push(
            (-message.priority, job.order, job.version, message.id), message, again or at_head
        )

    def hand_back(self, jobs: Sequence[Job], due: float) -> None:
        """Waiting again, handed back unrun (a release, a recovered lease): due again
        from ``due`` at their old place, a fair job at its key's (WaitLine.hand_back)."""
        table = self.table
        by_queue: defaultdict[str, list[tuple[Entry, JobMessage]]] = defaultdict(list)
        for job in jobs:
            table.move(job, WAITING)
            job.run_at = due
            message = job.message
            by_queue[message.queue].append(
                ((-message.priority, job.order, job.version, message.id), message)
            )
        for queue, items in by_queue.items():
            self.waiting[queue].hand_back(items, self.live_entry)

    def live_entry(self, entry: Entry) -> bool:
        """Is ``entry`` its job's live waiting entry?"""
        return self.table.live(entry[3], entry[2], WAITING) is not None

    def to_scheduled(self, job: Job, run_at: float) -> None:
        """Scheduled: due at ``run_at`` (epoch seconds)."""
        self.table.move(job, SCHEDULED)
        job.run_at = run_at
        heapq.heappush(self.scheduled, (run_at, job.version, job.message.id))

    def promote_due(self, now: float) -> None:
        """Every scheduled job due at ``now`` joins the tail of its line."""
        scheduled = self.scheduled
        live = self.table.live
        while scheduled and scheduled[0][0] <= now:
            _, version, job_id = heapq.heappop(scheduled)
            job = live(job_id, version, SCHEDULED)
            if job is not None:
                # A job claimed before (a retry after its delay) is no new job: its fair
                # key's weight stays (the Redis claim's promotion: push_waiting of 'fk').
                self.to_waiting(job, keep_order=False, again=job.worker_id is not None)

    # -- looking -----------------------------------------------------------------------

    def head(self, queue: str) -> Entry | None:
        """The live best entry of ``queue``'s line; stale entries before it are dropped."""
        line = self.waiting.get(queue)
        live = self.table.live
        while line:
            entry = line.peek()
            assert entry is not None
            if live(entry[3], entry[2], WAITING) is not None:
                return entry
            line.pop()
        return None

    def next_run_at(self) -> float | None:
        """The run_at of the earliest live scheduled entry; stale heads are dropped."""
        scheduled = self.scheduled
        live = self.table.live
        while scheduled:
            run_at, version, job_id = scheduled[0]
            if live(job_id, version, SCHEDULED) is not None:
                return run_at
            heapq.heappop(scheduled)
        return None

    def due_scheduled(self, now: float) -> Iterator[tuple[float, Job]]:
        """The live scheduled jobs due at ``now``, not promoted yet, with their due time."""
        live = self.table.live
        for run_at, version, job_id in self.scheduled:
            if run_at <= now and (job := live(job_id, version, SCHEDULED)) is not None:
                yield run_at, job

    def oldest_due(self, queues: Iterable[str], now: float) -> dict[str, float]:
        """Per queue of ``queues`` with a job waiting (or due but not promoted yet, which
        promotion at claim would make waiting), the earliest time one became due."""
        oldest: dict[str, float] = {}
        wanted = set(queues)
        live = self.table.live
        for queue in wanted:
            for _, _, version, job_id in self.waiting.get(queue) or ():
                job = live(job_id, version, WAITING)
                if job is not None:
                    # Waiting since it became due: its due time when it has one (a
                    # retry's, a hand-back's, a delayed job's, ...), else its enqueue or
                    # the time its eta or delay named.
                    if job.run_at > 0:
                        due = job.run_at
                    else:
                        m = job.message
                        due = m.eta if m.eta > 0 else job.enqueued_at + m.delay
                        due = max(job.enqueued_at, due)
                    oldest[queue] = min(oldest.get(queue, now), due)
        for run_at, job in self.due_scheduled(now):
            queue = job.message.queue
            if queue in wanted:
                oldest[queue] = min(oldest.get(queue, now), run_at)
        return oldest
