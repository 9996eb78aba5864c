"""The PostgreSQL broker's capability Runs (durable runs, :mod:`typedq.broker.runs`), mixed
into PostgresBroker: each operation is one call of a function of migration 9
(:mod:`.migration_9`), which holds the rules (the embedded broker's, ``memory/runs.py``).
A step's end is taken by a trigger of that migration in the transaction that finished
the step, so the worker's calls know nothing of runs and a job that is no step pays
nothing for them. ``wait_run`` is woken by ``r:`` notifications (the log grew or the run
ended) through the broker's listener.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import anyio
import msgspec

from ...errors import FailureRecord
from ...names import check_job_ids
from ...options import check_int_option
from ..base import JobMessage
from ..records import RUN_CANCELLED
from ..runs import (
    AppendOutcome,
    RunAppend,
    RunReader,
    RunRecord,
    RunSignal,
    RunSpec,
    RunState,
    SignalOutcome,
    StepOutcome,
)
from .core import PostgresCore
from .rows import STATES, encode

__all__ = ["RunOps", "turn_parts"]

#: Run states by their stored code (``runs.state``), and each state's code.
RUN_STATES = list(RunState)
RUN_CODE = {state: code for code, state in enumerate(RUN_STATES)}
_APPEND = [
    AppendOutcome.APPENDED,
    AppendOutcome.CONFLICT,
    AppendOutcome.FINISHED,
    AppendOutcome.NOT_FOUND,
]
_SIGNAL = [SignalOutcome.DELIVERED, SignalOutcome.FINISHED, SignalOutcome.NOT_FOUND]
_decode_failure = msgspec.msgpack.Decoder(FailureRecord).decode
#: The id a turn's envelope is cut around (any id: its place does not depend on it).
_ID_MARK = "typedq-turn-id"


def turn_parts(spec: RunSpec) -> tuple[bytes, bytes]:
    """A turn's envelope before and after its id (``run_wake`` in migration 9 puts the
    turn's id between them): the envelope is array-like and the id its first field."""
    whole = encode(
        JobMessage(id=_ID_MARK, task=spec.turn_task, queue=spec.queue, payload=spec.turn_payload)
    )
    mark = encode(_ID_MARK)
    at = whole.index(mark)
    return whole[:at], whole[at + len(mark) :]


