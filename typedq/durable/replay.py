"""The replay engine: run a durable function against its log, get back what to do next.

``await replay(onboard, user, log, run_id="user-42", now=clock())`` runs
``onboard(run, user)`` from the top. Each call on ``run`` meets the log entry at its
position: a recorded step, ``do`` block, sleep or signal returns its recorded value; the
first call that has no record yet **suspends** the run, and ``replay`` returns a
:data:`Decision` for the host (a broker's worker) to carry out:

- :class:`ScheduleSteps`: enqueue these steps (several at once from ``run.gather``) and
  replay when they have finished;
- :class:`SleepUntil`: replay once the clock passes ``until``;
- :class:`WaitForSignal`: replay when ``signal`` is delivered, or at ``deadline``;
- :class:`Completed` / :class:`Failed`: the function returned / raised.

(The decisions are :mod:`typedq.durable.decisions`, importable from here; how a ``do``
block's value is stored, :mod:`typedq.durable.values`.)

Every decision carries ``append``: the entries this replay recorded (``do`` values, emits,
patch markers, the new sleep, wait and scheduled steps), which the host appends to the log
before acting on the decision. The engine is pure: it does no I/O, reads the time only from
``now`` and runs only the ``do`` blocks it meets for the first time, so a host that crashes
before appending gets the same decision again from the same log.

A replay whose calls differ from the log (another kind, name, task or input at a recorded
position) raises :class:`~typedq.durable.NonDeterministic` naming both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeAlias, TypeVar, cast, overload

import msgspec
import pydantic

from ..errors import FailureReason, JobCancelled, JobFailed
from ..names import check_name
from ..options import check_seconds_option
from ..serde import codec_for
from ..task import TaskBase, TIn, TOut
from .decisions import (
    Completed,
    Decision,
    Failed,
    ScheduleSteps,
    SleepUntil,
    StepRequest,
    WaitForSignal,
)
from .log import (
    DoRecorded,
    Emitted,
    LogEntry,
    PatchMarked,
    RunLog,
    SignalReceived,
    SignalTimedOut,
    SleepStarted,
    StepCompleted,
    StepFailed,
    StepScheduled,
    WaitStarted,
    describe,
    event_name,
)
from .types import NonDeterministic, RunTimeout, Signal, TPayload
from .values import ValueCodec

__all__ = [
    "Completed",
    "Decision",
    "DurableFunction",
    "Failed",
    "Run",
    "ScheduleSteps",
    "SleepUntil",
    "StepCall",
    "StepRequest",
    "WaitForSignal",
    "replay",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)
T1 = TypeVar("T1")
T2 = TypeVar("T2")
T3 = TypeVar("T3")
T4 = TypeVar("T4")
T5 = TypeVar("T5")

#: What ``@app.durable`` will decorate: ``async def f(run: Run, inp: TIn) -> TOut``.
DurableFunction: TypeAlias = Callable[["Run", TIn], Awaitable[TOut]]


class _Suspend(BaseException):
    """Unwinds the run's function from the call that has no record yet.

    A BaseException, as ``CancelledError`` is, so that the ``except Exception:`` blocks of
    the user's function (a saga's compensation, a broad catch around a step) do not
    swallow it and run on past a value that does not exist yet. The engine does not trust
    the unwinding alone: the run remembers its suspension, every later call on ``run``
    raises again, and the decision stands whatever the function does after catching it.
    """


class _Driver(Protocol):
    def can_pause(self) -> bool: ...


class _Pause:
    """Awaited where a resumable run pauses: yields itself to the driver, which holds the
    coroutine until the next turn (never to the event loop: the driver checks first)."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield self


_PAUSE = _Pause()


# -- the run ------------------------------------------------------------------------


