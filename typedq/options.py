"""The ranges of the numeric job options, checked at the producer before anything is sent.

``delay=nan``, ``eta=inf``, ``priority=2**64`` or ``retries=-1`` never reach a broker:
each is refused with a one-line :class:`~typedq.errors.InvalidOption` naming the option,
the value and the allowed range. Every bound is exact in a double (Redis' Lua numbers),
also as microseconds for the times, so both brokers store exactly what was asked.

The same checks run for ``@app.task(...)`` and ``Producer.task(...)`` options, for every
``enqueue`` and, on envelopes built by hand, in ``Client.enqueue`` / ``enqueue_many``.
The brokers' own ``enqueue``, ``enqueue_batches`` and ``enqueue_flows`` check the numbers
of what they are handed too (:func:`check_numbers`, a few comparisons per envelope), so
an envelope built by hand and given to a broker directly gets the same one-line error on
every broker (the Redis encoder cannot store ``priority=2**70``: msgpack ints stop at
64 bits; the embedded broker would have stored it).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Iterable
from datetime import timedelta
from typing import Final

from .broker.base import EnqueueControl, JobMessage
from .errors import InvalidOption
from .names import check_job_id, check_name

__all__ = [
    "MAX_PRIORITY",
    "MAX_RETRIES",
    "MAX_SECONDS",
    "MIN_PRIORITY",
    "check_int_option",
    "check_message",
    "check_controls",
    "check_numbers",
    "check_seconds_option",
]

#: The lowest priority (signed 32-bit).
MIN_PRIORITY: Final = -(2**31)
#: The highest priority (signed 32-bit).
MAX_PRIORITY: Final = 2**31 - 1
#: The most retries a task or a job may ask for.
MAX_RETRIES: Final = 2**31 - 1
#: A limit key in an envelope (``""``: the task-wide bucket); limit_key() makes them.
_LIMIT_KEY = re.compile(r"[A-Za-z0-9_.:-]{0,200}")

#: The longest delay or timeout, and the latest eta (epoch seconds): about 126 years.
MAX_SECONDS: Final = 4_000_000_000.0


def where(subject: str | None) -> str:
    """The ``<subject>: `` prefix of an error message (``task 'send'``), or nothing."""
    return f"{subject}: " if subject else ""


def check_int_option(
    option: str, value: object, low: int, high: int, *, subject: str | None = None
) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``, else raise InvalidOption."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise InvalidOption(
            f"{where(subject)}{option}={value!r} is not an integer: use an int from {low} to {high}"
        )
    if not low <= int(value) <= high:
        raise InvalidOption(
            f"{where(subject)}{option}={value!r} is out of range: use {low} to {high}"
        )
    return int(value)


def check_seconds_option(
    option: str,
    value: object,
    *,
    positive: bool = False,
    subject: str | None = None,
    unit: str = "seconds",
) -> float:
    """``value`` (a number or a timedelta) as finite seconds in range, else raise InvalidOption.

    The range is ``[0, MAX_SECONDS]``, or ``(0, MAX_SECONDS]`` when ``positive``.
    """
    lowest = "above 0" if positive else "from 0"
    allowed = f"a finite number of {unit} {lowest} to {MAX_SECONDS:.0f}"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidOption(f"{where(subject)}{option}={value!r} is not a number: use {allowed}")
    else:
        seconds = float(value)
    in_range = seconds > 0 if positive else seconds >= 0
    if not (math.isfinite(seconds) and in_range and seconds <= MAX_SECONDS):
        raise InvalidOption(f"{where(subject)}{option}={value!r} is out of range: use {allowed}")
    return seconds


def check_message(message: JobMessage) -> JobMessage:
    """Check an envelope's id, names and numbers (built by hand, or by a task).

    ``max_retries`` may also be ``-1`` and ``timeout`` ``-1`` or ``0`` (the task's
    default / no limit), as :meth:`~typedq.task.TaskBase.message` makes them.

    :raises InvalidName, InvalidOption: naming the job and the field
    """
    check_job_id(message.id)
    check_name("task", message.task)
    check_name("queue", message.queue)
    what = f"job {message.id!r} of task {message.task!r}"
    check_int_option("priority", message.priority, MIN_PRIORITY, MAX_PRIORITY, subject=what)
    check_seconds_option("eta", message.eta, subject=what, unit="epoch seconds")
    check_seconds_option("delay", message.delay, subject=what)
    if message.max_retries != -1:
        check_int_option("max_retries", message.max_retries, 0, MAX_RETRIES, subject=what)
    if message.timeout not in (-1.0, 0.0):
        check_seconds_option("timeout", message.timeout, positive=True, subject=what)
    for field in ("rate_key", "concurrency_key"):
        value = getattr(message, field)
        if not (isinstance(value, str) and _LIMIT_KEY.fullmatch(value)):
            raise InvalidOption(
                f"{what}: {field}={value!r} is not a limit key: use up to 200 characters "
                "from A-Z a-z 0-9 _ . : - (typedq.limits.limit_key makes one from any value)"
            )
    return message


def check_numbers(messages: Iterable[JobMessage]) -> None:
    """Refuse envelopes whose numbers are out of range, as :func:`check_message` does
    (same error), before a broker stores or encodes anything of the call.

    The envelopes a task or a client makes were checked already; this is the cheap pass
    (comparisons only; NaN fails every one) for those handed to a broker directly.

    :raises InvalidOption: naming the job, the field, the value and the allowed range
    """
    for m in messages:
        p, r, t = m.priority, m.max_retries, m.timeout
        try:
            ok = (
                type(p) is int
                and MIN_PRIORITY <= p <= MAX_PRIORITY
                and type(r) is int
                and -1 <= r <= MAX_RETRIES
                and 0.0 <= m.eta <= MAX_SECONDS
                and 0.0 <= m.delay <= MAX_SECONDS
                and (t == -1.0 or 0.0 <= t <= MAX_SECONDS)
            )
        except TypeError:  # not a number at all
            ok = False
        if not ok:
            check_message(m)  # raises with the field's own message


def check_controls(items: Iterable[tuple[JobMessage, EnqueueControl]]) -> None:
    """Refuse keyed enqueues (capability FlowControl) whose control is malformed, before a
    broker stores anything of the call: a key that is no limit key, both or neither of a
    unique window and a debounce, or times out of range. (A task's controls are made
    right by :mod:`typedq.flowcontrol`; this is for ones built by hand.)

    :raises InvalidOption: naming the job and the field
    """
    for m, c in items:
        what = f"job {m.id!r} of task {m.task!r}"
        if not (c.key and _LIMIT_KEY.fullmatch(c.key)):
            raise InvalidOption(
                f"{what}: control key={c.key!r} is not a key: use 1 to 200 characters from "
                "A-Z a-z 0-9 _ . : - (typedq.limits.limit_key makes one from any value)"
            )
        if (c.unique_for > 0) == (c.wait > 0):
            raise InvalidOption(
                f"{what}: a control is a unique window (unique_for > 0) or a debounce "
                f"(wait > 0), not {'both' if c.wait > 0 else 'neither'}"
            )
        if c.unique_for > 0:
            check_seconds_option("unique_for", c.unique_for, positive=True, subject=what)
        else:
            check_seconds_option("wait", c.wait, positive=True, subject=what)
            check_seconds_option("max_wait", c.max_wait, positive=True, subject=what)
            if c.wait > c.max_wait:
                raise InvalidOption(f"{what}: wait={c.wait} passes max_wait={c.max_wait}")
