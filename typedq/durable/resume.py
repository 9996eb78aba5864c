"""Resumable replay: a run's function kept paused between turns, in the worker that ran it.

:func:`~typedq.durable.replay.replay` runs the function from the top on every turn, so a
run of n steps replays 1 + 2 + ... + n calls. A :class:`Resumable` drives the function's
coroutine itself: where a call suspends the run, the coroutine pauses (it does not
unwind) and the driver returns the same decision a replay would. The next turn, if the
run's log is exactly the one this coroutine expects (the log it read, plus what its own
decision appended, checked blob for blob), :meth:`Resumable.advance` hands the longer log
to the paused call, which looks again, and the function goes on from there. Whatever it
decides is what a replay from the top would decide on that log, since the function is
deterministic (code between calls re-runs on a replay and must not matter).

It pauses only where that is plainly safe, else the call unwinds as in a replay and the
next turn replays from the top:

- the call is made in the task that drives the function (not in a task of a task group
  the function started), and not inside ``run.do``;
- no frame of the function (or of a coroutine it awaits) is inside a ``with`` or
  ``async with`` block at the pause, nor awaiting an ``__aenter__`` / ``__aexit__``: a
  cancel scope, a timeout, a task group or a lock must not outlive the turn that entered
  it (where the bytecode cannot be read, every pause counts as inside);
- the function awaits only coroutines and generators down to the run's call.

The host (typedq.durable.host) keeps a bounded number of paused runs per worker process,
by run id, and drops one on any mismatch: another worker appended, the run was read
ended, the compare-and-append lost, an error. Closing a paused run throws
``GeneratorExit`` into it (its ``finally`` blocks run, as they would on a replay's unwind).
"""

from __future__ import annotations

import asyncio
import contextlib
import dis
import sys
import types
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, Generic

from ..broker.runs import RunRecord
from ..task import TIn, TOut
from .log import LogEntry, RunLog
from .replay import _PAUSE, Decision, DurableFunction, Run, StepCall, _Suspend, decide

__all__ = ["MAX_PAUSED", "Resumable"]

#: The code of the run's own awaitables: below one of them, only the engine's frames.
_ENGINE_CODE = frozenset(
    {
        Run._wait_steps.__code__,
        Run.gather.__code__,
        Run.sleep.__code__,
        Run.wait_for.__code__,
        Run._suspend.__code__,
        StepCall.__await__.__code__,
    }
)

_with_blocks: dict[types.CodeType, tuple[tuple[int, int], ...]] = {}

#: How many instructions from a handler's start ``WITH_EXCEPT_START`` is looked for.
_HANDLER_HEAD = 4


def _with_ranges(code: types.CodeType) -> tuple[tuple[int, int], ...]:
    """The bytecode ranges of ``code`` where a pause is inside a ``with`` / ``async with``
    block, or awaits its ``__aenter__`` / ``__aexit__``; the whole code if unsure.

    An offset is inside a ``with`` block if an exception raised there reaches the block's
    exit handler (``PUSH_EXC_INFO``, then ``WITH_EXCEPT_START``). The exception table maps
    an offset to its innermost handler only, so the handler's own first instruction is
    looked up in turn (the handler of a handler is the enclosing block's), until a ``with``
    handler or none: 3.12 sends a pause's exception to a ``CLEANUP_THROW`` stub first, a
    ``try`` inside a ``with`` goes through its own handler and cleanup.
    """
    ranges = _with_blocks.get(code)
    if ranges is None:
        try:
            ranges = _find_with_ranges(code)
        except Exception:  # bytecode we cannot read: assume the worst
            ranges = ((0, sys.maxsize),)
        _with_blocks[code] = ranges
    return ranges