class StepCall(Generic[T_co]):
    """A step asked for by ``run.step(...)``: await it (or pass it to ``run.gather``) for
    its result. Its position is taken when ``run.step`` is called, not when it is awaited.
    """

    __slots__ = ("_entries", "_payload", "_run", "_task", "digest", "position")

    def __init__(
        self,
        run: Run,
        task: TaskBase[Any, Any],
        position: int,
        payload: bytes,
        digest: str,
        entries: Sequence[LogEntry],
    ) -> None:
        self._run = run
        self._task = task
        self.position = position
        self._payload = payload
        self.digest = digest
        self._entries = entries

    def __repr__(self) -> str:
        return f"StepCall({self._task.name!r}, position={self.position})"

    def __await__(self) -> Generator[Any, None, T_co]:
        values = yield from self._run._wait_steps((self,)).__await__()
        return cast(T_co, values[0])

    @property
    def task(self) -> str:
        """The step's task name."""
        return self._task.name

    def _scheduled(self) -> bool:
        return bool(self._entries)

    def _done(self) -> bool:
        return any(isinstance(e, StepCompleted | StepFailed) for e in self._entries)

    def _request(self) -> StepRequest:
        return StepRequest(
            position=self.position,
            task=self._task.name,
            payload=self._payload,
            key=self._run._key(self.position),
        )

    def _value(self) -> Any:
        """The recorded result, or the recorded failure raised as the job's would be."""
        for entry in self._entries:
            if isinstance(entry, StepCompleted):
                return self._task.output.decode(entry.output)
            if isinstance(entry, StepFailed):
                key, failure = self._run._key(self.position), entry.failure
                if failure.reason is FailureReason.CANCELLED:
                    raise JobCancelled(key, self._task.name, failure)
                raise JobFailed(key, self._task.name, failure, self._domain_error(entry))
        raise AssertionError(f"{self!r} has no outcome yet")  # _wait_steps checked _done()

    def _domain_error(self, entry: StepFailed) -> Any:
        failure = entry.failure
        if failure.domain_type is None or failure.domain_payload is None:
            return None
        for error_type in self._task.options.errors:
            if f"{error_type.__module__}.{error_type.__qualname__}" == failure.domain_type:
                return codec_for(error_type).decode(failure.domain_payload)
        return None


