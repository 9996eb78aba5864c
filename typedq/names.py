"""The grammar for every name that becomes part of a broker key.

Names are checked once, where they enter (App, task registration, enqueue), so no
broker ever builds a key from an unchecked string: no braces (Redis Cluster hash
tags), glob characters, whitespace or control bytes. Names (app, queue, task) hold no
``:`` either; job ids may (``order:123``): an id is only ever the last part of a key
(``...j:<id>``), and key-derived ids are ``<task>:<key>``, so the ``:`` after the task
name keeps every task's ids apart.

A partitioned queue (``@app.task(queue="emails", partitions=8)``) is stored as the
sub-queues ``emails.p0`` ... ``emails.p7``; :func:`partition_queue` picks one from a
stable hash of the job id (of its schedule, for a schedule's tick job). The form
``<queue>.p<n>`` is reserved for the partitions of a partitioned queue ``<queue>`` (the
app refuses a task queue named so).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import time

from .errors import InvalidName

__all__ = [
    "MAX_PARTITIONS",
    "check_job_id",
    "check_job_ids",
    "check_name",
    "check_worker_id",
    "key_job_id",
    "new_job_id",
    "new_job_ids",
    "partition_queue",
    "partition_queues",
]

#: The most partitions a queue may be split into.
MAX_PARTITIONS = 256

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")
_WORKER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,299}")
# A readable key that looks like a digest is hashed too, so no key's readable id can
# equal another key's hashed one.
_DIGEST_LIKE = re.compile(r"h[0-9a-f]{32}")
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def check_name(kind: str, name: object) -> str:
    """Return ``name`` if it fits ``[A-Za-z0-9][A-Za-z0-9_.-]{0,127}``, else raise InvalidName."""
    if not (isinstance(name, str) and _NAME.fullmatch(name)):
        raise InvalidName(
            f"invalid {kind} name {name!r}: use 1-128 characters from A-Z a-z 0-9 _ . - "
            "starting with a letter or digit"
        )
    return name


def check_job_id(job_id: object) -> str:
    """Return ``job_id`` if it fits ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}``, else raise InvalidName.

    Like names, plus ``:`` (``order:123``), up to 200 characters.
    """
    if not (isinstance(job_id, str) and _JOB_ID.fullmatch(job_id)):
        raise InvalidName(
            f"invalid job id {job_id!r}: use 1-200 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return job_id


# Ids one per line, each fitting _JOB_ID: a batch checked by one regex scan.
_JOB_ID_LINES = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}\n)*")


def check_job_ids(job_ids: list[str]) -> None:
    """Check every id of ``job_ids`` as :func:`check_job_id` does (one regex scan of
    them all; the first bad one raises the same InvalidName)."""
    try:
        lines = "\n".join(job_ids) + "\n"
    except TypeError:  # an id that is not a str
        ok = False
    else:  # (an id holding a newline would read as two)
        ok = lines.count("\n") == len(job_ids) and _JOB_ID_LINES.fullmatch(lines) is not None
    if not ok or not job_ids:
        for job_id in job_ids:
            check_job_id(job_id)


def check_worker_id(worker_id: object) -> str:
    """Return ``worker_id`` if it fits ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,299}`` (a host name,
    a pid and hex digits: ``Worker.id``), else raise InvalidName."""
    if not (isinstance(worker_id, str) and _WORKER_ID.fullmatch(worker_id)):
        raise InvalidName(
            f"invalid worker id {worker_id!r}: use 1-300 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return worker_id


# Job ids: ULID-shaped (26 Crockford base-32 characters, 48 bits of milliseconds then 80
# bits), made cheaply. Per millisecond a process draws one random 80-bit start, and the ids
# of that millisecond count up from it (a "monotonic ULID"): one urandom call per
# millisecond instead of one per id, and no per-id base-32 loop (the last 8 characters
# come from a table of character pairs). Unique across processes and restarts like a ULID
# (a fresh random start each millisecond, 2**79 apart on average); unique within a
# process by the counter; sortable by creation time, and in creation order within a process.
_PAIRS = tuple(a + b for a in _CROCKFORD for b in _CROCKFORD)  # 10 bits -> 2 characters
#: The counter part: the low 40 bits of each millisecond's start are at most 2**39, so
#: counting up (2**39 ids within one millisecond is out of reach) never carries into the
#: random bits above them.
_LOW_START = 1 << 39


def _b32(value: int, length: int) -> str:
    chars = []
    for _ in range(length):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


class _IdBlock:
    """The ids of one millisecond of one process: a fixed head, then a counter."""

    __slots__ = ("counter", "head", "ms", "run", "start")

    def __init__(self, ms: int) -> None:
        self.ms = ms
        random = int.from_bytes(os.urandom(10), "big")
        # 10 characters of time and 8 random ones (40 bits), then the 40-bit counter part.
        self.head = _b32(ms, 10) + _b32(random >> 40, 8)
        self.start = random & (_LOW_START - 1)
        self.counter = itertools.count()
        #: (counter value >> 10, the id up to its last two characters) of the 1024 ids
        #: last made: one tuple, replaced whole, so threads always read a matching pair.
        self.run: tuple[int, str] = (-1, "")


_id_block = _IdBlock(-1)
_time_ns = time.time_ns


def _forget_id_block() -> None:
    # A forked child must not go on counting from its parent's block (same ids).
    global _id_block
    _id_block = _IdBlock(-1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_id_block)


def new_job_id() -> str:
    """A new ULID: 26 characters, sortable by creation time, 80 bits after the time.

    Ids are made by the client so that a re-sent enqueue is recognised as the same job.
    Within one millisecond a process counts up from a random start (a monotonic ULID),
    so ids stay unique across processes and restarts and cost no random draw each.
    Thread-safe without a lock: ``next`` on a counter is atomic, and two threads that
    both start a block for the same millisecond draw different random heads.
    """
    global _id_block
    ms = _time_ns() // 1_000_000
    block = _id_block
    if block.ms != ms:
        block = _id_block = _IdBlock(ms)
    n = block.start + next(block.counter)
    run = block.run
    if run[0] != n >> 10:
        high = n >> 10
        run = block.run = (
            high,
            block.head + _PAIRS[high >> 20] + _PAIRS[(high >> 10) & 1023] + _PAIRS[high & 1023],
        )
    return run[1] + _PAIRS[n & 1023]


def new_job_ids(n: int) -> list[str]:
    """``n`` new ids, as ``n`` calls of :func:`new_job_id` would make them (one
    millisecond's block, counting up), at a fraction of the cost: when the counter
    values drawn are consecutive and share their top bits (as a rule), the ids share
    their first 24 characters and differ in the last two."""
    global _id_block
    if n <= 0:
        return []
    ms = _time_ns() // 1_000_000
    block = _id_block
    if block.ms != ms:
        block = _id_block = _IdBlock(ms)
    # Each value drawn is unique (next on a counter is atomic), consecutive unless
    # another thread draws at the same time.
    drawn = list(itertools.islice(block.counter, n))
    first, last = block.start + drawn[0], block.start + drawn[-1]
    high = first >> 10
    if last - first != n - 1 or last >> 10 != high:
        return [_job_id_of(block, block.start + v) for v in drawn]
    head = block.head + _PAIRS[high >> 20] + _PAIRS[(high >> 10) & 1023] + _PAIRS[high & 1023]
    low = first & 1023
    return [head + pair for pair in _PAIRS[low : low + n]]


def _job_id_of(block: _IdBlock, n: int) -> str:
    """The id of counter value ``n`` (start included) of ``block``."""
    high = n >> 10
    return (
        block.head
        + _PAIRS[high >> 20]
        + _PAIRS[(high >> 10) & 1023]
        + _PAIRS[high & 1023]
        + _PAIRS[n & 1023]
    )


def key_job_id(task: str, key: str) -> str:
    """The job id of a job deduplicated by ``key``: ``<task>:<key>``, hashed if needed.

    Task names hold no ``:``, so the ids of two tasks never collide (task ``a`` with key
    ``b.c`` is ``a:b.c``, task ``a.b`` with key ``c`` is ``a.b:c``). A key that fits the
    id grammar is kept readable; any other key (``a@b.c``, long keys, and keys that look
    like a digest) becomes ``<task>:h<32 hex digits of BLAKE2b>``, still deterministic.
    """
    candidate = f"{task}:{key}"
    if _JOB_ID.fullmatch(candidate) is not None and _DIGEST_LIKE.fullmatch(key) is None:
        return candidate
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"{task}:h{digest}"


def partition_queues(queue: str, partitions: int) -> list[str]:
    """The queues a queue split into ``partitions`` is stored as, in partition order:
    ``<queue>.p0`` ... (``[queue]`` itself when ``partitions`` is 1)."""
    if partitions == 1:
        return [queue]
    return [f"{queue}.p{i}" for i in range(partitions)]


def partition_queue(queue: str, partitions: int, job_id: str) -> str:
    """The partition of ``queue`` (split into ``partitions``) that job ``job_id`` goes to.

    A stable hash of the id (BLAKE2b, the same in every process and version), so a
    re-sent enqueue with the same id reaches the same partition and deduplicates there,
    and the key-derived ids of one key (``<task>:<key>``) all keep to one partition.
    The jobs of a schedule's ticks (``schedule:<name>:<tick µs>``) hash by their
    schedule (``schedule:<name>``): every tick of one schedule goes to one partition,
    so its overlap policy finds the previous tick's job, and on Redis Cluster firing
    a tick is one script on one slot (typedq.schedule).
    """
    if partitions == 1:
        return queue
    if job_id.startswith("schedule:"):
        head, sep, tick = job_id.rpartition(":")
        if sep and tick.isascii() and tick.isdigit() and len(head) > len("schedule:"):
            job_id = head
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return f"{queue}.p{int.from_bytes(digest, 'big') % partitions}"
