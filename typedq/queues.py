"""The queues of a set of tasks: partitions checked against limits and against each
other, queue lists expanded into partitions, and unknown queues refused."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .names import partition_queues

if TYPE_CHECKING:
    from .task import TaskBase
    from .taskoptions import TaskOptions

__all__ = ["check_limits_partitions", "check_partitions", "check_queues", "expand_queues"]


def check_limits_partitions(
    options: TaskOptions, rate_limit: object | None, concurrency: object | None
) -> None:
    """Refuse a limit on a partitioned task: each partition is a queue of its own (on
    Redis Cluster, on a shard of its own), and a claim counts a limit in its queue, so P
    partitions would let P times the limit through (issue 24)."""
    if options.partitions == 1 or (rate_limit is None and concurrency is None):
        return
    which = "rate_limit" if rate_limit is not None else "concurrency"
    raise ConfigError(
        f"task {options.name!r}: {which}= cannot be combined with partitions="
        f"{options.partitions}: each partition is a queue of its own, so the limit would be "
        "counted per partition; drop partitions= (a limit already paces the task), or move "
        "the limit to an unpartitioned task"
    )


def check_partitions(new: TaskOptions, others: Iterable[TaskOptions]) -> None:
    """Refuse a task whose queue clashes with the partitions of the app's other tasks.

    Tasks sharing a queue must split it alike, and no task's queue may be a partition
    of another task's partitioned queue (``<queue>.p<n>`` is reserved for those).

    :raises ConfigError: naming both tasks and the fix
    """
    for other in others:
        if other.queue == new.queue and other.partitions != new.partitions:
            raise ConfigError(
                f"task {new.name!r}: queue {new.queue!r} has partitions={other.partitions} "
                f"for task {other.name!r}; give every task of a queue the same partitions="
            )
        for a, b in ((new, other), (other, new)):
            if a.partitions > 1 and b.queue in partition_queues(a.queue, a.partitions):
                raise ConfigError(
                    f"task {b.name!r}: queue {b.queue!r} is a partition of task {a.name!r}'s "
                    f"queue {a.queue!r} (partitions={a.partitions}); rename the queue"
                )


def expand_queues(tasks: Iterable[TaskBase[Any, Any]], queues: Iterable[str]) -> list[str]:
    """``queues`` with each partitioned queue of ``tasks`` replaced by its partitions
    (``["emails"]`` -> ``["emails.p0", ..., "emails.p7"]``), without repeats."""
    split = {t.queue: t.queues for t in tasks if t.options.partitions > 1}
    out: dict[str, None] = {}
    for queue in queues:
        out.update(dict.fromkeys(split.get(queue, [queue])))
    return list(out)


def check_queues(
    tasks: Iterable[TaskBase[Any, Any]], queues: Iterable[str], *, app: str, insist: str
) -> None:
    """Refuse a queue no task of ``tasks`` stores jobs in (a typo runs nothing, quietly).

    A partitioned queue is known by its name and by each partition's.

    :param app: the app's name, for the message
    :param insist: how to take jobs from such a queue anyway (a flag, an argument)
    :raises ConfigError: one line naming the unknown queues, the known ones and ``insist``
    """
    tasks = list(tasks)
    known = {t.queue for t in tasks} | {q for t in tasks for q in t.queues}
    unknown = [q for q in dict.fromkeys(queues) if q not in known]
    if unknown:
        names = ", ".join(repr(q) for q in unknown)
        declared = ", ".join(sorted({t.queue for t in tasks})) or "none"
        raise ConfigError(
            f"{'queue' if len(unknown) == 1 else 'queues'} {names} "
            f"{'is' if len(unknown) == 1 else 'are'} used by no task of app {app!r} "
            f"(its queues: {declared}); check the spelling, or pass {insist} to take "
            "jobs from it anyway"
        )