def _failure(raw: bytes | None) -> FailureRecord | None:
    """A run's failure record; None for bytes that are none (a failed turn's ``error`` is
    what its worker wrote: the embedded broker decodes it as leniently)."""
    if raw is None:
        return None
    try:
        return _decode_failure(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def _record(row: Any) -> RunRecord | None:
    """A ``run_row`` as the seam's RunRecord (None: no such run)."""
    if row["id"] is None:
        return None
    inbox: dict[str, list[bytes]] = {}
    for signal, payload in zip(
        row["inbox_signals"] or (), row["inbox_payloads"] or (), strict=True
    ):
        inbox.setdefault(signal, []).append(payload)
    outcomes = {}
    for job_id, code, result, error in zip(
        row["outcome_jobs"] or (),
        row["outcome_states"] or (),
        row["outcome_results"] or (),
        row["outcome_errors"] or (),
        strict=True,
    ):
        outcomes[job_id] = StepOutcome(state=STATES[code], result=result, error=error)
    return RunRecord(
        spec=RunSpec(
            id=row["id"],
            name=row["name"],
            queue=row["queue"],
            turn_task=row["turn_task"],
            turn_payload=row["turn_payload"],
            input=row["input"],
            fingerprint=row["fingerprint"],
        ),
        state=RUN_STATES[row["state"]],
        log=tuple(row["log"]),
        inbox={name: tuple(q) for name, q in inbox.items()},
        created_at=row["created_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        failure=_failure(row["failure"]),
        wait_jobs=tuple(row["wait_jobs"]),
        wait_signal=row["wait_signal"],
        wake_at=row["wake_at"],
        outcomes=outcomes,
        read_at=row["read_at"],
    )


class RunOps(PostgresCore):
    """Durable runs on the PostgreSQL broker."""

    #: Concurrent turns' reads, appends and starts share a call each (Client's run
    #: batchers): a call is a round trip and a commit.
    coalesce_run_calls = True
    #: Waiters of ``wait_run``, by run id, woken by its ``r:`` notification.
    _run_waiters: dict[str, set[anyio.Event]]

    async def create_runs(self, specs: Sequence[RunSpec]) -> list[tuple[bool, RunRecord]]:
        self._check()
        check_job_ids([spec.id for spec in specs])
        if not specs:
            return []
        await self._register_queues(sorted({spec.queue for spec in specs}))
        parts = [turn_parts(spec) for spec in specs]
        ttls, caps = self._final_bounds()
        rows = await self._fetch(
            "run_create",
            self._sql["run_create"],
            self.ns,
            [s.id for s in specs],
            [s.name for s in specs],
            [s.queue for s in specs],
            [s.turn_task for s in specs],
            [s.turn_payload for s in specs],
            [s.input for s in specs],
            [s.fingerprint for s in specs],
            [head for head, _ in parts],
            [tail for _, tail in parts],
            ttls,
            caps,
        )
        out = []
        for row in rows:
            record = _record(row)
            assert record is not None, "a run just created or kept reads as a run"
            out.append((bool(row["created"]), record))
        return out

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        self._check()
        if not run_ids:
            return []
        ttls, _ = self._final_bounds()
        rows = await self._fetch(
            "run_get", self._sql["run_get"], self.ns, list(run_ids), ttls, read=True
        )
        return [_record(row) for row in rows]

    async def page_runs(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[str], str | None]:
        self._check()
        limit = check_int_option("limit", limit, 1, 10_000)
        rows = await self._fetch(
            "run_page", self._sql["run_page"], self.ns, cursor or "", limit + 1, read=True
        )
        ids = [row["id"] for row in rows]
        page = ids[:limit]
        return page, (page[-1] if len(ids) > limit else None)

    async def append_runs(self, appends: Sequence[RunAppend]) -> list[AppendOutcome]:
        self._check()
        if any(a.fence is not None for a in appends):
            # No fenced appends here (fenced_run_appends False): such an append is answered
            # FENCED, unapplied, and the others go as usual.
            plain = [a for a in appends if a.fence is None]
            done = iter(await self.append_runs(plain))
            return [AppendOutcome.FENCED if a.fence is not None else next(done) for a in appends]
        if not appends:
            return []
        # The steps are stored by the same call, before the compares (RunAppend.steps).
        steps = self._enqueue_args([m for item in appends for m in item.steps])
        await self._register_queues(steps[2])
        ttls, caps = self._final_bounds()
        codes = await self._fetchval(
            "run_append",
            self._sql["run_append"],
            self.ns,
            [a.run_id for a in appends],
            [a.expected for a in appends],
            [len(a.entries) for a in appends],
            [e for a in appends for e in a.entries],
            [a.take_signal for a in appends],
            [len(a.recorded_jobs) for a in appends],
            [j for a in appends for j in a.recorded_jobs],
            [RUN_CODE[a.state] for a in appends],
            [a.result for a in appends],
            [None if a.failure is None else encode(a.failure) for a in appends],
            [len(a.wait_jobs) for a in appends],
            [j for a in appends for j in a.wait_jobs],
            [a.wait_signal for a in appends],
            [a.wake_at for a in appends],
            ttls,
            caps,
            *steps[1:],
            cap=steps[7],
        )
        return [_APPEND[code] for code in codes]

    async def signal_runs(self, signals: Sequence[RunSignal]) -> list[SignalOutcome]:
        self._check()
        if not signals:
            return []
        ttls, _ = self._final_bounds()
        codes = await self._fetchval(
            "run_signal",
            self._sql["run_signal"],
            self.ns,
            [s.run_id for s in signals],
            [s.signal for s in signals],
            [s.payload for s in signals],
            ttls,
        )
        return [_SIGNAL[code] for code in codes]

    async def wake_runs(self, wakes: Sequence[tuple[str, float]]) -> list[bool]:
        self._check()
        if not wakes:
            return []
        ttls, _ = self._final_bounds()
        out = await self._fetchval(
            "run_wake",
            self._sql["run_wake"],
            self.ns,
            [run_id for run_id, _ in wakes],
            [float(at) for _, at in wakes],
            ttls,
        )
        return [bool(x) for x in out]

    async def cancel_runs(self, run_ids: Sequence[str]) -> list[bool]:
        self._check()
        if not run_ids:
            return []
        ttls, caps = self._final_bounds()
        rows = await self._fetch(
            "run_cancel", self._sql["run_cancel"], self.ns, list(run_ids), RUN_CANCELLED, ttls, caps
        )
        rows.sort(key=lambda row: row["k"])
        out = []
        for row in rows:
            waited = row["waited"]
            out.append(waited is not None)
            # A step still running is asked to stop, as a cancelled job is.
            for job_id in waited or ():
                await self.cancel(job_id)
        return out

    async def wait_run(
        self, run_id: str, seen: int, timeout: float | None, *, reader: RunReader | None = None
    ) -> RunRecord | None:
        self._check()

        async def read() -> RunRecord | None:
            if reader is not None:
                return await reader(run_id)
            [record] = await self.get_runs([run_id])
            return record

        deadline = math.inf if timeout is None else anyio.current_time() + timeout
        while True:
            # Registered before the read: a notification after it is not lost.
            event = anyio.Event()
            self._run_waiters.setdefault(run_id, set()).add(event)
            try:
                record = await read()
                if record is None or record.state.is_final or len(record.log) > seen:
                    return record
                left = deadline - anyio.current_time()
                if left <= 0:
                    return record
                with anyio.move_on_after(left):
                    await event.wait()
                if self._pool is None:
                    return record
            finally:
                events = self._run_waiters.get(run_id)
                if events is not None:
                    events.discard(event)
                    if not events:
                        del self._run_waiters[run_id]