class Run:
    """What a durable function gets as its first argument: its way to do durable things.

    Every method is one call of the run's log (see :mod:`typedq.durable.log`): on replay it
    returns what the log records; the first time, it records or suspends. Code between
    calls re-runs on every replay, so it must be deterministic: read the time, random
    numbers, the network or files only inside ``run.do`` or a step.
    """

    def __init__(self, run_id: str, log: RunLog, now: float) -> None:
        self.run_id = run_id
        self._log = log
        self._now = now
        self._next = 0
        self._append: list[LogEntry] = []
        self._suspension: ScheduleSteps | SleepUntil | WaitForSignal | None = None
        self._divergence: NonDeterministic | None = None
        #: What drives the function when it may pause instead of unwinding (resume.py).
        self._driver: _Driver | None = None
        self._in_do = 0

    def __repr__(self) -> str:
        return f"Run({self.run_id!r}, at call #{self._next})"

    # -- steps ---------------------------------------------------------------------

    def step(self, task: TaskBase[TIn, TOut], inp: TIn) -> StepCall[TOut]:
        """Run ``task`` on ``inp`` as a job, once: await the result (a ``TOut``).

        The job's id is ``run_id:position``, stable across replays: use it (the job
        context's ``job_id``) as the idempotency key of the task's own side effects. A step
        that fails after its retries raises its ``JobFailed`` here, where the function may
        catch it.
        """
        self._guard()
        position = self._take()
        payload = task.input.encode(inp)
        digest = hashlib.sha256(payload).hexdigest()[:16]
        entries = self._check(
            position,
            f"step {task.name!r} (input {digest})",
            lambda e: (
                isinstance(e, StepScheduled | StepCompleted | StepFailed)
                and e.task == task.name
                and (not isinstance(e, StepScheduled) or e.digest == digest)
            ),
        )
        return StepCall(self, task, position, payload, digest, entries)

    @overload
    async def gather(self, a: StepCall[T1], /) -> tuple[T1]: ...
    @overload
    async def gather(self, a: StepCall[T1], b: StepCall[T2], /) -> tuple[T1, T2]: ...
    @overload
    async def gather(
        self, a: StepCall[T1], b: StepCall[T2], c: StepCall[T3], /
    ) -> tuple[T1, T2, T3]: ...
    @overload
    async def gather(
        self, a: StepCall[T1], b: StepCall[T2], c: StepCall[T3], d: StepCall[T4], /
    ) -> tuple[T1, T2, T3, T4]: ...
    @overload
    async def gather(
        self,
        a: StepCall[T1],
        b: StepCall[T2],
        c: StepCall[T3],
        d: StepCall[T4],
        e: StepCall[T5],
        /,
    ) -> tuple[T1, T2, T3, T4, T5]: ...
    @overload
    async def gather(self, *calls: StepCall[T]) -> tuple[T, ...]: ...
    async def gather(self, *calls: StepCall[Any]) -> tuple[Any, ...]:
        """The results of several steps, which run concurrently: every one not yet asked
        for is scheduled at once.

        Waits for all of them; then, if some failed, raises the failure of the first in
        argument order (whatever order they finished in, so that replays agree).
        """
        for call in calls:
            if not isinstance(call, StepCall):
                raise TypeError(f"run.gather takes run.step(...) calls, got {call!r}")
        return tuple(await self._wait_steps(calls))

    async def _wait_steps(self, calls: Sequence[StepCall[Any]]) -> list[Any]:
        self._guard()
        while True:
            new = [c for c in calls if not c._scheduled()]
            pending = [c.position for c in calls if c._scheduled() and not c._done()]
            if not (new or pending):
                return [call._value() for call in calls]
            for call in new:
                self._append.append(
                    StepScheduled(position=call.position, task=call.task, digest=call.digest)
                )
                # Another await of the same call within this replay must not schedule it twice.
                call._entries = [self._append[-1]]
            await self._suspend(
                ScheduleSteps(
                    schedule=tuple(c._request() for c in new), pending=tuple(sorted(pending))
                )
            )
            # Resumed (see typedq.durable.resume): the log now records what was scheduled.
            for call in calls:
                call._entries = self._log.at(call.position)

    # -- inline code -----------------------------------------------------------------

    @overload
    async def do(
        self, name: str, fn: Callable[[], Awaitable[T]], *, type: type[T] | None = None
    ) -> T: ...
    @overload
    async def do(self, name: str, fn: Callable[[], T], *, type: type[T] | None = None) -> T: ...
    async def do(self, name: str, fn: Callable[[], Any], *, type: type[Any] | None = None) -> Any:
        """Run ``fn`` (sync or async) the first time and record its value; replays return
        the recorded value without running it.

        The value is stored as msgpack: a model, or with ``type=`` anything msgspec
        decodes into that type (a dataclass, a tuple, a datetime...); without ``type=``
        only plain values (None, bool, int, float, str, bytes, and lists and str-keyed
        dicts of them). The first run returns the value as replays will read it back.

        A crash after ``fn`` ran and before the host appended its value runs it again:
        ``do`` is at-least-once, like a step; put side effects that must happen once in a
        step with an idempotency key.
        """
        self._guard()
        check_name("do", name)
        position = self._take()
        entries = self._check(
            position, f"do {name!r}", lambda e: isinstance(e, DoRecorded) and e.name == name
        )
        codec = ValueCodec(name, type)
        if entries:
            return codec.decode(cast(DoRecorded, entries[0]).value)
        self._in_do += 1
        try:
            value = fn()
            if inspect.isawaitable(value):
                value = await value
        finally:
            self._in_do -= 1
        # A suspension inside fn (it called the run) or a divergence must not be recorded.
        self._guard()
        data = codec.encode(value)
        self._append.append(DoRecorded(position=position, name=name, value=data))
        return codec.decode(data)

    # -- time and signals -----------------------------------------------------------------

    async def sleep(self, duration: timedelta | float) -> None:
        """Sleep durably: the run suspends (holding no worker) until ``duration`` from the
        first time this call was reached has passed."""
        self._guard()
        seconds = check_seconds_option("duration", duration, subject="run.sleep")
        position = self._take()
        entries = self._check(position, "sleep", lambda e: isinstance(e, SleepStarted))
        if entries:
            until = cast(SleepStarted, entries[0]).until
        else:
            until = self._now + seconds
            self._append.append(SleepStarted(position=position, until=until))
        while self._now < until:
            await self._suspend(SleepUntil(position=position, until=until))

    async def wait_for(
        self, signal: Signal[TPayload], *, timeout: timedelta | float | None = None
    ) -> TPayload:
        """The payload of the next ``signal`` sent to this run (one sent before the run
        waits is kept, and they are delivered in order).

        :param timeout: give up after this long from the first time this call was reached
        :raises RunTimeout: the timeout ran out first (the log records it: replays raise
            it too)
        """
        self._guard()
        seconds = (
            None
            if timeout is None
            else check_seconds_option("timeout", timeout, subject="run.wait_for")
        )
        position = self._take()
        entries = self._check(
            position,
            f"wait_for {signal.name!r}",
            lambda e: (
                isinstance(e, WaitStarted | SignalReceived | SignalTimedOut)
                and e.signal == signal.name
            ),
        )
        started = next((e for e in entries if isinstance(e, WaitStarted)), None)
        deadline = None if started is None else started.deadline
        if not entries:
            deadline = None if seconds is None else self._now + seconds
            self._append.append(
                WaitStarted(position=position, signal=signal.name, deadline=deadline)
            )
        while True:
            # The first outcome recorded wins: a signal and the timeout may both be appended.
            for entry in entries:
                if isinstance(entry, SignalReceived):
                    return signal.decode(entry.payload)
                if isinstance(entry, SignalTimedOut):
                    raise RunTimeout(self.run_id, signal.name, deadline)
            if deadline is not None and self._now >= deadline:
                self._append.append(SignalTimedOut(position=position, signal=signal.name))
                raise RunTimeout(self.run_id, signal.name, deadline)
            await self._suspend(
                WaitForSignal(position=position, signal=signal.name, deadline=deadline)
            )
            entries = self._log.at(position)

    # -- events and code changes -------------------------------------------------------------

    async def emit(self, event: msgspec.Struct | pydantic.BaseModel) -> None:
        """Send ``event`` (a model) to the run's watchers, once: a replay does not resend it."""
        self._guard()
        kind = type(event)
        name = event_name(kind)
        position = self._take()
        entries = self._check(
            position, f"emit {name}", lambda e: isinstance(e, Emitted) and e.event == name
        )
        if not entries:
            payload = codec_for(kind).encode(event)
            self._append.append(Emitted(position=position, event=name, payload=payload))

    def patched(self, patch_id: str) -> bool:
        """True if this run takes the code path added under ``patch_id``.

        A run that reaches this call fresh (its log has nothing at or after this point)
        records a marker and gets True, now and on every replay. A run whose log already
        goes past this point was recorded by the code before the patch: it gets False and
        replays the old path. Keep the old path until no run started before the patch is
        left; the marker takes a position, so removing the call later diverges such runs.
        """
        self._guard()
        check_name("patch", patch_id)
        position = self._next
        first = self._log.first(position)
        if isinstance(first, PatchMarked) and first.patch == patch_id:
            self._next += 1
            return True
        if position >= self._log.end:
            self._next += 1
            self._append.append(PatchMarked(position=position, patch=patch_id))
            return True
        return False

    # -- internals ---------------------------------------------------------------------

    def _renew(self, log: RunLog, now: float) -> None:
        """Resumed at a later turn (typedq.durable.resume): that turn's log and time."""
        self._log, self._now, self._append = log, now, []
        self._suspension = None

    def _stopped(self) -> bool:
        """Suspended or diverged: whatever the function raises now is the unwinding."""
        return self._suspension is not None or self._divergence is not None

    def _key(self, position: int) -> str:
        return f"{self.run_id}:{position}"

    def _take(self) -> int:
        position = self._next
        self._next += 1
        return position

    def _guard(self) -> None:
        # Once suspended or diverged, the function may only unwind: any call stops it again.
        if self._suspension is not None or self._divergence is not None:
            raise _Suspend

    def _check(
        self, position: int, wanted: str, matches: Callable[[LogEntry], bool]
    ) -> list[LogEntry]:
        """The entries at ``position`` if the first matches the call, else diverge."""
        entries = self._log.at(position)
        if entries and not matches(entries[0]):
            self._divergence = NonDeterministic(self.run_id, position, wanted, describe(entries[0]))
            raise self._divergence
        return entries

    async def _suspend(self, decision: ScheduleSteps | SleepUntil | WaitForSignal) -> None:
        """Stop the run at this call: unwind it (raise :class:`_Suspend`), or, when a
        :class:`~typedq.durable.resume.Resumable` drives it from this very task and the
        call is not inside ``run.do``, pause it there; it returns when resumed with a
        longer log (``_log``, ``_now`` and ``_append`` renewed), and the caller looks again.
        """
        self._suspension = decision
        driver = self._driver
        if driver is None or self._in_do or not driver.can_pause():
            raise _Suspend
        await _PAUSE


