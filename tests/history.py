"""A history checker for runs of real worker processes under faults.

A run records three things per job id: that it was enqueued (the producer notes
every id it sent), every start (the handler of :mod:`tests.netfault_app` writes
``"<job id> <pid> <attempt>"`` to a ledger that no fault touches) and how it
finished (the broker's final :class:`~typedq.broker.base.JobRecord`, read at the end).
The checker then reports:

- **lost** jobs: enqueued but not completed (no record, or another final state);
- **duplicates**: jobs started more than once. A duplicate is *explained* only when
  the job's record shows a lease expiry for every extra start (``stalls >=
  starts - 1``): each re-run needs the earlier holder's lease to have run out. It is
  further attributed to a *killed worker* when an earlier start ran on a process
  that the run SIGKILLed. Anything else (a second start with no lease expiry) is a
  race, and *unexplained*;
- **stalls with no dead worker**: lease expiries of jobs none of whose starts ran
  on a SIGKILLed process. With no worker killed, a correct system has none: a
  network fault may delay a worker, never orphan its jobs. (When workers are killed,
  a job a victim had claimed but not started yet has no start to attribute it by,
  so this figure is exact only for runs without SIGKILL; the soak reports it but
  does not fail on it.)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis.asyncio as aioredis

from typedq import JobState
from typedq.broker.base import Broker, JobRecord

#: Ids per broker ``get`` / ledger read.
_BATCH = 1000


@dataclass(frozen=True)
class Start:
    """One execution of a handler, as the ledger recorded it."""

    pid: int
    attempt: int


@dataclass
class Report:
    """What :meth:`History.check` found."""

    enqueued: int
    completed: int
    lost: dict[str, str]
    starts: int
    duplicates: dict[str, int]
    explained_by_kill: set[str]
    explained_by_lease: set[str]
    unexplained: dict[str, str]
    stalls: int
    stalls_no_dead_worker: int
    stalled_jobs_no_dead_worker: list[str]
    unknown_started: set[str]
    completed_unstarted: set[str]
    states: Counter[str] = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        """No lost job, no unexplained duplicate, nothing run that was never enqueued."""
        return not (self.lost or self.unexplained or self.unknown_started)

    def figures(self) -> str:
        """One line with the headline figures (for test output and the soak)."""
        return (
            f"enqueued={self.enqueued} completed={self.completed} lost={len(self.lost)} "
            f"executions={self.starts} duplicates={len(self.duplicates)} "
            f"(killed-worker={len(self.explained_by_kill)} "
            f"lease-expiry={len(self.explained_by_lease)} "
            f"unexplained={len(self.unexplained)}) stalls={self.stalls} "
            f"stalls_no_dead_worker={self.stalls_no_dead_worker}"
        )

    def summary(self, *, examples: int = 5) -> str:
        """A few lines: the figures, then examples of each problem found."""
        lines = [self.figures(), f"final states: {dict(self.states)}"]

        def show(title: str, items: Iterable[str]) -> None:
            items = list(items)
            if items:
                lines.append(f"{title} ({len(items)}): " + "; ".join(items[:examples]))

        show("lost", (f"{k} {v}" for k, v in sorted(self.lost.items())))
        show("unexplained duplicates", (f"{k} {v}" for k, v in sorted(self.unexplained.items())))
        show("stalled with no dead worker", sorted(self.stalled_jobs_no_dead_worker))
        show("started but never enqueued", sorted(self.unknown_started))
        show("completed with no recorded start", sorted(self.completed_unstarted))
        return "\n".join(lines)


class History:
    """Everything one run did to its jobs; :meth:`check` judges it."""

    def __init__(self) -> None:
        self.enqueued: list[str] = []
        self.starts: dict[str, list[Start]] = defaultdict(list)
        self.records: dict[str, JobRecord | None] = {}
        self.killed_pids: set[int] = set()
        #: (monotonic time, description) of every fault injected, for the report.
        self.faults: list[tuple[float, str]] = []

    def note_enqueued(self, ids: Iterable[str]) -> None:
        """The producer sent these ids (re-sends of the same id are one job)."""
        self.enqueued.extend(ids)

    def note_killed(self, pid: int) -> None:
        """This worker process was SIGKILLed (its running jobs may run again)."""
        self.killed_pids.add(pid)

    def note_fault(self, at: float, what: str) -> None:
        self.faults.append((at, what))

    async def load_starts(self, ledger: aioredis.Redis, key: str = "starts") -> None:
        """Read every start the handlers recorded in the ledger list ``key``."""
        self.starts.clear()
        total = int(await ledger.llen(key))
        for offset in range(0, total, _BATCH * 10):
            for raw in await ledger.lrange(key, offset, offset + _BATCH * 10 - 1):
                text = raw.decode() if isinstance(raw, bytes) else str(raw)
                job_id, pid, attempt = text.split()
                self.starts[job_id].append(Start(int(pid), int(attempt)))

    async def load_records(self, broker: Broker) -> None:
        """Read the broker's record of every enqueued (or started) job."""
        ids = sorted(set(self.enqueued) | set(self.starts))
        for offset in range(0, len(ids), _BATCH):
            chunk = ids[offset : offset + _BATCH]
            for job_id, record in zip(chunk, await broker.get(chunk), strict=True):
                self.records[job_id] = record

    def check(self) -> Report:
        """Lost jobs, duplicates (explained or not) and stalls, from what was loaded."""
        enqueued = set(self.enqueued)
        lost: dict[str, str] = {}
        states: Counter[str] = Counter()
        completed = 0
        for job_id in sorted(enqueued):
            record = self.records.get(job_id)
            if record is None:
                lost[job_id] = "no record"
                states["missing"] += 1
                continue
            states[record.state.value] += 1
            if record.state is JobState.COMPLETED:
                completed += 1
            else:
                lost[job_id] = (
                    f"state={record.state.value} attempt={record.attempt} "
                    f"stalls={record.stalls} starts={len(self.starts.get(job_id, ()))}"
                )
        duplicates: dict[str, int] = {}
        by_kill: set[str] = set()
        by_lease: set[str] = set()
        unexplained: dict[str, str] = {}
        stalls = 0
        stalls_no_dead = 0
        stalled_no_dead: list[str] = []
        for job_id in sorted(enqueued):
            record = self.records.get(job_id)
            runs = self.starts.get(job_id, [])
            job_stalls = record.stalls if record is not None else 0
            stalls += job_stalls
            on_killed = any(s.pid in self.killed_pids for s in runs)
            if job_stalls and not on_killed:
                stalls_no_dead += job_stalls
                stalled_no_dead.append(f"{job_id} stalls={job_stalls} starts={len(runs)}")
            if len(runs) <= 1:
                continue
            duplicates[job_id] = len(runs)
            if job_stalls >= len(runs) - 1:
                # Every extra start followed a lease expiry; who let the lease run out?
                if any(s.pid in self.killed_pids for s in runs[:-1]):
                    by_kill.add(job_id)
                else:
                    by_lease.add(job_id)
            else:
                unexplained[job_id] = (
                    f"starts={len(runs)} stalls={job_stalls} "
                    f"pids={[s.pid for s in runs]} attempts={[s.attempt for s in runs]}"
                )
        return Report(
            enqueued=len(enqueued),
            completed=completed,
            lost=lost,
            starts=sum(len(v) for k, v in self.starts.items() if k in enqueued),
            duplicates=duplicates,
            explained_by_kill=by_kill,
            explained_by_lease=by_lease,
            unexplained=unexplained,
            stalls=stalls,
            stalls_no_dead_worker=stalls_no_dead,
            stalled_jobs_no_dead_worker=stalled_no_dead,
            unknown_started=set(self.starts) - enqueued,
            completed_unstarted={
                j
                for j in enqueued
                if not self.starts.get(j)
                and (r := self.records.get(j)) is not None
                and r.state is JobState.COMPLETED
            },
            states=states,
        )


__all__ = ["History", "Report", "Start"]
