"""Fair shares: a task's waiting jobs claimed round-robin across keys, not FIFO.

``@app.task(fair=Fair(key=lambda m: m.tenant))``: each key (tenant) is one participant
of its priority level's line, however many jobs it has waiting; a claim that reaches a
key takes its oldest job (``weight`` of them over consecutive turns, see below) and the
key goes back to the tail of the line while it still has jobs. So one tenant enqueuing a
million jobs delays another tenant's one job by at most about one job per active key,
not by a million.

- ``weights={"big": 3}``: key ``"big"`` takes up to 3 jobs per turn (the default
  ``default_weight`` is 1). Weights are ints from 1 to :data:`MAX_WEIGHT`.
- Priorities come first: a higher priority level is served before any lower one, and
  fairness applies among the jobs of one level.
- Limits per key (``RateLimit``/``ConcurrencyLimit``) combine: a job whose gate is
  closed is parked as before and the claim goes on with the next key.
- Like limit keys, the key is computed by the producer (a job made without it, e.g. by
  a generated stub, is an ordinary FIFO job) and travels in the envelope
  (:attr:`~typedq.broker.base.JobMessage.fair_key` and ``fair_weight``).
- Not with ``partitions=`` (each partition is a queue of its own with its own turns):
  refused with :class:`~typedq.errors.ConfigError`.

docs/flow-control.md has the whole story.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

from .errors import ConfigError, InvalidOption
from .limits import limit_key

__all__ = ["MAX_WEIGHT", "Fair", "check_fair"]

M = TypeVar("M", contravariant=True)

#: The largest weight a key may have (jobs one turn takes).
MAX_WEIGHT = 10_000


def _is_weight(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WEIGHT


class Fair(Generic[M]):
    """Claim the task's waiting jobs round-robin across the values of ``key``.

    :param key: a function of the task's input model giving the key (a str or an int);
        checked by mypy against the handler's input type with the typedq mypy plugin
    :param weights: key value -> how many of its jobs one turn takes (an int from 1 to
        :data:`MAX_WEIGHT`); keys not named take ``default_weight``
    :param default_weight: the weight of every other key (default 1)

    Checked when the task is declared: bad values raise :class:`~typedq.errors.ConfigError`.
    """

    __slots__ = ("default_weight", "key", "weights")

    def __init__(
        self,
        *,
        key: Callable[[M], str | int],
        weights: Mapping[str | int, int] | None = None,
        default_weight: int = 1,
    ) -> None:
        self.key = key
        self.weights: Mapping[str | int, int] = dict(weights) if weights is not None else {}
        self.default_weight = default_weight

    def __repr__(self) -> str:
        weights = f", weights={dict(self.weights)!r}" if self.weights else ""
        default = f", default_weight={self.default_weight!r}" if self.default_weight != 1 else ""
        return f"Fair(key=...{weights}{default})"

    def check(self, task: str) -> None:
        """Raise ConfigError naming ``task`` and the fix if a value is out of range."""
        where = f"task {task!r}: fair={self!r}"
        if not callable(self.key):
            raise ConfigError(
                f"{where}: key must be a function of the input model (key=lambda m: m.tenant)"
            )
        if not _is_weight(self.default_weight):
            raise ConfigError(
                f"{where}: default_weight must be an int from 1 to {MAX_WEIGHT}, "
                f"got {self.default_weight!r} (e.g. default_weight=1)"
            )
        for name, weight in self.weights.items():
            if isinstance(name, bool) or not isinstance(name, (str, int)):
                raise ConfigError(
                    f"{where}: weights keys must be key values (str or int), got {name!r}"
                )
            if not _is_weight(weight):
                raise ConfigError(
                    f"{where}: the weight of key {name!r} must be an int from 1 to "
                    f"{MAX_WEIGHT}, got {weight!r} (e.g. weights={{{name!r}: 3}})"
                )

    def share(self, task: str, payload: Any) -> tuple[str, int]:
        """The fair key (as a Redis-key-safe name, like a limit key) and weight of one job.

        :raises InvalidOption: the key function returned no str or int
        """
        value = self.key(payload)
        try:
            key = limit_key(task, lambda _: value, payload)
        except TypeError as e:
            raise InvalidOption(str(e).replace("a limit key", "a fair key")) from None
        return key, self.weights.get(value, self.default_weight)


def check_fair(task: str, fair: object, partitions: int) -> Fair[Any] | None:
    """``fair`` checked: None or a valid :class:`Fair` on an unpartitioned task."""
    if fair is None:
        return None
    if not isinstance(fair, Fair):
        raise ConfigError(f"task {task!r}: fair= takes a typedq.Fair(key=...), got {fair!r}")
    fair.check(task)
    if partitions != 1:
        raise ConfigError(
            f"task {task!r}: fair= cannot be combined with partitions={partitions}: each "
            "partition is a queue of its own with its own turns, so a key would get a turn "
            "per partition; drop partitions= (fair shares already keep one key from "
            "holding the queue), or drop fair="
        )
    return fair
