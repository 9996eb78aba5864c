"""Flow control: rate limits and per-key concurrency limits, enforced in the broker.

``@app.task(rate_limit=RateLimit(100, per=1.0))`` caps how often the task's jobs
*start*, across every worker of every process; ``RateLimit(5, per=1.0, key=lambda m:
m.tenant)`` does so per tenant. ``@app.task(concurrency=ConcurrencyLimit(2, key=lambda
m: m.customer))`` caps how many of them *run* at once per customer. A handler that meets
an external rate limit (HTTP 429) raises :class:`RateLimited` to be put back, delayed,
without spending an attempt.

How it is enforced (see docs/limits.md for the whole story):

- The key is computed where the job is made (the producer) and travels in the
  envelope (``JobMessage.rate_key`` / ``concurrency_key``); a job made without it
  (a generated producer stub cannot run the key function) falls into the task's shared
  bucket ``""``, which is conservative: that bucket's limit also bounds every key in it.
- Each worker tells its broker the limits of the tasks it runs (:class:`LimitSpec`,
  :meth:`typedq.broker.base.Broker.set_limits`); the broker checks them inside the
  claim (one Lua script on Redis, the same critical section on the embedded broker),
  so a job is never claimed and put back. A job whose limit is closed is *parked* by
  its gate and the claim goes on with other jobs; the claim's answer says when the
  earliest gate opens and the worker sleeps exactly that long. A concurrency gate opens
  when a slot is released (complete, fail, release, stall recovery, removal).

The rate algorithm is an exact sliding window (a log of start times), on the broker's
clock in integer microseconds. A bucket keeps the start times of its last ``per``
seconds; a job may start at ``now`` only while fewer than ``limit`` starts lie in
``(now - per, now]``, and its start is added. Claim: no half-open window
``[t, t + per)`` ever holds more than ``limit`` starts. Proof: if one held ``limit + 1``,
take the last of them, ``s``; the other ``limit`` lie in ``[t, s]``, inside
``(s - per, s]`` because ``t > s - per``, so ``s`` was refused. This holds right after an
idle period too: a token bucket of capacity ``limit`` (or GCRA with a burst) lets
``limit`` start at the end of one window and ``limit`` more as it refills, up to
``2 * limit - 1`` in one window, the edge burst users of rate-limited APIs get 429s
for. Unlike GCRA with no burst (one start every ``per / limit`` seconds, at most one per
claim), it lets a claim start up to ``limit`` jobs at once, so a limit that does not
bind costs one sorted-set write per start and never slows a worker to one job per
round trip. State: at most ``limit`` start times per bucket, only for buckets that
started a job in the last ``per`` seconds (the key expires after ``per``).

``burst=b`` (opt-in, default 0) relaxes the invariant: up to ``limit + b`` starts in a
window of ``per`` seconds.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import msgspec

from .errors import ConfigError
from .names import key_job_id

__all__ = [
    "ConcurrencyLimit",
    "LimitSpec",
    "RateLimit",
    "RateLimited",
    "limit_key",
]

M = TypeVar("M", contravariant=True)

#: The most starts per window, or jobs running per key, one limit may allow.
MAX_LIMIT = 1_000_000
#: The longest rate window, in seconds (one year).
MAX_PER = 366 * 24 * 3600.0

_MICRO = 1_000_000


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


#: The most a start's spacing adds to ``per / limit`` for the delay between a claim and
#: its handler's start (RateLimit.spacing_us).
SPACING_ALLOWANCE_US = 50_000


class RateLimit(Generic[M]):
    """At most ``limit`` job starts per ``per`` seconds, shared by every worker.

    :param limit: starts allowed per window (an int from 1 to 1,000,000)
    :param per: the window in seconds (a finite number above 0, at most a year)
    :param key: a function of the task's input model; each key value gets its own
        limit (``key=lambda m: m.tenant``). Checked by mypy against the handler's input
        type with the typedq mypy plugin.
    :param burst: opt-in relaxation: extra starts a window may hold (default 0: no
        window of ``per`` seconds ever sees more than ``limit`` starts; with ``burst=b``
        up to ``limit + b``)

    Checked when the task is declared: bad values raise :class:`~typedq.errors.ConfigError`.
    """

    __slots__ = ("burst", "key", "limit", "per")

    def __init__(
        self,
        limit: int,
        *,
        per: float = 1.0,
        key: Callable[[M], str | int] | None = None,
        burst: int = 0,
    ) -> None:
        self.limit = limit
        self.per = per
        self.key = key
        self.burst = burst

    def __repr__(self) -> str:
        keyed = ", key=..." if self.key is not None else ""
        burst = f", burst={self.burst}" if self.burst != 0 else ""
        return f"RateLimit({self.limit!r}, per={self.per!r}{keyed}{burst})"

    def check(self, task: str) -> None:
        """Raise ConfigError naming ``task`` and the fix if a value is out of range."""
        where = f"task {task!r}: rate_limit={self!r}"
        if not _is_int(self.limit) or not 1 <= int(self.limit) <= MAX_LIMIT:
            raise ConfigError(
                f"{where}: limit must be an int from 1 to {MAX_LIMIT}, got {self.limit!r} "
                "(e.g. RateLimit(100, per=1.0))"
            )
        if (
            not _is_number(self.per)
            or not (0 < float(self.per) <= MAX_PER)
            or not math.isfinite(float(self.per))
        ):
            raise ConfigError(
                f"{where}: per must be a number of seconds above 0 and at most {MAX_PER:.0f}, "
                f"got {self.per!r} (e.g. per=1.0)"
            )
        if not _is_int(self.burst) or not 0 <= int(self.burst) <= MAX_LIMIT:
            raise ConfigError(
                f"{where}: burst must be an int from 0 to {MAX_LIMIT}, got {self.burst!r} "
                "(leave it out for the strict default)"
            )
        if self.key is not None and not callable(self.key):
            raise ConfigError(
                f"{where}: key must be a function of the input model, e.g. key=lambda m: m.tenant"
            )

    @property
    def per_us(self) -> int:
        """The window in microseconds, rounded up (never more starts than asked)."""
        return max(1, math.ceil(float(self.per) * _MICRO))

    @property
    def spacing_us(self) -> tuple[int, int]:
        """The turns of the starts (microseconds): one every ``spacing``, each taken at
        most ``early`` before its turn; ``(0, 0)`` with ``burst``.

        Without ``burst=``, starts are spread one every ``(per + 2 * a) / limit`` instead
        of ``limit`` at once at each window's start, so the limit holds where handlers
        start, not only where the claim counts them. ``a = min(50 ms, per / 10)``: a start
        may be taken up to ``a`` before its turn (one claim takes several starts of a
        fast limit) and reach its handler up to ``a`` after its claim, and no window of
        ``per`` seconds still sees more than ``limit`` starts. It costs that share of
        throughput: ``RateLimit(50, per=1)`` runs at about 45.5 starts a second. With
        ``limit`` so small that the spacing would pass ``per``, starts are ``per`` apart
        and none is taken early.
        """
        if self.burst:
            return 0, 0
        per = self.per_us
        allowance = min(SPACING_ALLOWANCE_US, per // 10)
        spacing = math.ceil((per + 2 * allowance) / int(self.limit))
        if spacing > per:
            return per, 0
        return spacing, allowance


class ConcurrencyLimit(Generic[M]):
    """At most ``limit`` jobs of the task running at once (per key), across all workers.

    A running job holds its slot through its lease: completing, failing, being handed
    back, or losing its lease (worker killed, recovered as stalled) frees it.

    :param limit: jobs running at once per key (an int from 1 to 1,000,000)
    :param key: a function of the task's input model (``key=lambda m: m.customer``);
        without it the limit is task-wide. Checked by mypy with the typedq plugin.
    """

    __slots__ = ("key", "limit")

    def __init__(self, limit: int, *, key: Callable[[M], str | int] | None = None) -> None:
        self.limit = limit
        self.key = key

    def __repr__(self) -> str:
        keyed = ", key=..." if self.key is not None else ""
        return f"ConcurrencyLimit({self.limit!r}{keyed})"

    def check(self, task: str) -> None:
        """Raise ConfigError naming ``task`` and the fix if a value is out of range."""
        where = f"task {task!r}: concurrency={self!r}"
        if not _is_int(self.limit) or not 1 <= int(self.limit) <= MAX_LIMIT:
            raise ConfigError(
                f"{where}: limit must be an int from 1 to {MAX_LIMIT}, got {self.limit!r} "
                "(e.g. ConcurrencyLimit(2, key=lambda m: m.customer))"
            )
        if self.key is not None and not callable(self.key):
            raise ConfigError(
                f"{where}: key must be a function of the input model, e.g. key=lambda m: m.customer"
            )


def check_limit_option(task: str, option: str, value: object, kind: type[Any]) -> None:
    """Raise ConfigError unless ``value`` is None or a checked ``kind`` instance."""
    if value is None:
        return
    if not isinstance(value, kind):
        raise ConfigError(
            f"task {task!r}: {option}= takes a typedq.{kind.__name__}(...), got {value!r}"
        )
    value.check(task)


class LimitSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What a broker needs to know of one task's limits (the worker registers it).

    :param rate: starts allowed per window and bucket, ``limit + burst`` (0: no rate limit)
    :param per_us: the window in microseconds
    :param concurrency: jobs running at once per key (0: no concurrency limit)
    :param spacing_us: the time between two starts of one bucket (0: none, with
        ``burst=``; see :attr:`RateLimit.spacing_us`)
    :param early_us: how much earlier than its turn a start may be taken (so one claim
        takes several of a fast limit's starts)
    """

    rate: int = 0
    per_us: int = 0
    concurrency: int = 0
    spacing_us: int = 0
    early_us: int = 0

    @classmethod
    def of(
        cls, rate: RateLimit[Any] | None, concurrency: ConcurrencyLimit[Any] | None
    ) -> LimitSpec | None:
        """The spec of a task's declared limits, or None when it declares none."""
        if rate is None and concurrency is None:
            return None
        return cls(
            rate=int(rate.limit) + int(rate.burst) if rate is not None else 0,
            per_us=rate.per_us if rate is not None else 0,
            concurrency=int(concurrency.limit) if concurrency is not None else 0,
            spacing_us=rate.spacing_us[0] if rate is not None else 0,
            early_us=rate.spacing_us[1] if rate is not None else 0,
        )


