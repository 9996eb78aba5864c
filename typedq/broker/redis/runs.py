"""Durable runs on Redis (capability ``Runs``, values in :mod:`typedq.broker.runs`; the
embedded broker's :mod:`typedq.broker.memory.runs` is the reference), mixed into
RedisBroker.

A run lives on its queue's slot (keys ``Q u:<run id>`` ..., see :mod:`.keys`), so each
operation on it is one script there (``run_*.lua``, helpers in ``lua/common/runs.lua``),
which also enqueues the turn it decides on: one round trip per batch, one script per
queue. Which queue a run is on is kept in the app's index ``P runs`` (written by
:meth:`RunOps.create_runs`, read for the ids this process has not met yet).

A step job (id ``<run id>:<position>``) carries its run's queue in its body
(:attr:`~typedq.broker.base.JobMessage.run_queue`): the script that finishes it keeps its
outcome with the run and wakes the run when it waits on it, in the same call on one
Redis; on Redis Cluster, when the run is on another queue, through the outbox of flows
across slots (applied on the run's slot by ``flow_apply``).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import msgspec

from ...errors import FailureRecord, InvalidOption
from ...names import check_job_ids, check_name
from ...options import check_int_option, check_numbers
from ..base import JobMessage
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
from .codec import STATES, encode, encode_body, from_us, text, us
from .core import RedisCore

__all__ = ["RunOps"]

#: A run's state letter as the scripts store it -> the state, and back.
_RUN_STATES = {
    "r": RunState.RUNNING,
    "c": RunState.COMPLETED,
    "f": RunState.FAILED,
    "x": RunState.CANCELLED,
}
_RUN_LETTERS = {state: letter for letter, state in _RUN_STATES.items()}
#: Run ids whose queue this process keeps (see :meth:`RunOps._run_queues_of`) at most.
_KEEP_LOCATIONS = 100_000

_decode_spec = msgspec.msgpack.Decoder(RunSpec).decode
_decode_failure = msgspec.msgpack.Decoder(FailureRecord).decode


def _blob(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _outcome(value: bytes) -> StepOutcome:
    """A kept step outcome: its state letter, then the result (completed) or the
    FailureRecord (failed, cancelled)."""
    state, rest = STATES[value[:1].decode()], value[1:]
    if state.value == "completed":
        return StepOutcome(state=state, result=rest)
    return StepOutcome(state=state, error=rest or None)


def _record(reply: list[Any]) -> RunRecord:
    """A run as ``run_ops.reply`` (lua/common/runs.lua) answers it."""
    spec, st, ca, fa, res, err, wj, ws, wa, log, inbox, outcomes = reply[:12]
    read_at = from_us(reply[12]) if len(reply) > 12 else 0.0  # run_get adds its time
    return RunRecord(
        spec=_decode_spec(spec),
        state=_RUN_STATES[text(st)],
        log=tuple(_blob(e) for e in log),
        inbox={text(name): tuple(_blob(p) for p in got) for name, got in inbox},
        created_at=from_us(ca),
        finished_at=from_us(fa),
        result=None if res is None else _blob(res),
        failure=None if err is None else _decode_failure(err),
        wait_jobs=tuple(text(wj).split()) if wj is not None else (),
        wait_signal=None if ws is None else text(ws),
        wake_at=None if wa is None else from_us(wa),
        # ('' marks an outcome an append recorded: not kept any more.)
        outcomes={
            text(outcomes[i]): _outcome(_blob(outcomes[i + 1]))
            for i in range(0, len(outcomes), 2)
            if outcomes[i + 1]
        },
        read_at=read_at,
    )


def _append_args(a: RunAppend) -> list[Any]:
    """One append's arguments of ``run_append.lua``."""
    return [
        a.run_id,
        a.expected,
        a.take_signal or "",
        _RUN_LETTERS[a.state],
        b"-" if a.result is None else b"+" + a.result,
        b"" if a.failure is None else encode(a.failure),
        " ".join(a.wait_jobs),
        a.wait_signal or "",
        "" if a.wake_at is None else us(a.wake_at),
        len(a.entries),
        *a.entries,
        len(a.recorded_jobs),
        *a.recorded_jobs,
        *(a.fence or ("", "", "")),
    ]


