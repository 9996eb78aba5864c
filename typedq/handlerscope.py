"""How the runner's task calls handlers: one cancel scope kept entered across its jobs
(:class:`HandlerScope`) and each handler's steps in a context of their own without a
task of their own (:func:`run_in_context`). Used by :class:`typedq.execution.Executor`
and :mod:`typedq.worker.runner`."""

from __future__ import annotations

import asyncio
import contextvars
import math
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

import anyio

__all__ = ["HandlerScope", "run_in_context"]

T = TypeVar("T")


class HandlerScope:
    """The cancel scope a task's handlers run in, one job after another.

    Entering and leaving an anyio cancel scope per job costs about as much as the rest
    of running a no-op job (the scope finds its task, its task's state, its parent, and
    undoes it all on the way out). A worker's runner runs its jobs one at a time, so it
    keeps one scope entered in its task across them: each job's handler only arms it
    (its timeout as a deadline, see below; its cancel, lost lease or shutdown as the
    scope's cancel, through :attr:`Running.scope`) and disarms it when it returns, so no
    cancellation meant for a job reaches the runner's own work between handlers
    (settling, waiting for the next job). A cancelled scope stays cancelled: it is left
    as soon as its handler ends (:meth:`leave`) and the next job enters a new one.

    A timeout is not the scope's own deadline on asyncio: setting an anyio scope's
    deadline schedules a timer and clearing it cancels that timer, per job. A runner
    keeps one timer (:meth:`arm`): a job's deadline only moves it when it is earlier
    than the timer's; when the timer fires it cancels the scope if the deadline of the
    job running then has passed, and is set again for that deadline if not. Jobs of one
    timeout back to back then cost a timer per timeout rather than one per job. (On
    another backend, trio, the deadline is the scope's own.)

    Its scope is entered and left in the task that uses it, innermost: the handlers'
    own scopes are all left when they return, and whatever the task does between
    handlers leaves the scopes it enters. Use it as a context manager around the jobs
    (``with HandlerScope() as scopes:``): the scope still entered is left at the end.
    """

    __slots__ = ("_deadline", "_loop", "_scope", "_scope_class", "_timer")

    def __init__(self) -> None:
        self._scope: anyio.CancelScope | None = None
        #: The running event loop's own scope class, looked up on first use
        #: (``anyio.CancelScope()`` finds the backend anew on every call).
        self._scope_class: type[anyio.CancelScope] | None = None
        #: The armed handler's deadline on the event loop's clock (inf: none armed).
        self._deadline = math.inf
        #: The asyncio loop the timer runs on; None before the first arm, False on
        #: another backend (each deadline is then the scope's own).
        self._loop: asyncio.AbstractEventLoop | bool | None = None
        #: The one timer: at or before the armed deadline (or a past one's, left to fire).
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> HandlerScope:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> bool:
        self.stop_timer()
        return self.leave(exc)

    def enter(self) -> anyio.CancelScope:
        """The scope entered for the next handler (entered now if none is)."""
        scope = self._scope
        if scope is None:
            scope_class = self._scope_class
            if scope_class is None:
                scope = anyio.CancelScope()
                self._scope_class = type(scope)
            else:
                scope = scope_class()
            scope.__enter__()
            self._scope = scope
        return scope

    def arm(self, timeout: float) -> float:
        """Cancel the entered scope ``timeout`` seconds from now, unless :meth:`disarm`
        comes first; the deadline, on the event loop's clock."""
        loop = self._loop
        if loop is None:
            try:
                loop = self._loop = asyncio.get_running_loop()
            except RuntimeError:  # another backend (trio): the scope's own deadline
                loop = self._loop = False
        if loop is False:
            assert self._scope is not None
            deadline = self._scope.deadline = anyio.current_time() + timeout
            return deadline
        assert isinstance(loop, asyncio.AbstractEventLoop)
        deadline = self._deadline = loop.time() + timeout
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._expire)
        return deadline

    def disarm(self) -> None:
        """The armed handler returned (or was interrupted): its deadline is void. The
        timer stays for the next job's (see the class's docstring)."""
        if self._loop is False:
            if self._scope is not None:
                self._scope.deadline = math.inf
        else:
            self._deadline = math.inf

    def stop_timer(self) -> None:
        """No more jobs: the timer goes (the scope is left by :meth:`leave`)."""
        self._deadline = math.inf
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        """The timer fired: cancel the scope if the armed deadline passed (as its own
        deadline would), else wait for that deadline (none armed: stop)."""
        self._timer = None
        deadline = self._deadline
        if deadline == math.inf or self._scope is None:
            return
        loop = self._loop
        assert isinstance(loop, asyncio.AbstractEventLoop)
        if loop.time() >= deadline:
            self._deadline = math.inf
            self._scope.cancel()
        else:
            self._timer = loop.call_at(deadline, self._expire)

    def leave(self, exc: BaseException | None = None) -> bool:
        """Leave the entered scope, if any, as ``exc`` propagates out of it (None: as
        its block ends normally); True when the scope swallowed ``exc`` (its own
        cancellation), as its ``__exit__`` says."""
        scope, self._scope = self._scope, None
        if scope is None:
            return False
        if exc is None:
            return bool(scope.__exit__(None, None, None))
        return bool(scope.__exit__(type(exc), exc, exc.__traceback__))


@types.coroutine
def run_in_context(
    context: contextvars.Context, coro: Coroutine[Any, Any, T]
) -> Generator[Any, Any, T]:
    """Await ``coro`` in the current task with each of its steps run in ``context``.

    What a task spawned with its own copy of the context would give, without spawning
    one: the contextvars the coroutine sets stay in ``context``, and anything it starts
    from there (a thread, a child task) inherits ``context``. Cancellation and the event
    loop's messages pass through unchanged (what the loop sends or throws in is sent or
    thrown into ``coro``), so cancel scopes entered in ``coro`` work as in any await.
    """
    send, throw = coro.send, coro.throw
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            if error is None:
                yielded = context.run(send, value)
            else:
                thrown, error = error, None
                yielded = context.run(throw, thrown)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]  # the coroutine's T
        try:
            value = yield yielded
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:
            error = exc
