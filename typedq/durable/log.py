"""A durable run's log, as data: what the run's function did, call by call.

Each call the function makes on its :class:`~typedq.durable.Run` (``step``, ``do``, ``sleep``,
``wait_for``, ``emit``, a fresh ``patched``) takes the next **position**: 0, 1, 2, ... in the
order the calls are made. Every entry is keyed by the position of the call it records, so
a replay (the function run again from the top) meets its calls in the same order and checks
each against the entry at its position: same kind, same name (task, ``do`` name, signal,
event type, patch id) and, for a step, the same input digest. One global position
(rather than a counter per kind and name) also catches a reordering of two different
calls, and it is the step's idempotency key (``run_id:position``).

A position may hold several entries, appended over time: a step is ``StepScheduled`` when
the run asks for it, then ``StepCompleted`` or ``StepFailed``; a wait is ``WaitStarted``,
then ``SignalReceived`` or ``SignalTimedOut``. Entries are msgspec Structs encoded as
msgpack (tagged by ``k``): plain data, readable by any broker and by ``typedq inspect``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeAlias

import msgspec

from ..errors import BrokerDataError, FailureRecord

__all__ = [
    "DoRecorded",
    "Emitted",
    "Entry",
    "LogEntry",
    "PatchMarked",
    "RunLog",
    "SignalReceived",
    "SignalTimedOut",
    "SleepStarted",
    "StepCompleted",
    "StepFailed",
    "StepScheduled",
    "WaitStarted",
    "decode_entries",
    "encode_entries",
    "event_name",
    "same_event",
]


class Entry(msgspec.Struct, frozen=True, kw_only=True, tag_field="k"):
    """What every log entry has: the position of the call it records.

    :param position: the call's place in the function's sequence of calls (0 first)
    """

    position: int


class StepScheduled(Entry, frozen=True, kw_only=True, tag="step"):
    """The run asked for a step: the host enqueues job ``run_id:position`` of ``task``.

    :param task: the task's registered name
    :param digest: 16 hex digits of the encoded input (a replay with another input diverges)
    """

    task: str
    digest: str


class StepCompleted(Entry, frozen=True, kw_only=True, tag="step_ok"):
    """The step's job completed: its encoded result (the task's output model)."""

    task: str
    output: bytes


class StepFailed(Entry, frozen=True, kw_only=True, tag="step_failed"):
    """The step's job failed after its retries; replay raises it inside the run."""

    task: str
    failure: FailureRecord


class DoRecorded(Entry, frozen=True, kw_only=True, tag="do"):
    """A ``run.do(name, fn)`` block ran: its value, msgpack-encoded."""

    name: str
    value: bytes


class SleepStarted(Entry, frozen=True, kw_only=True, tag="sleep"):
    """The run began a durable sleep: it resumes once the clock passes ``until``."""

    until: float


class WaitStarted(Entry, frozen=True, kw_only=True, tag="wait"):
    """The run waits for ``signal``, until ``deadline`` (``None``: no timeout)."""

    signal: str
    deadline: float | None


class SignalReceived(Entry, frozen=True, kw_only=True, tag="signal"):
    """The waited-for signal was delivered: its encoded payload."""

    signal: str
    payload: bytes


class SignalTimedOut(Entry, frozen=True, kw_only=True, tag="signal_timeout"):
    """The wait's deadline passed first: replay raises RunTimeout at this call."""

    signal: str


class Emitted(Entry, frozen=True, kw_only=True, tag="emit"):
    """The run emitted an event to its watchers (a replay does not emit it again).

    :param event: the event model's qualified name
    """

    event: str
    payload: bytes


class PatchMarked(Entry, frozen=True, kw_only=True, tag="patch"):
    """``run.patched(patch)`` was first reached by this run: it takes the patched path."""

    patch: str


def event_name(model: type[object]) -> str:
    """The name an ``Emitted`` entry records for an event model: its qualified name."""
    return f"{model.__module__}.{model.__qualname__}"


def same_event(recorded: str, model: type[object]) -> bool:
    """Whether an ``Emitted`` entry's ``event`` names ``model``.

    The same name, or the same qualified name where either side's module is
    ``__main__``: a script that defines its models and emits (or watches) them names
    the module ``__main__``, while the worker that imports it names it by its path.
    """
    wanted = event_name(model)
    if recorded == wanted:
        return True
    if not recorded.startswith("__main__.") and model.__module__ != "__main__":
        return False
    return recorded.endswith("." + model.__qualname__)


#: Every kind of log entry (a tagged union).
LogEntry: TypeAlias = (
    StepScheduled
    | StepCompleted
    | StepFailed
    | DoRecorded
    | SleepStarted
    | WaitStarted
    | SignalReceived
    | SignalTimedOut
    | Emitted
    | PatchMarked
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[LogEntry])


def encode_entries(entries: Iterable[LogEntry]) -> bytes:
    """Entries as one msgpack array (what a broker stores or appends)."""
    return _encoder.encode(list(entries))


def decode_entries(data: bytes) -> list[LogEntry]:
    """The entries :func:`encode_entries` wrote.

    :raises BrokerDataError: bytes that are not a run log
    """
    try:
        return _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise BrokerDataError(f"a durable run's log does not decode: {exc}") from exc


def describe(entry: LogEntry) -> str:
    """The call an entry records, as :class:`~typedq.durable.NonDeterministic` names it."""
    if isinstance(entry, StepScheduled):
        return f"step {entry.task!r} (input {entry.digest})"
    if isinstance(entry, StepCompleted | StepFailed):
        return f"step {entry.task!r}"
    if isinstance(entry, DoRecorded):
        return f"do {entry.name!r}"
    if isinstance(entry, SleepStarted):
        return "sleep"
    if isinstance(entry, WaitStarted | SignalReceived | SignalTimedOut):
        return f"wait_for {entry.signal!r}"
    if isinstance(entry, Emitted):
        return f"emit {entry.event}"
    return f"patched {entry.patch!r}"


class RunLog:
    """A run's entries indexed by position, as the replay engine reads them."""

    def __init__(self, entries: Sequence[LogEntry] = ()) -> None:
        self.entries: list[LogEntry] = list(entries)
        self._at: dict[int, list[LogEntry]] = {}
        for entry in self.entries:
            self._at.setdefault(entry.position, []).append(entry)
        #: One past the highest recorded position (0 for an empty log).
        self.end = max(self._at, default=-1) + 1

    def __len__(self) -> int:
        return len(self.entries)

    def at(self, position: int) -> list[LogEntry]:
        """The entries recorded for the call at ``position``, oldest first."""
        return self._at.get(position, [])

    def first(self, position: int) -> LogEntry | None:
        """The entry that says what the call at ``position`` was, if any."""
        found = self._at.get(position)
        return found[0] if found else None