def _find_with_ranges(code: types.CodeType) -> tuple[tuple[int, int], ...]:
    table = getattr(dis.Bytecode(code), "exception_entries", None)
    if table is None:  # no exception table to read (before 3.11): assume the worst
        return ((0, sys.maxsize),)
    instrs = list(dis.get_instructions(code))
    index = {ins.offset: n for n, ins in enumerate(instrs)}

    def handler_of(offset: int) -> int | None:
        for entry in table:
            if entry.start <= offset < entry.end:
                return int(entry.target)
        return None

    def is_with_handler(target: int) -> bool:
        # WITH_EXCEPT_START among the handler's first instructions (right after
        # PUSH_EXC_INFO on 3.11 to 3.13), before anything that leaves the handler's head.
        n = index[target]
        for ins in instrs[n : n + _HANDLER_HEAD]:
            if ins.opname == "WITH_EXCEPT_START":
                return True
            if ins.opname.startswith(("JUMP", "RERAISE", "RETURN", "POP_JUMP")):
                return False
        return False

    def reaches_with(target: int | None) -> bool:
        seen: set[int] = set()
        while target is not None and target not in seen:
            if target not in index:
                return True  # a handler we cannot place: assume the worst
            if is_with_handler(target):
                return True
            seen.add(target)
            target = handler_of(target)
        return False

    found = [(e.start, e.end) for e in table if reaches_with(e.target)]
    # An ``async with`` awaiting its __aenter__ / __aexit__ (GET_AWAITABLE 1 / 2) holds
    # the block half open: from that instruction to past the RESUME that ends the await.
    for n, ins in enumerate(instrs):
        if ins.opname == "GET_AWAITABLE" and ins.arg in (1, 2):
            end = next((m for m in range(n + 1, len(instrs)) if instrs[m].opname == "RESUME"), None)
            if end is None:
                return ((0, sys.maxsize),)
            stop = instrs[end + 1].offset if end + 1 < len(instrs) else sys.maxsize
            found.append((ins.offset, stop))
    return tuple(sorted(found))


def _safe_to_keep(coro: Coroutine[Any, Any, Any]) -> bool:
    """True if the paused ``coro`` holds no ``with`` block open down to the run's call."""
    link: object = coro
    while link is not _PAUSE:
        if isinstance(link, types.CoroutineType):
            frame, below = link.cr_frame, link.cr_await
        elif isinstance(link, types.GeneratorType):
            frame, below = link.gi_frame, link.gi_yieldfrom
        else:
            return False  # an awaitable we cannot look into
        if frame is None:
            return False
        if frame.f_code in _ENGINE_CODE:
            return True
        ranges = _with_ranges(frame.f_code)
        if ranges:
            lasti = frame.f_lasti
            if any(start <= lasti < end for start, end in ranges):
                return False
        link = below
    return True


_PAUSED, _RETURNED, _RAISED = "paused", "returned", "raised"


