"""Retry backoff policies: fixed or exponential, with jitter."""

from __future__ import annotations

import random
from typing import Literal

import msgspec

from .errors import InvalidOption
from .options import MAX_SECONDS

__all__ = ["Backoff"]


class Backoff(msgspec.Struct, frozen=True, kw_only=True):
    """How long to wait before retry number ``n`` (1 for the first retry).

    ``exponential``: ``base * factor ** (n - 1)``, capped at ``max``; ``fixed``: ``base``.
    ``jitter`` takes up to that fraction off each delay at random, so retries of
    many jobs that failed together do not arrive together.

    :param kind: ``"exponential"`` or ``"fixed"``
    :param base: the first delay, in seconds
    :param factor: growth per retry (exponential only)
    :param max: the largest delay, in seconds (exponential only)
    :param jitter: fraction in [0, 1] of random reduction
    """

    kind: Literal["fixed", "exponential"] = "exponential"
    base: float = 1.0
    factor: float = 2.0
    max: float = 300.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        # NaN fails every comparison, so the ranges are written to let only good values in;
        # an infinite base or max would make an infinite retry delay.
        limit = MAX_SECONDS
        if not (
            0 <= self.base <= limit
            and 0 <= self.max <= limit
            and 1 <= self.factor <= limit
            and 0 <= self.jitter <= 1
        ):
            raise InvalidOption(
                f"Backoff needs finite base and max from 0 to {limit:.0f} s, factor from 1 to "
                f"{limit:.0f} and 0 <= jitter <= 1, got {self!r}"
            )

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1-based)."""
        if self.kind == "fixed":
            raw = self.base
        else:
            raw = min(self.max, self.base * self.factor ** min(max(0, retry - 1), 64))
        return raw * (1.0 - self.jitter * random.random())
