"""Unique windows and debounce: the task options and their checks (docs/flow-control.md).

``@app.task(key=lambda m: m.order_id, unique_for=timedelta(hours=1))`` keeps one job per
key: an enqueue of a key whose job is pending or running, or COMPLETED less than an hour
ago, returns that job (``created`` False). ``@app.task(debounce=Debounce(key=..., wait=2,
max_wait=30))`` collapses a burst of enqueues of one key into one job that runs ``wait``
after the last of them, with its payload, and at the latest ``max_wait`` after the first.

The key functions run at the producer; the broker keeps the markers atomically with the
jobs (capability :class:`~typedq.broker.capabilities.FlowControl`; the rules are in
:mod:`typedq.broker.memory.control`). Tasks without these options pay nothing: their
enqueue never comes here.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Generic, TypeVar

from .broker.base import EnqueueControl
from .errors import ConfigError, InvalidOption
from .names import key_job_id
from .options import MAX_SECONDS

__all__ = ["Debounce", "FlowControlSpec", "check_flow_control"]

#: The input model the key function reads (contravariant, as the limits' key functions).
M = TypeVar("M", contravariant=True)


def _seconds(value: object) -> float | None:
    """``value`` as seconds (a real number or a timedelta), None when it is neither."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    return float(value)


class Debounce(Generic[M]):
    """Collapse enqueues of one key: the job runs ``wait`` seconds after the last enqueue
    of its key, with the last payload, and at most ``max_wait`` after the first.

    :param key: a function of the task's input model giving the key (a str or an int);
        checked by mypy against the handler's input type with the typedq mypy plugin
    :param wait: seconds of quiet before the job runs (above 0)
    :param max_wait: the longest a job waits from its first enqueue (at least ``wait``);
        default: no bound beyond :data:`~typedq.options.MAX_SECONDS`

    Checked when the task is declared: bad values raise :class:`~typedq.errors.ConfigError`.
    """

    __slots__ = ("key", "max_wait", "wait")

    def __init__(
        self,
        *,
        key: Callable[[M], str | int],
        wait: float | timedelta,
        max_wait: float | timedelta | None = None,
    ) -> None:
        self.key = key
        self.wait = wait
        self.max_wait = max_wait

    def __repr__(self) -> str:
        return f"Debounce(key=..., wait={self.wait!r}, max_wait={self.max_wait!r})"


class FlowControlSpec:
    """A task's unique window or debounce, checked: what its enqueues send the broker.

    :param task: the task's name (for messages and markers)
    :param key: the key function (``key=``, or the debounce's)
    :param unique_for: the unique window in seconds (0: a debounce)
    :param wait: the debounce's wait (0: a unique window)
    :param max_wait: the debounce's bound from the first enqueue
    """

    __slots__ = ("key", "max_wait", "task", "unique_for", "wait")

    def __init__(
        self,
        task: str,
        key: Callable[[Any], object],
        *,
        unique_for: float = 0.0,
        wait: float = 0.0,
        max_wait: float = 0.0,
    ) -> None:
        self.task = task
        self.key = key
        self.unique_for = unique_for
        self.wait = wait
        self.max_wait = max_wait

    def control(self, payload: Any) -> EnqueueControl:
        """The control of one enqueue of ``payload``: its key, computed here.

        :raises InvalidOption: the key function raised, or returned no str or int
        """
        try:
            value = self.key(payload)
        except Exception as exc:
            said = " ".join(str(exc).split())  # one line, whatever the exception says
            raise InvalidOption(
                f"task {self.task!r}: the key function raised {type(exc).__name__}: {said}; "
                "nothing was enqueued (fix the key function or the payload)"
            ) from exc
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise InvalidOption(
                f"task {self.task!r}: the key function returned {type(value).__name__}, not a "
                "str or an int; nothing was enqueued (return e.g. str(m.order_id))"
            )
        if value == "":
            raise InvalidOption(
                f"task {self.task!r}: the key function returned an empty key; nothing was "
                "enqueued (return a non-empty str, or an int)"
            )
        key = key_job_id(self.task, str(value)).partition(":")[2]
        return EnqueueControl(
            key=key, unique_for=self.unique_for, wait=self.wait, max_wait=self.max_wait
        )


def check_flow_control(
    task: str,
    key: Callable[[Any], object] | None,
    unique_for: object,
    debounce: object,
    partitions: int,
) -> FlowControlSpec | None:
    """The task's unique window or debounce, checked (None: neither).

    :raises ConfigError: one line naming the option and the fix
    """
    if unique_for is None and debounce is None:
        return None
    where = f"task {task!r}"
    if unique_for is not None and debounce is not None:
        raise ConfigError(
            f"{where}: unique_for= and debounce= do not combine (a debounced job is "
            "already one per key); pick one"
        )
    if partitions != 1:
        raise ConfigError(
            f"{where}: unique_for= and debounce= need one queue per task (a key's marker "
            f"lives in it); drop partitions={partitions}"
        )
    if unique_for is not None:
        if key is None:
            raise ConfigError(
                f"{where}: unique_for= needs key= (the function giving each job's key), "
                "e.g. @app.task(key=lambda m: m.order_id, unique_for=timedelta(hours=1))"
            )
        window = _seconds(unique_for)
        if window is None or not (math.isfinite(window) and 0 < window <= MAX_SECONDS):
            raise ConfigError(
                f"{where}: unique_for={unique_for!r} must be a timedelta or seconds above 0 "
                f"and at most {MAX_SECONDS:.0f}"
            )
        return FlowControlSpec(task, key, unique_for=window)
    if not isinstance(debounce, Debounce):
        raise ConfigError(
            f"{where}: debounce= takes a typedq.Debounce(key=..., wait=..., max_wait=...), "
            f"got {debounce!r}"
        )
    if key is not None:
        raise ConfigError(
            f"{where}: debounce= takes its own key (Debounce(key=...)); drop the task's key="
        )
    if not callable(debounce.key):
        raise ConfigError(f"{where}: Debounce(key=...) must be a function of the input model")
    wait = _seconds(debounce.wait)
    if wait is None or not (math.isfinite(wait) and 0 < wait <= MAX_SECONDS):
        raise ConfigError(
            f"{where}: Debounce(wait={debounce.wait!r}) must be a timedelta or seconds above "
            f"0 and at most {MAX_SECONDS:.0f}"
        )
    max_wait = MAX_SECONDS if debounce.max_wait is None else _seconds(debounce.max_wait)
    if max_wait is None or not (math.isfinite(max_wait) and 0 < max_wait <= MAX_SECONDS):
        raise ConfigError(
            f"{where}: Debounce(max_wait={debounce.max_wait!r}) must be a timedelta or "
            f"seconds above 0 and at most {MAX_SECONDS:.0f}"
        )
    if wait > max_wait:
        raise ConfigError(
            f"{where}: Debounce(wait={debounce.wait!r}) is longer than max_wait="
            f"{debounce.max_wait!r}; use a max_wait of at least wait"
        )
    return FlowControlSpec(task, debounce.key, wait=wait, max_wait=max_wait)