def _current_task() -> object | None:
    """The running task (asyncio or trio), None if neither."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        pass
    try:
        import trio
    except ImportError:  # pragma: no cover - trio is optional
        return None
    try:
        return trio.lowlevel.current_task()
    except RuntimeError:
        return None


def _coroutine(made: Awaitable[Any]) -> Coroutine[Any, Any, Any]:
    if isinstance(made, types.CoroutineType):
        return made

    async def wrapped() -> Any:
        return await made

    return wrapped()


class _Drive:
    """Runs ``coro`` until it pauses at the run's call or ends: every other yield goes
    to the event loop and what the loop sends or throws goes back in."""

    __slots__ = ("_coro", "_throw")

    def __init__(self, coro: Coroutine[Any, Any, Any], throw: BaseException | None) -> None:
        self._coro = coro
        self._throw = throw

    def __await__(self) -> Generator[Any, Any, tuple[str, Any]]:
        coro, sent, thrown = self._coro, None, self._throw
        while True:
            try:
                got = coro.throw(thrown) if thrown is not None else coro.send(sent)
            except StopIteration as stop:
                return _RETURNED, stop.value
            except BaseException as exc:
                return _RAISED, exc
            if got is _PAUSE:
                return _PAUSED, None
            try:
                sent, thrown = (yield got), None
            except BaseException as exc:
                sent, thrown = None, exc


class Resumable(Generic[TIn, TOut]):
    """One run's function, driven so that it can pause at a suspension and go on later.

    ``decision = await resumable.advance(log, now)`` gives what ``replay(fn, inp, log,
    run_id=..., now=now)`` gives; while :attr:`paused`, the next ``advance`` must get a
    log that extends the last one by the entries the host appended for that decision.
    With ``pause=False`` it never pauses (each suspension unwinds, as in a replay).
    """

    def __init__(
        self, fn: DurableFunction[TIn, TOut], inp: TIn, run_id: str, *, pause: bool = True
    ) -> None:
        self.run_id = run_id
        self._run = Run(run_id, RunLog(), 0.0)
        # Without pause, every suspension unwinds: a replay from the top, driven here.
        self._run._driver = self if pause else None
        self._fn = fn
        self._inp = inp
        self._coro: Coroutine[Any, Any, TOut] | None = None
        self._task: object | None = None
        #: Paused at a suspension: ``advance`` goes on from there.
        self.paused = False
        #: For the host: the log (blobs and entries) this run expects when it is resumed.
        self.blobs: tuple[bytes, ...] = ()
        self.entries: list[LogEntry] = []
        self.created_at = 0.0

    def __repr__(self) -> str:
        return f"Resumable({self.run_id!r}, paused={self.paused})"

    def can_pause(self) -> bool:
        """Called by the run's suspending call: whether it may pause (see the module doc)."""
        task = _current_task()
        return task is not None and task is self._task

    async def advance(self, log: RunLog, now: float) -> Decision[TOut]:
        """Run the function on ``log`` from where it paused (from the top, the first
        time) until it suspends or ends; the decision, as :func:`replay` makes it.

        :raises NonDeterministic: as :func:`replay`
        """
        if self._coro is not None and not self.paused:
            raise RuntimeError(f"{self!r} has ended: replay it from the top")
        run = self._run
        run._renew(log, now)
        if self._coro is None:
            self._coro = coro = _coroutine(self._fn(run, self._inp))
        else:
            coro = self._coro
        self._task = _current_task()
        self.paused = False
        try:
            kind, value = await _Drive(coro, None)
            if kind == _PAUSED and not _safe_to_keep(coro):
                # Unwind it from the pause as a replay would have from the call.
                kind, value = await _Drive(coro, _Suspend())
        finally:
            self._task = None
        if kind == _PAUSED:
            self.paused = True
            return decide(run, None, None)
        error: Exception | None = None
        if kind == _RAISED:
            if isinstance(value, Exception):
                error = value
            elif not run._stopped():
                raise value
        return decide(run, value if kind == _RETURNED else None, error)

    def close(self) -> None:
        """Let the paused function go (``GeneratorExit`` at its pause); nothing when it
        has ended."""
        coro, self._coro = self._coro, None
        self.paused = False
        if coro is None:
            return
        # A function that fights the close (awaits or calls the run in a finally): let it go.
        with contextlib.suppress(Exception, _Suspend):
            coro.close()


#: How many paused runs a durable function keeps per process (0: none, every turn
#: replays from the top). Each holds its function's coroutine and decoded log.
MAX_PAUSED = 1024


class _Paused:
    """A run paused at its last turn here, and the log its next turn must read."""

    __slots__ = ("blobs", "created_at", "entries", "input", "resumable")

    def __init__(
        self,
        *,
        resumable: Resumable[Any, Any],
        created_at: float,
        input: bytes,
        blobs: tuple[bytes, ...],
        entries: list[LogEntry],
    ) -> None:
        self.resumable = resumable
        self.created_at = created_at
        self.input = input
        self.blobs = blobs
        self.entries = entries

    def expects(self, record: RunRecord) -> bool:
        """True if ``record`` is the same run with exactly the log left by the last turn
        (nothing appended since, by anyone)."""
        return (
            len(record.log) == len(self.blobs)
            and record.created_at == self.created_at
            and record.spec.input == self.input
            and tuple(record.log) == self.blobs
        )
