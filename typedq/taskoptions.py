"""A task's options: its defaults (``@app.task(...)``), and the per-call options of
``enqueue`` that override some of them for one job.

:class:`TaskOptions` holds a task's defaults, checked when the task is declared;
:func:`call_options` checks the per-call options of one ``enqueue`` (or ``message``,
``enqueue_many``) and puts them in envelope form, before anything is encoded or sent.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Final, NamedTuple

import msgspec
from typing_extensions import TypedDict

from .backoff import Backoff
from .errors import ConfigError, InvalidOption
from .names import MAX_PARTITIONS, check_name, partition_queues
from .options import (
    MAX_PRIORITY,
    MAX_RETRIES,
    MAX_SECONDS,
    MIN_PRIORITY,
    check_int_option,
    check_seconds_option,
    where,
)
from .serde import is_model_type

__all__ = [
    "DEFAULT_QUEUE",
    "UNSET",
    "BatchOptions",
    "CallOptions",
    "EnqueueOptions",
    "TaskDefaults",
    "TaskOptions",
    "Unset",
    "call_options",
    "epoch",
]


class Unset(Enum):
    """The type of :data:`UNSET`: "not given, use the task's default" (unlike ``None``)."""

    UNSET = "UNSET"

    def __repr__(self) -> str:
        return "UNSET"


#: Per-call option not given: the task's default applies.
UNSET: Final = Unset.UNSET

DEFAULT_QUEUE: Final = "default"


class BatchOptions(TypedDict, total=False):
    """The per-call options of ``enqueue_many`` (and of ``enqueue``, which takes
    :class:`EnqueueOptions`); each is optional. See :meth:`TaskBase.enqueue`."""

    delay: float | timedelta
    eta: datetime | float | None
    priority: int | Unset


class EnqueueOptions(BatchOptions, total=False):
    """The per-call options of ``enqueue`` and ``message``; each is optional, and one not
    given keeps the task's default. See :meth:`TaskBase.enqueue`."""

    job_id: str | None
    retries: int | Unset
    timeout: float | Unset | None


class TaskDefaults(TypedDict, total=False):
    """The task options ``@app.task(...)`` and ``Producer.task(...)`` both take (a task's
    defaults; see :class:`TaskOptions`). Each is optional: an option not given keeps the
    default of :class:`TaskOptions` (``backoff=None`` too)."""

    queue: str
    retries: int
    backoff: Backoff | None
    timeout: float | None
    priority: int
    errors: tuple[type[Any], ...]
    partitions: int


class TaskOptions(msgspec.Struct, frozen=True, kw_only=True):
    """A task's defaults; per-call options to ``enqueue`` override some of them.

    :param name: the registered name (defaults to the function's ``__name__``)
    :param queue: the queue its jobs go to
    :param retries: retries after the first attempt (so ``retries=3`` runs at most 4 times)
    :param backoff: delay policy between retries
    :param timeout: seconds per attempt; ``None`` for no limit
    :param priority: higher runs first among waiting jobs of the queue
    :param errors: domain error models the handler may raise with ``Reject``
    :param partitions: split the queue into this many sub-queues ``<queue>.p0`` ...
        (1 to :data:`~typedq.names.MAX_PARTITIONS`; 1: the plain queue), each job going
        to the one a stable hash of its id picks; on Redis Cluster they spread over
        shards. Priorities and FIFO hold per partition.
    """

    name: str
    queue: str = DEFAULT_QUEUE
    retries: int = 0
    backoff: Backoff = Backoff()
    timeout: float | None = None
    priority: int = 0
    errors: tuple[type[Any], ...] = ()
    partitions: int = 1

    @classmethod
    def of(cls, name: str, given: TaskDefaults) -> TaskOptions:
        """The options named ``name`` with the defaults ``given`` (the rest as declared here).

        :raises ConfigError: an option out of its range, naming the task and the option
        """
        return cls(
            name=name,
            queue=given.get("queue", DEFAULT_QUEUE),
            retries=given.get("retries", 0),
            backoff=given.get("backoff") or Backoff(),
            timeout=given.get("timeout"),
            priority=given.get("priority", 0),
            errors=tuple(given.get("errors", ())),
            partitions=given.get("partitions", 1),
        )

    def __post_init__(self) -> None:
        check_name("task", self.name)
        check_name("queue", self.queue)
        subject = f"task {self.name!r}"
        check_int_option("retries", self.retries, 0, MAX_RETRIES, subject=subject)
        check_int_option("priority", self.priority, MIN_PRIORITY, MAX_PRIORITY, subject=subject)
        check_int_option("partitions", self.partitions, 1, MAX_PARTITIONS, subject=subject)
        longest = partition_queues(self.queue, self.partitions)[-1]
        if len(longest) > 128:
            raise ConfigError(
                f"{subject}: queue {self.queue!r} is too long for {self.partitions} partitions "
                f"({longest!r} passes 128 characters); use a shorter queue name"
            )
        if self.timeout is not None:
            check_seconds_option("timeout", self.timeout, positive=True, subject=subject)
        for error in self.errors:
            if not is_model_type(error):
                raise ConfigError(
                    f"task {self.name!r}: errors= takes msgspec.Struct or pydantic.BaseModel "
                    f"classes, got {error!r}"
                )


def epoch(eta: datetime | float, subject: str) -> float:
    """``eta`` in epoch seconds, checked (an aware datetime, or a number in range).

    :raises InvalidOption: a naive datetime, or a time out of range
    """
    if isinstance(eta, datetime):
        if eta.tzinfo is None:
            raise InvalidOption(
                f"{where(subject)}eta={eta!r} is a naive datetime; pass an aware one, e.g. "
                "datetime.now(timezone.utc) + timedelta(minutes=5)"
            )
        seconds = eta.timestamp()
        if not 0 <= seconds <= MAX_SECONDS:
            raise InvalidOption(
                f"{where(subject)}eta={eta!r} is out of range: use a time from 1970 to "
                f"{datetime.fromtimestamp(MAX_SECONDS).year}"
            )
        return seconds
    return check_seconds_option("eta", eta, subject=subject, unit="epoch seconds")


class CallOptions(NamedTuple):
    """One call's options, checked and in envelope form (see :func:`call_options`)."""

    delay: float
    eta: float
    priority: int
    max_retries: int
    timeout: float


def call_options(
    defaults: TaskOptions,
    options: BatchOptions,
    retries: int | Unset,
    timeout: float | Unset | None,
) -> CallOptions:
    """The per-call options, checked and in envelope form (not given: the defaults).

    :param defaults: the task's options (its priority, and its name for the messages)
    :raises InvalidOption: a number out of its range, naming the task and the option
    """
    subject = f"task {defaults.name!r}"
    delay_s = check_seconds_option("delay", options.get("delay", 0.0), subject=subject)
    eta = options.get("eta")
    eta_s = 0.0 if eta is None else epoch(eta, subject)
    priority = options.get("priority", UNSET)
    prio = (
        defaults.priority
        if isinstance(priority, Unset)
        else check_int_option("priority", priority, MIN_PRIORITY, MAX_PRIORITY, subject=subject)
    )
    max_retries = (
        -1
        if isinstance(retries, Unset)
        else check_int_option("retries", retries, 0, MAX_RETRIES, subject=subject)
    )
    if isinstance(timeout, Unset):
        timeout_s = -1.0
    elif timeout is None:
        timeout_s = 0.0
    else:
        timeout_s = check_seconds_option("timeout", timeout, positive=True, subject=subject)
    return CallOptions(delay_s, eta_s, prio, max_retries, timeout_s)
