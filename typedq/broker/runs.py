"""The values of the ``Runs`` capability: durable runs as a broker stores them.

A durable run (:mod:`typedq.durable`) is, to a broker, a record: its input, its log (a
list of encoded entries, only ever appended, and only by a writer that read its current
length: compare-and-append), a signal inbox per signal name, what it waits for, and its
result or failure. The broker knows no models and does not read the entries.

A run becomes work as **turns**: a turn is a job of the run's turn task
(``typedq.run.<name>``) on the run's queue, whose payload the host gave when it created
the run. The broker enqueues a turn when the run is created, when a job it waits on
reaches a final state, when its timer is due, and when a signal it waits for arrives; a
turn replays the run and appends what the replay decided (:class:`RunAppend`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeAlias

import msgspec

from ..errors import FailureRecord
from .messages import JobMessage, JobState

__all__ = [
    "RUN_SCHEMA_PREFIX",
    "AppendOutcome",
    "RunAppend",
    "RunReader",
    "StepOutcome",
    "RunRecord",
    "RunSignal",
    "RunSpec",
    "RunState",
    "SignalOutcome",
]


#: The schema registry records a durable function's run input and result under
#: ``run:<name>`` (a task name never holds ':'); runs carry that input's fingerprint
#: (:attr:`RunSpec.fingerprint`), which ``typedq verify`` checks as it checks jobs'.
RUN_SCHEMA_PREFIX = "run:"


class RunState(StrEnum):
    """Where a run is: ``running`` (a turn is due or it waits), or finished."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """Completed, failed or cancelled: the run takes no more appends or signals."""
        return self is not RunState.RUNNING


class RunSpec(msgspec.Struct, frozen=True, kw_only=True):
    """A run to create (``create_runs``).

    :param id: the run's id (a job id: ``[A-Za-z0-9][A-Za-z0-9_.:-]``); a second create
        with the same id returns the existing run
    :param name: the durable function's name
    :param queue: where its turns (and, by default, its steps) go
    :param turn_task: the task name of its turns
    :param turn_payload: the encoded input of every turn job
    :param input: the run's encoded input
    :param fingerprint: the input schema's fingerprint (the durable function's input
        model when the run was created; ``""``: a run created before runs kept it), for
        ``typedq verify``
    """

    id: str
    name: str
    queue: str
    turn_task: str
    turn_payload: bytes
    input: bytes
    fingerprint: str = ""


class StepOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """A step job of the run (id ``run_id:position``), as it ended: kept with the run
    until an append records it, so that the job's own record may be trimmed or removed
    meanwhile.

    :param result: the encoded result (completed)
    :param error: the encoded FailureRecord (failed, cancelled)
    """

    state: JobState
    result: bytes | None = None
    error: bytes | None = None


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A snapshot of one run (``get_runs``)."""

    spec: RunSpec
    state: RunState
    #: The encoded log entries (one msgpack array of one entry each), oldest first.
    log: tuple[bytes, ...]
    #: Signals delivered and not yet taken, per signal name, oldest first.
    inbox: dict[str, tuple[bytes, ...]]
    created_at: float
    finished_at: float = 0.0
    #: The encoded result (completed).
    result: bytes | None = None
    #: Why it failed or was cancelled.
    failure: FailureRecord | None = None
    #: What the last append said the run waits for.
    wait_jobs: tuple[str, ...] = ()
    wait_signal: str | None = None
    wake_at: float | None = None
    #: Its step jobs (ids ``run_id:position``) that have ended and whose outcomes no
    #: append has recorded yet, by job id (see :class:`StepOutcome`).
    outcomes: dict[str, StepOutcome] = {}
    #: The broker's clock when this snapshot was read (seconds; 0: not told): a turn
    #: replays at this time instead of asking the broker for it again.
    read_at: float = 0.0


class RunAppend(msgspec.Struct, frozen=True, kw_only=True):
    """One compare-and-append (``append_runs``): applied only while the run's log still
    has ``expected`` entries and the run is running.

    With ``state`` RUNNING, the run then waits: for any of ``wait_jobs`` to reach a final
    state, for ``wait_signal`` to be delivered, for the clock to pass ``wake_at`` (each
    wakes it: a turn is enqueued; one already true at the append wakes it at once). With
    a final ``state`` the run is done, with ``result`` or ``failure``.

    :param take_signal: pop the oldest payload of this signal from the inbox (the
        caller appends it as the wait's ``SignalReceived`` entry)
    :param recorded_jobs: the step jobs whose outcomes the entries record: the broker
        drops them from the run's kept outcomes (:attr:`RunRecord.outcomes`)
    :param steps: the step jobs the entries schedule, stored as ``enqueue`` stores them
        (an id taken already stores nothing; ``QueueFull`` and a Redis at maxmemory refuse
        the call) with the append: at the latest in the same call, so that a turn that
        schedules steps is one round trip where the broker can (Redis: the steps of the
        run's slot). A broker may store them before the compare, even when the append is
        not applied (their ids are the run's positions: a later turn schedules the same).
    :param fence: ``(job id, claim token, job's queue)``: applied only while that job is
        active under that token (else ``FENCED``, nothing changed): a step's own worker
        records the step's result with the run's next decision before it completes the
        step (:meth:`typedq.durable.host.DurableTask.after_step`), which only the holder
        of the step's lease may do. Only on a broker with ``fenced_run_appends``; on Redis
        Cluster the job must be on the run's queue (else ``FENCED``).
    """

    run_id: str
    expected: int
    entries: tuple[bytes, ...] = ()
    take_signal: str | None = None
    recorded_jobs: tuple[str, ...] = ()
    state: RunState = RunState.RUNNING
    result: bytes | None = None
    failure: FailureRecord | None = None
    wait_jobs: tuple[str, ...] = ()
    wait_signal: str | None = None
    wake_at: float | None = None
    steps: tuple[JobMessage, ...] = ()
    fence: tuple[str, str, str] | None = None


class AppendOutcome(StrEnum):
    """The answer to one :class:`RunAppend`."""

    APPENDED = "appended"
    CONFLICT = "conflict"  # the log's length is no longer the expected one: read again
    FINISHED = "finished"  # the run is completed, failed or cancelled: nothing changed
    NOT_FOUND = "not_found"
    #: The append's fence job is not (or no longer) active under its token: nothing changed.
    FENCED = "fenced"


class RunSignal(msgspec.Struct, frozen=True, kw_only=True):
    """A signal to deliver (``signal_runs``): kept in the run's inbox for ``signal``."""

    run_id: str
    signal: str
    payload: bytes


class SignalOutcome(StrEnum):
    """The answer to one :class:`RunSignal`."""

    DELIVERED = "delivered"
    FINISHED = "finished"  # refused: the run is completed, failed or cancelled
    NOT_FOUND = "not_found"


#: How ``wait_run`` reads a run (its record, None: no such run), when the caller has a
#: reader of its own (a client whose concurrent reads share a broker call).
RunReader: TypeAlias = Callable[[str], Awaitable[RunRecord | None]]
