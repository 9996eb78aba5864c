"""Job streams at the broker seam (capability :class:`~typedq.broker.capabilities.JobStreams`):
the values a worker appends to a job's stream and a reader gets back.

A job's stream holds the items its *current run* emitted (``ctx.emit``, see
:mod:`typedq.streams` and docs/streams.md), in order, each with its number in the run
(``seq``, from 0) and the attempt that wrote it, then at most one end entry written after
the job reached a final state. A run is one claim of the job (one attempt): the first
append of a run (``fresh``) empties the stream first, so a stream never mixes runs, and a
reader that was in the middle of the previous run sees the numbers start again.

The stream keeps about the last :data:`STREAM_MAX` entries of its run (a reader that
falls further behind finds a gap in ``seq``), and it expires with the job's record: an
end entry gives it the retention time of the job's final state.
"""

from __future__ import annotations

import msgspec

from .messages import JobState

__all__ = ["READER_TTL", "STREAM_MAX", "STREAM_LIVE_TTL", "StreamAppend", "StreamEntry"]

#: About how many entries a job's stream keeps (the oldest go first): 10,000 items of
#: ~100 bytes is ~1.5 MB per streaming job on Redis.
STREAM_MAX = 10_000

#: Seconds a stream outlives its last append while its job has not ended (a run whose
#: worker died writes no end entry): a day, as the completed jobs' default retention.
STREAM_LIVE_TTL = 24 * 3600.0

#: Seconds a reader of a job's stream (``read_stream(..., reader=)``) stays counted after
#: its last read ends (beyond the time that read may wait): a reader that died without
#: leaving (``leave_stream``) drops out of the readers' count (``typedq inspect
#: --streams``) within about this long.
READER_TTL = 10.0


class StreamEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry of a job's stream.

    :ivar position: where it is in the stream, for the next read's ``after`` (opaque;
        positions only grow, also across runs)
    :ivar attempt: the attempt that wrote it
    :ivar seq: its number in its run, from 0 (the end entry: the number of items before it)
    :ivar data: the encoded item (empty for the end entry)
    :ivar end: the final state of the job on the end entry, else None
    """

    position: str
    attempt: int
    seq: int
    data: bytes = b""
    end: JobState | None = None


class StreamAppend(msgspec.Struct, frozen=True, kw_only=True):
    """Items one run of a job adds to its stream, fenced by the run's lease token.

    Items are taken only while ``token`` holds the job (it is active and this is its
    lease); the end entry (``end``) only once the job is in a final state by this token's
    own transition (the entry records that state). Anything else is refused (``append_streams`` answers False):
    a run that lost its lease never writes into the next run's stream.

    :ivar job_id: the job
    :ivar queue: its queue
    :ivar token: the lease token of the run
    :ivar attempt: the run's attempt number
    :ivar seq: the number (in the run) of the first item
    :ivar items: the encoded items, in order
    :ivar fresh: the run's first append: empty the stream (a previous run's items) first
    :ivar end: write the end entry after the items
    :ivar ttl: seconds the stream is kept after this append (the end: the retention of
        its final state)
    """

    job_id: str
    queue: str
    token: str
    attempt: int
    seq: int
    items: list[bytes]
    fresh: bool = False
    end: bool = False
    ttl: float = STREAM_LIVE_TTL