class RunOps(RedisCore):
    """Durable-run methods of the Redis broker (see the module)."""

    #: Run id -> its queue, as the index said (bounded: see _KEEP_LOCATIONS).
    _run_locations: dict[str, str]
    #: Concurrent turns' reads and appends share round trips (Client.read_run,
    #: Client.append_run).
    coalesce_run_calls = True
    fenced_run_appends = True

    def _run_head(self, queue: str) -> list[Any]:
        """The arguments every run script starts with: prefix, queue, retention."""
        cttl, ccap = self._retention(completed=True)
        fttl, fcap = self._retention(completed=False)
        return [self.keys.prefix, queue, cttl, ccap, fttl, fcap]

    def _keep_locations(self, pairs: Sequence[tuple[str, str]]) -> None:
        if len(self._run_locations) + len(pairs) > _KEEP_LOCATIONS:
            self._run_locations.clear()
        self._run_locations.update(pairs)

    async def _run_queues_of(self, run_ids: Sequence[str]) -> list[str | None]:
        """Each run's queue: from what this process met, else the app's index."""
        known = self._run_locations
        unknown = list(dict.fromkeys(r for r in run_ids if r not in known))
        if unknown:
            with self._translate("runs index"):
                found: list[Any] = await self._conn().hmget(self.keys.runs, unknown)
            self._keep_locations(
                [(r, text(q)) for r, q in zip(unknown, found, strict=True) if q is not None]
            )
        return [known.get(r) for r in run_ids]

    async def _run_calls(
        self,
        name: str,
        items: Sequence[tuple[str, list[Any]]],
        missing: Any,
        *,
        live: frozenset[str] = frozenset(),
        extra: Sequence[Any] = (),
    ) -> list[Any]:
        """Script ``name`` once per queue over the runs of that queue (one round trip);
        per item (run id, its arguments) its answer, ``missing`` for a run not indexed.
        The runs retention dropped leave the index, but for ``live`` ones (created
        again under their id by this very call). ``extra``: arguments after the head."""
        named = [(name, run_id, args) for run_id, args in items]
        return await self._named_run_calls(named, missing, live=live, extra={name: extra})

    async def _named_run_calls(
        self,
        items: Sequence[tuple[str, str, list[Any]]],
        missing: Any,
        *,
        live: frozenset[str] = frozenset(),
        extra: Mapping[str, Sequence[Any]] | None = None,
    ) -> list[Any]:
        """:meth:`_run_calls` with a script per item (script, run id, its arguments):
        one call per script and queue, all in one round trip."""
        queues = await self._run_queues_of([run_id for _, run_id, _ in items])
        groups: dict[tuple[str, str], list[int]] = {}
        for i, q in enumerate(queues):
            if q is not None:
                groups.setdefault((items[i][0], q), []).append(i)
        out: list[Any] = [missing] * len(items)
        if not groups:
            self._conn()
            return out
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        for (name, q), idx in groups.items():
            args = [*self._run_head(q), *((extra or {}).get(name, ()))]
            for i in idx:
                args += items[i][2]
            calls.append((name, [self.keys.seq(q)], args))
        replies = await self._eval_many(calls)
        gone: list[str] = []
        for idx, (answers, dropped) in zip(groups.values(), replies, strict=True):
            for i, answer in zip(idx, answers, strict=True):
                out[i] = answer
            gone += [r for r in map(text, dropped) if r not in live]
        if gone:
            await self._forget_runs(gone)
        return out

    async def _forget_runs(self, run_ids: Sequence[str]) -> None:
        """Drop runs that retention deleted from the index (and from what this process
        keeps)."""
        for r in run_ids:
            self._run_locations.pop(r, None)
        with self._translate("runs index"):
            await self._conn().hdel(self.keys.runs, *run_ids)

    async def create_runs(self, specs: Sequence[RunSpec]) -> list[tuple[bool, RunRecord]]:
        check_job_ids([spec.id for spec in specs])
        for spec in specs:
            check_name("queue", spec.queue)
        if not specs:
            self._conn()
            return []
        await self._note_queues(list(dict.fromkeys(spec.queue for spec in specs)))
        if self._epoch.is_due():
            await self.check_epoch()
        items = [
            (
                spec.id,
                [
                    spec.id,
                    encode(spec),
                    encode_body(
                        JobMessage(
                            id=spec.id,
                            task=spec.turn_task,
                            queue=spec.queue,
                            payload=spec.turn_payload,
                        )
                    ),
                ],
            )
            for spec in specs
        ]
        live = frozenset(spec.id for spec in specs)
        if not self.cluster:
            return await self._start_runs(specs, items, live)
        # The index first: a run created before under an id stays where it is.
        args: list[Any] = [self.keys.prefix]
        for spec in specs:
            args += (spec.id, spec.queue)
        where = await self._eval("run_index", [self.keys.runs], args)
        self._keep_locations([(s.id, text(q)) for s, q in zip(specs, where, strict=True)])
        replies = await self._run_calls("run_create", items, None, live=live)
        return [(bool(int(created)), _record(record)) for created, record in replies]

    async def _start_runs(
        self,
        specs: Sequence[RunSpec],
        items: Sequence[tuple[str, list[Any]]],
        live: frozenset[str],
    ) -> list[tuple[bool, RunRecord]]:
        """create_runs on one Redis: index and create in one script per queue
        (run_start.lua, one round trip); an id indexed on another queue already (a run
        created before under it) is created there as on Redis Cluster (run_create.lua)."""
        groups: dict[str, list[int]] = {}
        for i, spec in enumerate(specs):
            groups.setdefault(spec.queue, []).append(i)
        calls: list[tuple[str, Sequence[str], Sequence[Any]]] = []
        for q, idx in groups.items():
            args = self._run_head(q)
            for i in idx:
                args += items[i][1]
            calls.append(("run_start", [self.keys.seq(q), self.keys.runs], args))
        replies = await self._eval_many(calls)
        out: list[Any] = [None] * len(specs)
        elsewhere: list[int] = []
        located: list[tuple[str, str]] = []
        gone: list[str] = []
        for (q, idx), (answers, dropped) in zip(groups.items(), replies, strict=True):
            for i, answer in zip(idx, answers, strict=True):
                if int(answer[0]) == 2:
                    elsewhere.append(i)
                    located.append((specs[i].id, text(answer[1])))
                else:
                    out[i] = answer
                    located.append((specs[i].id, q))
            gone += [r for r in map(text, dropped) if r not in live]
        self._keep_locations(located)
        if gone:
            await self._forget_runs(gone)
        if elsewhere:
            again = await self._run_calls(
                "run_create", [items[i] for i in elsewhere], None, live=live
            )
            for i, answer in zip(elsewhere, again, strict=True):
                out[i] = answer
        return [(bool(int(created)), _record(record)) for created, record in out]

    async def page_runs(
        self, *, cursor: str | None = None, limit: int = 100
    ) -> tuple[list[str], str | None]:
        # One HSCAN step of the app's run index (P runs, on the app's slot): bounded work
        # per call, as SCAN's guarantees (a run there the whole walk is met, maybe twice
        # while the hash is rehashed: the caller counts each id once).
        limit = check_int_option("limit", limit, 1, 10_000)
        at = 0 if cursor is None else int(cursor) if cursor.isdigit() else -1
        if at < 0:
            raise InvalidOption(f"page_runs: cursor {cursor!r} is not one this broker gave")
        with self._translate("runs index"):
            following, found = await self._conn().hscan(self.keys.runs, at, count=limit)
        ids = [text(run_id) for run_id in found]
        return ids, (None if int(following) == 0 else str(following))

    async def get_runs(self, run_ids: Sequence[str]) -> list[RunRecord | None]:
        replies = await self._run_calls("run_get", [(r, [r]) for r in run_ids], None)
        return [None if reply is None else _record(reply) for reply in replies]

    async def append_runs(self, appends: Sequence[RunAppend]) -> list[AppendOutcome]:
        if self.cluster and any(a.fence is not None for a in appends):
            # A fence is checked in the run's script: its job must be on the run's slot.
            homes = await self._run_queues_of([a.run_id for a in appends])
            away = [
                a.fence is not None and a.fence[2] != q for a, q in zip(appends, homes, strict=True)
            ]
            if any(away):
                kept = [a for a, x in zip(appends, away, strict=True) if not x]
                done = iter(await self.append_runs(kept))
                return [AppendOutcome.FENCED if x else next(done) for x in away]
        # The steps an append schedules go with it (run_schedule.lua: one round trip)
        # when that script can store them: plain waiting jobs (no priority, eta, delay
        # or fair share) on the run's slot (any queue on one Redis; on Redis Cluster the
        # run's own queue). Any other step is enqueued first, as a turn used to.
        inline: list[list[JobMessage]] = []
        apart: list[JobMessage] = []
        for a in appends:
            here: list[JobMessage] = []
            for m in a.steps:
                (here if self._inline_step(m) else apart).append(m)
            inline.append(here)
        if apart:
            await self.enqueue(apart)
        if not any(inline):
            plain = [(a.run_id, _append_args(a)) for a in appends]
            replies = await self._run_calls("run_append", plain, b"not_found")
            return [AppendOutcome(text(reply)) for reply in replies]
        steps = [m for here in inline for m in here]
        check_numbers(steps)
        check_job_ids([m.id for m in steps])
        queues = list(dict.fromkeys(m.queue for m in steps))
        for queue in queues:
            check_name("queue", queue)
        await self._note_queues(queues)
        if self._epoch.is_due():
            await self.check_epoch()
        cap = self.queue_cap(queues)
        # Appends with steps in run_schedule (refused at maxmemory, as an enqueue is),
        # the others in run_append (which runs at the limit): one round trip.
        items: list[tuple[str, str, list[Any]]] = []
        for a, here in zip(appends, inline, strict=True):
            if not here:
                items.append(("run_append", a.run_id, _append_args(a)))
                continue
            args: list[Any] = [len(here)]
            for m in here:
                args += (m.id, m.queue, encode_body(m))
            items.append(("run_schedule", a.run_id, args + _append_args(a)))
        replies = await self._named_run_calls(items, b"not_found", extra={"run_schedule": [cap]})
        return [AppendOutcome(text(reply)) for reply in replies]

    def _inline_step(self, m: JobMessage) -> bool:
        """Whether run_schedule.lua stores step ``m`` with its run's append."""
        return (
            m.priority == 0
            and not m.eta
            and not m.delay
            and not m.fair_weight
            and (not self.cluster or m.queue == m.run_queue)
        )

    async def signal_runs(self, signals: Sequence[RunSignal]) -> list[SignalOutcome]:
        items = [(s.run_id, [s.run_id, s.signal, s.payload]) for s in signals]
        replies = await self._run_calls("run_signal", items, b"not_found")
        return [SignalOutcome(text(reply)) for reply in replies]

    async def wake_runs(self, wakes: Sequence[tuple[str, float]]) -> list[bool]:
        items = [(run_id, [run_id, us(at)]) for run_id, at in wakes]
        replies = await self._run_calls("run_wake", items, 0)
        return [bool(int(reply)) for reply in replies]

    async def cancel_runs(self, run_ids: Sequence[str]) -> list[bool]:
        replies = await self._run_calls("run_cancel", [(r, [r]) for r in run_ids], None)
        # A step still running is asked to stop, as a cancelled job is (the steps may be
        # on other queues: each is found where it is).
        for reply in replies:
            for job_id in reply or ():
                await self.cancel(text(job_id))
        return [reply is not None for reply in replies]

    async def wait_run(
        self, run_id: str, seen: int, timeout: float | None, *, reader: RunReader | None = None
    ) -> RunRecord | None:
        # The run scripts announce a log that grew as '~<run id>' and a run that ended as
        # '~!<run id>' with the finished jobs' notice of the run's queue
        # (lua/common/runs.lua); a wait for the end only (``seen`` sys.maxsize, as
        # RunHandle.result asks) listens for the end alone, and reads the run only then.
        deadline = math.inf if timeout is None else time.monotonic() + timeout
        (queue,) = await self._run_queues_of([run_id])
        if queue is None:
            return None
        with contextlib.ExitStack() as stack:
            waiters = [stack.enter_context(self._notes.done_waiter("~!" + run_id))]
            if seen < sys.maxsize:
                waiters.append(stack.enter_context(self._notes.done_waiter("~" + run_id)))
            await self._notes.subscribe(self._notes.done_channel(queue), wait=deadline)
            while True:
                # A fresh event before each look: a notice that lands between the read
                # and the wait still wakes us.
                event = anyio.Event()
                for waiter in waiters:
                    waiter.event = event
                if reader is None:
                    (record,) = await self.get_runs([run_id])
                else:
                    record = await reader(run_id)
                if record is None or record.state.is_final or len(record.log) > seen:
                    return record
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._redis is None:
                    return record
                with anyio.move_on_after(remaining):
                    await event.wait()
