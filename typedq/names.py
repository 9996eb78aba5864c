"""The grammar for every name that becomes part of a broker key.

Names are checked once, where they enter (App, task registration, enqueue), so no
broker ever builds a key from an unchecked string: no braces (Redis Cluster hash
tags), glob characters, whitespace or control bytes. Names (app, queue, task) hold no
``:`` either; job ids may (``order:123``): an id is only ever the last part of a key
(``...j:<id>``), and key-derived ids are ``<task>:<key>``, so the ``:`` after the task
name keeps every task's ids apart.

A partitioned queue (``@app.task(queue="emails", partitions=8)``) is stored as the
sub-queues ``emails.p0`` ... ``emails.p7``; :func:`partition_queue` picks one from a
stable hash of the job id. The form ``<queue>.p<n>`` is reserved for the partitions
of a partitioned queue ``<queue>`` (the app refuses a task queue named so).
"""

from __future__ import annotations

import hashlib
import os
import re
import time

from .errors import InvalidName

__all__ = [
    "MAX_PARTITIONS",
    "check_job_id",
    "check_name",
    "check_worker_id",
    "key_job_id",
    "new_job_id",
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


def check_worker_id(worker_id: object) -> str:
    """Return ``worker_id`` if it fits ``[A-Za-z0-9][A-Za-z0-9_.:-]{0,299}`` (a host name,
    a pid and hex digits: ``Worker.id``), else raise InvalidName."""
    if not (isinstance(worker_id, str) and _WORKER_ID.fullmatch(worker_id)):
        raise InvalidName(
            f"invalid worker id {worker_id!r}: use 1-300 characters from A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return worker_id


def new_job_id() -> str:
    """A new ULID: 26 characters, sortable by creation time, 80 random bits.

    Ids are made by the client so that a re-sent enqueue is recognised as the same job.
    """
    value = (int(time.time() * 1000) << 80) | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


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
    """
    if partitions == 1:
        return queue
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return f"{queue}.p{int.from_bytes(digest, 'big') % partitions}"