def limit_key(task: str, fn: Callable[[Any], Hashable] | None, payload: Any) -> str:
    """The bucket key of one job: ``""`` without a key function, else the function's
    value as text (kept readable when it fits ``[A-Za-z0-9_.:-]``, else hashed), so any
    value becomes a bounded, Redis-key-safe name."""
    if fn is None:
        return ""
    value = fn(payload)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TypeError(
            f"task {task!r}: a limit key function must return a str or an int, "
            f"got {type(value).__name__}"
        )
    return key_job_id(task, str(value)).partition(":")[2]


class RateLimited(Exception):
    """Raise from a handler that met an external rate limit (HTTP 429).

    The job goes back to the queue and runs again after ``retry_after`` seconds;
    the attempt is not spent (``retries=`` budgets only real failures), and the
    attempt is recorded as the job's last error with type ``RateLimited``.

    :param retry_after: seconds to wait (e.g. the response's ``Retry-After``), a finite
        number >= 0
    :param message: recorded with the attempt
    """

    def __init__(self, retry_after: float, message: str = "rate limited") -> None:
        super().__init__(message)
        if not _is_number(retry_after) or not (0 <= float(retry_after) < math.inf):
            raise ValueError(
                f"RateLimited(retry_after=...) must be a finite number >= 0, got {retry_after!r}"
            )
        self.retry_after = float(retry_after)
