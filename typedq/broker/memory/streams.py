"""Job streams of the embedded broker (capability JobStreams): per job, a deque of its
current run's entries, the last position given out, and an event readers wait on (set by
the next append: no polling). A stream expires ``ttl`` seconds after its last append
(read lazily: an expired stream is dropped when it is next touched, and a sweep drops the
others every few hundred appends)."""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable

import anyio

from ..messages import JobState
from ..streams import STREAM_MAX, StreamAppend, StreamEntry
from .jobs import Job

__all__ = ["JobStreamStore"]

_FINAL = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
#: Appends between two sweeps of expired streams.
_SWEEP_EVERY = 256


def _position(entry: StreamEntry) -> int:
    return int(entry.position)


class _Stream:
    __slots__ = ("entries", "expires", "last", "waiter")

    def __init__(self) -> None:
        self.entries: deque[StreamEntry] = deque()
        self.last = 0
        self.expires = 0.0
        self.waiter: anyio.Event | None = None


class JobStreamStore:
    """The streams of the embedded broker's jobs, by job id.

    :param now: the broker's wall time (epoch seconds), for expiry
    :param job: the job of an id, for the fences
    :param cap: how many entries a stream keeps
    """

    def __init__(
        self, now: Callable[[], float], job: Callable[[str], Job | None], cap: int = STREAM_MAX
    ) -> None:
        self._now = now
        self._job = job
        self.cap = cap
        self._streams: dict[str, _Stream] = {}
        self._appends = 0
        #: The readers of each job's stream (``read_stream(..., reader=)``): reader id ->
        #: when it stops counting (broker time) unless it reads again.
        self._readers: dict[str, dict[str, float]] = {}

    def _live(self, job_id: str) -> _Stream | None:
        stream = self._streams.get(job_id)
        if stream is not None and stream.expires <= self._now():
            del self._streams[job_id]
            return None
        return stream

    def _fenced(self, append: StreamAppend) -> bool:
        """Whether ``append``'s token may write: it holds the active job (items), or the
        job ended by this token's own transition (the end)."""
        job = self._job(append.job_id)
        if job is None:
            return False
        if not append.end:
            return job.state is JobState.ACTIVE and job.active_token == append.token
        return job.state in _FINAL and job.done_token == append.token

    def append(self, append: StreamAppend) -> bool:
        """Apply one append (see ``Broker.append_streams``)."""
        if not self._fenced(append):
            return False
        job = self._job(append.job_id)
        assert job is not None
        self._appends += 1
        if self._appends % _SWEEP_EVERY == 0:
            self.sweep()
        stream = self._live(append.job_id)
        if stream is None:
            stream = self._streams[append.job_id] = _Stream()
        entries = stream.entries
        if append.fresh:
            entries.clear()
        seq = append.seq
        for data in append.items:
            stream.last += 1
            entries.append(
                StreamEntry(position=str(stream.last), attempt=append.attempt, seq=seq, data=data)
            )
            seq += 1
        if append.end:
            stream.last += 1
            entries.append(
                StreamEntry(
                    position=str(stream.last), attempt=append.attempt, seq=seq, end=job.state
                )
            )
        while len(entries) > self.cap:
            entries.popleft()
        stream.expires = self._now() + append.ttl
        if stream.waiter is not None:
            stream.waiter.set()
            stream.waiter = None
        return True

    def has_after(self, job_id: str, after: int) -> bool:
        stream = self._live(job_id)
        return stream is not None and stream.last > after

    async def wait(self, job_id: str, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the next append to ``job_id``'s stream."""
        stream = self._live(job_id)
        if stream is None:
            # Readers may wait before the first append: the stream exists empty (expiring
            # as a live one would) so that the append finds their event.
            stream = self._streams[job_id] = _Stream()
            stream.expires = self._now() + 3600.0
        if stream.waiter is None:
            stream.waiter = anyio.Event()
        waiter = stream.waiter
        with anyio.move_on_after(timeout):
            await waiter.wait()

    def read(self, job_id: str, after: int, limit: int) -> list[StreamEntry]:
        """Up to ``limit`` entries of ``job_id``'s stream after position ``after``."""
        stream = self._live(job_id)
        if stream is None or stream.last <= after or not stream.entries:
            return []
        entries = stream.entries
        # Positions are increasing but not consecutive (a fresh run keeps counting).
        start = bisect.bisect_right(entries, after, key=_position)
        return [entries[i] for i in range(start, min(len(entries), start + limit))]

    def join(self, job_id: str, reader: str, until: float) -> None:
        """Count ``reader`` among ``job_id``'s readers until ``until`` (broker time),
        dropping the readers of that stream whose time passed."""
        readers = self._readers.get(job_id)
        if readers is None:
            readers = self._readers[job_id] = {}
        else:
            now = self._now()
            for gone in [r for r, t in readers.items() if t <= now]:
                del readers[gone]
        readers[reader] = until

    def leave(self, job_id: str, reader: str) -> None:
        """Stop counting ``reader`` among ``job_id``'s readers."""
        readers = self._readers.get(job_id)
        if readers is not None:
            readers.pop(reader, None)
            if not readers:
                del self._readers[job_id]

    def readers(self, job_id: str) -> int:
        """How many readers read ``job_id``'s stream now (their time has not passed)."""
        readers = self._readers.get(job_id)
        if not readers:
            return 0
        now = self._now()
        return sum(1 for t in readers.values() if t > now)

    def sweep(self) -> None:
        """Drop the expired streams (no reader waits on one: a waiter keeps its own
        reference to the event, and is woken by its timeout) and the readers whose time
        passed."""
        now = self._now()
        for job_id in [i for i, s in self._streams.items() if s.expires <= now]:
            del self._streams[job_id]
        for job_id, readers in list(self._readers.items()):
            for gone in [r for r, t in readers.items() if t <= now]:
                del readers[gone]
            if not readers:
                del self._readers[job_id]

    def wake_all(self) -> None:
        """Wake every waiting reader (the broker closes)."""
        for stream in self._streams.values():
            if stream.waiter is not None:
                stream.waiter.set()
                stream.waiter = None