# -- the engine ------------------------------------------------------------------------


async def replay(
    fn: DurableFunction[TIn, TOut],
    inp: TIn,
    log: RunLog | Sequence[LogEntry],
    *,
    run_id: str,
    now: float,
) -> Decision[TOut]:
    """Run ``fn(run, inp)`` from the top against ``log``; return what the host does next.

    :param log: the run's entries so far (or a :class:`RunLog` of them)
    :param run_id: the run's id (steps' job ids are ``run_id:position``)
    :param now: the broker clock's time, epoch seconds: the only time the replay reads
    :raises NonDeterministic: the function's calls do not match the log (also when it
        returns while the log records calls after its last one)
    """
    run_log = log if isinstance(log, RunLog) else RunLog(log)
    run = Run(run_id, run_log, now)
    result: Any = None
    error: Exception | None = None
    try:
        result = await fn(run, inp)
    except Exception as exc:
        error = exc
    except BaseException:
        # _Suspend, or a group of them out of a task group; anything else (cancellation,
        # KeyboardInterrupt) raised while the run was not stopping is the caller's.
        if run._suspension is None and run._divergence is None:
            raise
    return decide(run, result, error)


def decide(run: Run, result: Any, error: Exception | None) -> Decision[Any]:
    """The decision of a replay whose function has stopped (returned ``result``, raised
    ``error``, or unwound from a suspension or divergence)."""
    # The run's own record wins over what came out: the function may have caught and
    # replaced the _Suspend or NonDeterministic it was stopped with.
    if run._divergence is not None:
        raise run._divergence
    append = tuple(run._append)
    if run._suspension is not None:
        return dataclasses.replace(run._suspension, append=append)
    if error is not None:
        return Failed(error=error, append=append)
    run_log = run._log
    if run._next < run_log.end:
        position = next(p for p in range(run._next, run_log.end) if run_log.at(p))
        recorded = describe(run_log.at(position)[0])
        raise NonDeterministic(run.run_id, position, "to return", recorded)
    return Completed(result=result, append=append)
