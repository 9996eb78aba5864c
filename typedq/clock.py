"""The one clock the runtime reads: wall time, monotonic time and sleeping.

Runtime code (worker, settler, scheduler, embedded broker) never calls ``time.time()``,
``time.monotonic()`` or ``anyio.sleep()`` directly; it asks the :class:`Clock` it was given.
Production uses :data:`SYSTEM_CLOCK`; tests pass a :class:`VirtualClock` and move time
with :meth:`VirtualClock.advance`, so a test of a 30-second lease takes no real time.
A bounded wait (a grace period, a backoff cut short by an event) is
:func:`move_on_after` of the clock, not :func:`anyio.move_on_after`.

Two kinds of time, as in the standard library:

- ``time()``: epoch seconds. Delays, ETAs, timestamps, retention: what a user reads.
- ``monotonic()``: seconds from an arbitrary origin that never goes back. Leases,
  heartbeats, intervals: what measures whether a worker is alive.

A virtual clock moves both together.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import anyio
import anyio.lowlevel

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "VirtualClock", "move_on_after"]


@runtime_checkable
class Clock(Protocol):
    """What runtime code reads time through."""

    def time(self) -> float:
        """Wall-clock time, epoch seconds."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (origin unspecified)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time (0 or less: a checkpoint)."""
        ...


class SystemClock:
    """The real clock: :func:`time.time`, :func:`time.monotonic` and :func:`anyio.sleep`."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


#: The clock every runtime object uses unless given another.
SYSTEM_CLOCK: Clock = SystemClock()


class VirtualClock:
    """A clock that moves only when told to; sleepers wake when it passes their deadline.

    ``time()`` and ``monotonic()`` move together by :meth:`advance`. A coroutine in
    :meth:`sleep` wakes once the clock reaches its deadline; :meth:`advance` wakes the
    sleepers it passes, in deadline order, and lets each run up to its next wait.

    :param start: the initial wall time, epoch seconds (default: now)
    """

    def __init__(self, start: float | None = None) -> None:
        self._wall_origin = time.time() if start is None else start
        self._elapsed = 0.0
        #: Pending waits by deadline: sleepers (an event to set) and deadlines of cancel
        #: scopes (:func:`move_on_after`: a callback that cancels the scope).
        self._sleepers: list[VirtualDeadline] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self._wall_origin + self._elapsed

    def monotonic(self) -> float:
        return self._elapsed

    def __call__(self) -> float:
        """The wall time: a virtual clock also serves where a ``() -> float`` is expected."""
        return self.time()

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await anyio.lowlevel.checkpoint()
            return
        wake = anyio.Event()
        entry: VirtualDeadline = (self._elapsed + seconds, next(self._order), wake)
        heapq.heappush(self._sleepers, entry)
        try:
            await wake.wait()
        finally:
            if not wake.is_set():  # cancelled: forget the entry
                self._sleepers.remove(entry)
                heapq.heapify(self._sleepers)

    @contextmanager
    def _deadline(self, seconds: float, scope: anyio.CancelScope) -> Iterator[None]:
        """Cancel ``scope`` once this clock passes ``seconds`` from now (while inside)."""
        entry = self.cancel_after(seconds, scope)
        try:
            yield
        finally:
            self.withdraw(entry)

    def cancel_after(self, seconds: float, scope: anyio.CancelScope) -> VirtualDeadline | None:
        """Cancel ``scope`` once this clock passes ``seconds`` from now, unless the deadline
        is withdrawn first (:meth:`withdraw`). The form of :func:`move_on_after` for a
        scope entered elsewhere (a worker's runner keeps one across its jobs).

        :return: the pending deadline, or None when ``seconds`` has already passed (the
            scope is then cancelled at once)
        """
        if seconds <= 0:
            scope.cancel()
            return None
        entry: VirtualDeadline = (self._elapsed + seconds, next(self._order), _Expiry(scope))
        heapq.heappush(self._sleepers, entry)
        return entry

    def withdraw(self, deadline: VirtualDeadline | None) -> None:
        """Forget a deadline of :meth:`cancel_after` whose scope was left before it
        passed (one that passed already, or None, is ignored)."""
        if deadline is not None and not deadline[2].is_set():
            self._sleepers.remove(deadline)
            heapq.heapify(self._sleepers)

    @property
    def sleepers(self) -> int:
        """How many coroutines are sleeping on this clock (or inside a
        :func:`move_on_after` of it)."""
        return len(self._sleepers)

    def next_deadline(self) -> float | None:
        """Seconds from now until the earliest sleeper wakes (None: nobody sleeps)."""
        if not self._sleepers:
            return None
        return max(0.0, self._sleepers[0][0] - self._elapsed)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking each sleeper whose deadline it passes.

        Sleepers wake in deadline order, time standing at each one's deadline while it
        runs to its next wait, so a loop that sleeps 1 s sees every second of a 10 s
        advance, as it would in real time.
        """
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; got {seconds}")
        target = self._elapsed + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, wake = heapq.heappop(self._sleepers)
            self._elapsed = max(self._elapsed, deadline)
            wake.set()
            await _settle()
        self._elapsed = target
        await _settle()

    def advance_nowait(self, seconds: float) -> None:
        """Move time forward at once and wake every sleeper it passes (no ordering)."""
        if seconds < 0:
            raise ValueError(f"a clock only moves forward; got {seconds}")
        self._elapsed += seconds
        while self._sleepers and self._sleepers[0][0] <= self._elapsed:
            heapq.heappop(self._sleepers)[2].set()

    def __repr__(self) -> str:
        return f"VirtualClock(time={self.time():.6f}, sleepers={len(self._sleepers)})"


class _Wake(Protocol):
    """What a pending wait is woken by: an event for a sleeper, an expiry for a scope."""

    def set(self) -> None: ...
    def is_set(self) -> bool: ...


#: A pending deadline of :meth:`VirtualClock.cancel_after`: (when, order, what it sets).
VirtualDeadline = tuple[float, int, _Wake]


class _Expiry:
    """Cancels a scope when its deadline passes (a :func:`move_on_after` on virtual time)."""

    __slots__ = ("_fired", "_scope")

    def __init__(self, scope: anyio.CancelScope) -> None:
        self._scope = scope
        self._fired = False

    def set(self) -> None:
        self._fired = True
        self._scope.cancel()

    def is_set(self) -> bool:
        return self._fired


@contextmanager
def move_on_after(
    clock: Clock, seconds: float, *, shield: bool = False
) -> Iterator[anyio.CancelScope]:
    """``anyio.move_on_after`` on ``clock``'s time: the block is cancelled once ``seconds``
    of that clock pass (its ``cancelled_caught`` then tells).

    On the system clock this is :func:`anyio.move_on_after` itself (the event loop's own
    deadline); on a :class:`VirtualClock` the deadline passes when the clock is advanced
    past it. Another clock is read as real time.
    """
    if isinstance(clock, VirtualClock):
        with anyio.CancelScope(shield=shield) as scope, clock._deadline(seconds, scope):
            yield scope
        return
    with anyio.move_on_after(seconds, shield=shield) as scope:
        yield scope


async def _settle(rounds: int = 8) -> None:
    """Let woken tasks run until they block again (a few scheduler rounds)."""
    for _ in range(rounds):
        await anyio.lowlevel.cancel_shielded_checkpoint()
