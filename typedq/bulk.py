"""Bulk actions by filter: find the jobs that match a filter, count them, list some, and
retry, cancel or remove every one of them (``typedq jobs``, the dashboard's bulk page).

A :class:`JobFilter` names one state (``failed`` by default) and narrows it by task,
error type (the last failure record's ``error_type``), age (``since``) and payload
fields (``where``, decoded with the task's own codec). :class:`BulkQuery` walks the
state with :meth:`Broker.page_jobs <typedq.broker.base.Broker.page_jobs>` cursors, a
bounded page at a time (``BATCH`` ids, one ``get`` for their records, one broker call
for the action), so memory stays bounded whatever the number of jobs: no list of ids is
ever kept, only counts.

Idempotent and resumable: an action moves a job out of the filter's state (retry:
failed -> waiting; cancel: waiting -> cancelled; remove: gone), so a run that is
interrupted and started again finds and acts on only what still matches. A cancel of an
active job asks its worker to stop: the job stays ``active`` (with its cancel requested)
until the worker does, and a second run asks again, which changes nothing.

``since`` reads the time the state's order is kept by: for the final states (completed,
failed, cancelled) the job's finish time, for the others its enqueue time; both on the
broker's clock when it has one (Redis ``TIME``).

Nothing here draws: :mod:`typedq.cli.render` draws the CLI's tables, the dashboard its
HTML, both from the structures below.
"""

from __future__ import annotations

import contextlib
import re
import types
import typing
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from typing import Any, Literal

import anyio
import msgspec
import pydantic

from .broker.base import JobRecord, JobState
from .client import Client
from .clock import SYSTEM_CLOCK, Clock
from .errors import BrokerDataError, ConfigError, TypedqError, Unsupported
from .inspector import JobView, job_view
from .job import decode_failure
from .task import TaskBase

__all__ = [
    "BATCH",
    "BULK_ACTIONS",
    "BULK_DONE",
    "BulkAction",
    "BulkPreview",
    "BulkQuery",
    "BulkReport",
    "JobFilter",
    "Where",
    "check_action",
    "describe_filter",
    "parse_since",
    "parse_where",
]

BulkAction = Literal["retry", "cancel", "remove"]

#: Ids per ``get`` of waiting jobs (see the page loop): about 2 ms of Redis per call
#: at 100,000 waiting jobs in a queue.
_WAITING_GET_CHUNK = 20

#: The states each bulk action applies to.
BULK_ACTIONS: dict[BulkAction, tuple[JobState, ...]] = {
    "retry": (JobState.FAILED, JobState.CANCELLED),
    "cancel": (JobState.WAITING, JobState.SCHEDULED, JobState.ACTIVE),
    "remove": tuple(JobState),
}

#: Jobs per page of the walk: one ``page_jobs``, one ``get`` and one action call each.
BATCH = 500
#: Cancels in flight at once (the broker cancels one job per call).
_CANCEL_CONCURRENCY = 32

#: The outcomes of an action that took effect (the others left the job as it was).
BULK_DONE = frozenset({"retried", "removed", "cancelled", "requested"})

_SINCE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_since(text: str) -> float:
    """``"30m"`` -> 1800.0: a duration in seconds (``s``, ``m``, ``h``, ``d``, ``w``; a
    bare number is seconds).

    :raises ConfigError: one line naming the accepted forms
    """
    match = _SINCE.fullmatch(text)
    if match is None:
        raise ConfigError(
            f"--since {text!r} is not a duration: use a number and a unit, e.g. 90s, 30m, "
            "1h, 2d or 1w"
        )
    return float(match[1]) * _UNITS[match[2]]


class Where(msgspec.Struct, frozen=True, kw_only=True):
    """One ``field=value`` condition on a task's payload, its value parsed by the
    field's type. ``path`` is the attribute path (``a.b`` for a nested model's field)."""

    path: tuple[str, ...]
    text: str
    value: Any


class JobFilter(msgspec.Struct, frozen=True, kw_only=True):
    """What jobs a bulk action applies to: all of them in ``state``, narrowed by the
    others (every condition given must hold).

    :ivar task: the task's name
    :ivar error_type: the last failure record's ``error_type``, qualified
        (``billing.errors.CardDeclined``) or its trailing part (``CardDeclined``)
    :ivar since: seconds: finished within them (final states), or enqueued within them
        (waiting, scheduled, active)
    :ivar where: ``field=value`` conditions on the payload (needs ``task``)
    """

    state: JobState = JobState.FAILED
    task: str | None = None
    error_type: str | None = None
    since: float | None = None
    where: tuple[str, ...] = ()


class BulkPreview(msgspec.Struct, frozen=True, kw_only=True):
    """The matches of a filter: how many, and the first ``limit`` of them."""

    filter: JobFilter
    queues: list[str]
    total: int
    examined: int
    jobs: list[JobView]


class BulkReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a bulk action did (or, ``dry_run``, would do): the jobs examined, how many
    matched, how many were acted on, and the count of each outcome."""

    action: BulkAction
    filter: JobFilter
    dry_run: bool
    examined: int
    matched: int
    done: int
    outcomes: dict[str, int]


def check_action(action: BulkAction, state: JobState) -> None:
    """Refuse, in one line, an action that does not apply to ``state``."""
    if state not in BULK_ACTIONS[action]:
        allowed = ", ".join(s.value for s in BULK_ACTIONS[action])
        raise ConfigError(
            f"cannot {action} {state.value} jobs; {action} applies to: {allowed} "
            "(choose with --state)"
        )


def describe_filter(flt: JobFilter) -> str:
    """The filter in words: ``failed jobs of task T, error E, finished in the last 1h``."""
    parts = [f"{flt.state.value} jobs"]
    if flt.task is not None:
        parts.append(f"of task {flt.task}")
    if flt.error_type is not None:
        parts.append(f"with error {flt.error_type}")
    if flt.since is not None:
        verb = "finished" if flt.state.is_final else "enqueued"
        parts.append(f"{verb} in the last {_duration(flt.since)}")
    if flt.where:
        parts.append("where " + " and ".join(flt.where))
    return ", ".join(parts)


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


# -- --where -------------------------------------------------------------------------


def _optional_inner(tp: Any) -> Any:
    """``X`` for ``X | None`` (a model behind an optional field), else ``tp``."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return tp


def _model_fields(model: Any) -> dict[str, Any] | None:
    """The fields of a msgspec or Pydantic model -> their types; None for a non-model."""
    model = _optional_inner(model)
    if isinstance(model, type) and issubclass(model, msgspec.Struct):
        return {f.name: f.type for f in msgspec.structs.fields(model)}
    if isinstance(model, type) and issubclass(model, pydantic.BaseModel):
        return {name: f.annotation for name, f in model.model_fields.items()}
    return None


def _parse_value(tp: Any, raw: str, pydantic_model: bool) -> Any:
    """``raw`` as a value of type ``tp`` (``"3"`` -> 3, ``"true"`` -> True, ``null`` ->
    None for an optional field; containers as JSON)."""
    if raw == "null" and type(None) in typing.get_args(tp):
        return None  # an optional field: null is None (also for a str | None field)
    if tp is str:
        return raw
    if pydantic_model:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(tp)
        try:
            return adapter.validate_python(raw)
        except pydantic.ValidationError:
            return adapter.validate_json(raw)
    try:
        return msgspec.convert(raw, tp, strict=False)
    except msgspec.ValidationError:
        return msgspec.json.decode(raw.encode(), type=tp, strict=False)


def parse_where(task: TaskBase[Any, Any], text: str) -> Where:
    """``field=value`` (or ``a.b=value``) against ``task``'s input model.

    :raises ConfigError: one line: no ``=``, an unknown field (the model's fields
        listed), or a value the field's type does not take
    """
    name, sep, raw = text.partition("=")
    name = name.strip()
    if not sep or not name:
        raise ConfigError(f"--where {text!r} is not field=value (e.g. --where 'customer=42')")
    model: Any = task.input.type
    path = tuple(name.split("."))
    tp: Any = model
    pydantic_model = False
    for depth, part in enumerate(path):
        fields = _model_fields(tp)
        where = ".".join(path[:depth]) or "the payload"
        if fields is None:
            raise ConfigError(
                f"--where {text!r}: {where} of task {task.name!r} is not a model, it has no "
                f"field {part!r}"
            )
        if part not in fields:
            model_name = getattr(_optional_inner(tp), "__qualname__", str(tp))
            raise ConfigError(
                f"--where {text!r}: {model_name} (task {task.name!r}"
                f"{'' if depth == 0 else ', at ' + where}) has no field {part!r}; its fields: "
                f"{', '.join(fields) or 'none'}"
            )
        pydantic_model = isinstance(_optional_inner(tp), type) and issubclass(
            _optional_inner(tp), pydantic.BaseModel
        )
        tp = fields[part]
    if raw == "null" and type(None) in typing.get_args(tp):
        return Where(path=path, text=text, value=None)  # an optional field left empty
    if _model_fields(tp) is not None:
        inner = _model_fields(tp) or {}
        raise ConfigError(
            f"--where {text!r}: {name} is a model; name one of its fields "
            f"({', '.join(f'{name}.{f}' for f in inner)})"
        )
    try:
        value = _parse_value(tp, raw, pydantic_model)
    except (msgspec.ValidationError, msgspec.DecodeError, pydantic.ValidationError):
        shown = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        raise ConfigError(f"--where {text!r}: {name} is {shown}; {raw!r} is not one") from None
    return Where(path=path, text=text, value=value)


_MISSING = object()


def _field_value(model: Any, path: tuple[str, ...]) -> Any:
    """The payload's value at ``path``; _MISSING past a nested model that is None."""
    value = model
    for part in path:
        if value is None:
            return _MISSING
        value = getattr(value, part, _MISSING)
    return value


# -- the walk --------------------------------------------------------------------------


class BulkQuery:
    """A filter over an app's jobs: count, preview and act (see the module's docs).

    :param client: connected to the app's broker
    :param queues: the queues to look in (the app's); a known ``task`` narrows them to
        its queue (or its partitions) among them
    :param filter: the filter
    :param tasks: the app's tasks by name (``where`` needs the task's input model); empty
        when only the app's name is known (``--app NAME``): then ``where`` is refused
    :param clock: the time ``since`` counts from, when the broker has no clock of its own
    :raises ConfigError: a bad filter, in one line
    """

    def __init__(
        self,
        client: Client,
        queues: Sequence[str],
        filter: JobFilter,
        *,
        tasks: Mapping[str, TaskBase[Any, Any]] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        tasks = tasks or {}
        self.client = client
        self.filter = filter
        self.clock = clock
        task = tasks.get(filter.task) if filter.task is not None else None
        if filter.task is not None and task is None and tasks:
            raise ConfigError(
                f"--task {filter.task!r} is not a task of app {client.name!r}; its tasks: "
                f"{', '.join(sorted(tasks))}"
            )
        if filter.where and filter.task is None:
            raise ConfigError(
                "--where needs exactly one --task: the payload is read with that task's input model"
            )
        if filter.where and task is None:
            raise ConfigError(
                "--where needs the app's tasks (their input models): give MODULE:APP, not "
                "--app NAME"
            )
        if filter.since is not None and not filter.since >= 0:
            raise ConfigError(f"--since must be a duration >= 0, got {filter.since}")
        self.task = task
        self.wheres = [parse_where(task, w) for w in filter.where] if task is not None else []
        looked = set(queues)
        if task is not None:
            # The task's jobs are only in its queue (or partitions): look there alone.
            looked = {q for q in task.queues if q in looked}
            if not looked:
                raise ConfigError(
                    f"task {task.name!r} stores its jobs in {', '.join(task.queues)}, not in "
                    f"the queues asked ({', '.join(sorted(set(queues))) or 'none'})"
                )
        self.queues = sorted(looked)
        if not self.queues:
            raise ConfigError("no queue to look in: give --queue NAME")
        # Payloads are decoded only when a where condition reads them.
        self._decode_payload: Callable[[bytes], Any] | None = (
            task.input.decode if task is not None and self.wheres else None
        )

    # -- matching ------------------------------------------------------------------------

    def matches(self, record: JobRecord, cutoff: float | None) -> bool:
        """Whether ``record`` matches the filter (``cutoff``: the epoch time ``since``
        counts from, or None)."""
        f = self.filter
        if record.state is not f.state:
            return False
        message = record.message
        if f.task is not None and message.task != f.task:
            return False
        if cutoff is not None and self._when(record) < cutoff:
            return False
        if f.error_type is not None:
            if record.error is None:
                return False
            try:
                error_type = decode_failure(record.error, message.id).error_type
            except BrokerDataError:
                return False
            wanted = f.error_type
            if error_type != wanted and not error_type.endswith("." + wanted):
                return False
        if self._decode_payload is not None:
            try:
                payload = self._decode_payload(message.payload)
            except TypedqError:
                return False  # a payload the model does not read matches no value
            for where in self.wheres:
                if _field_value(payload, where.path) != where.value:
                    return False
        return True

    def _when(self, record: JobRecord) -> float:
        return record.finished_at if record.state.is_final else record.enqueued_at

    async def cutoff(self) -> float | None:
        """The epoch time ``since`` counts from: now (the broker's clock, or this
        process's when the broker keeps none) minus ``since``."""
        if self.filter.since is None:
            return None
        try:
            now = await self.client.broker.broker_time_us() / 1_000_000
        except Unsupported:
            now = self.clock.time()
        return now - self.filter.since

    async def totals(self) -> dict[str, int]:
        """Jobs in the filter's state, per queue (an upper bound of the matches)."""
        stats = await self.client.broker.queue_stats(self.queues)
        return {s.queue: s.counts.get(self.filter.state, 0) for s in stats}

    async def pages(
        self, *, size: int = BATCH
    ) -> AsyncGenerator[tuple[str, int, list[JobRecord]], None]:
        """Walk the state once, queue by queue: per page, its queue, how many jobs it
        examined and the records that match. Bounded: one page in memory at a time.

        Each queue's walk follows :meth:`page_jobs` cursors from the state's start, and
        examines at most as many jobs as the state held when it began (jobs that arrive
        meanwhile are not chased). The final states are ordered by finish time, newest
        first: with ``since``, the walk stops at the first older job.
        """
        cutoff = await self.cutoff()
        broker = self.client.broker
        state = self.filter.state
        ordered_by_time = state.is_final
        for queue, remaining in (await self.totals()).items():
            cursor: str | None = None
            while remaining > 0:
                listed = await broker.page_jobs(
                    queue, state, cursor=cursor, limit=min(size, remaining)
                )
                if not listed.ids:
                    break
                remaining -= len(listed.ids)
                if state is JobState.WAITING:
                    # A waiting job that lives only in its queue's list is found by a
                    # search of the list on Redis (~0.1 ms per id at 100,000 waiting):
                    # small reads keep each call short.
                    records = []
                    for at in range(0, len(listed.ids), _WAITING_GET_CHUNK):
                        chunk = listed.ids[at : at + _WAITING_GET_CHUNK]
                        records += await broker.get(chunk, queue=queue)
                else:
                    records = await broker.get(listed.ids, queue=queue)
                matched = []
                older = False
                for record in records:
                    if record is None:
                        continue
                    if self.matches(record, cutoff):
                        matched.append(record)
                    elif (
                        ordered_by_time
                        and cutoff is not None
                        and record.state is state
                        and record.finished_at < cutoff
                    ):
                        older = True
                yield queue, len(listed.ids), matched
                if older or listed.cursor is None:
                    break
                cursor = listed.cursor

    # -- the three uses ------------------------------------------------------------------

    async def preview(self, *, limit: int = 20) -> BulkPreview:
        """How many jobs match, and the first ``limit`` of them (walks the whole state:
        the count is exact)."""
        total = examined = 0
        jobs: list[JobView] = []
        async with contextlib.aclosing(self.pages()) as pages:
            async for _, seen, matched in pages:
                examined += seen
                total += len(matched)
                jobs += [job_view(r) for r in matched[: max(0, limit - len(jobs))]]
        return BulkPreview(
            filter=self.filter, queues=self.queues, total=total, examined=examined, jobs=jobs
        )

    async def count(self) -> int:
        """How many jobs match now."""
        total = 0
        async with contextlib.aclosing(self.pages()) as pages:
            async for _, _, matched in pages:
                total += len(matched)
        return total

    async def apply(
        self,
        action: BulkAction,
        *,
        dry_run: bool = False,
        progress: Callable[[BulkReport, int], None] | None = None,
        size: int = BATCH,
    ) -> BulkReport:
        """Retry, cancel or remove every matching job, a page at a time.

        :param dry_run: act on nothing; the report counts what would be acted on
        :param progress: called after each page with the report so far and the number
            of jobs the walk may examine at most (the state's count at the start)
        :param size: jobs per page
        :raises ConfigError: ``action`` does not apply to the filter's state
        """
        check_action(action, self.filter.state)
        examined = matched = done = 0
        outcomes: dict[str, int] = {}
        bound = sum((await self.totals()).values())
        report = self._report(action, dry_run, 0, 0, 0, outcomes)
        # The next page is read while this one is acted on (one page ahead, no more): a
        # cursor names a place in the state's order, so the jobs the action moves out of
        # the state meanwhile do not shift it.
        send, receive = anyio.create_memory_object_stream[tuple[str, int, list[str]]](1)

        async def read() -> None:
            async with send, contextlib.aclosing(self.pages(size=size)) as pages:
                async for queue, seen, records in pages:
                    try:
                        await send.send((queue, seen, [r.message.id for r in records]))
                    except anyio.BrokenResourceError:
                        # The consumer stopped (its own error, e.g. the progress
                        # callback's, says why): not a second error beside it.
                        return

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                async with receive:
                    async for queue, seen, ids in receive:
                        examined += seen
                        matched += len(ids)
                        if ids and not dry_run:
                            for outcome in await self._act(action, queue, ids):
                                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                                done += outcome in BULK_DONE
                        report = self._report(action, dry_run, examined, matched, done, outcomes)
                        if progress is not None:
                            progress(report, bound)
        except BaseExceptionGroup as group:
            # The reader's or the caller's error as itself (a BrokerError, the progress
            # callback's), not wrapped in the task group's group.
            raise _sole(group) from None
        return report

    def _report(
        self,
        action: BulkAction,
        dry_run: bool,
        examined: int,
        matched: int,
        done: int,
        outcomes: dict[str, int],
    ) -> BulkReport:
        return BulkReport(
            action=action,
            filter=self.filter,
            dry_run=dry_run,
            examined=examined,
            matched=matched,
            done=done,
            outcomes=dict(outcomes),
        )

    async def _act(self, action: BulkAction, queue: str, ids: list[str]) -> list[str]:
        broker = self.client.broker
        if action == "retry":
            return [o.value for o in await broker.retry(ids, queue=queue)]
        if action == "remove":
            # Only while still in the state the filter matched: a job that moved on
            # since it was read (retried, finished) is left alone.
            removed = await broker.remove(ids, states=[self.filter.state], queue=queue)
            return ["removed" if ok else "not_found" for ok in removed]
        # The broker cancels one job per call; many calls run concurrently, bounded.
        out: dict[str, str] = {}
        limiter = anyio.CapacityLimiter(_CANCEL_CONCURRENCY)

        async def cancel(job_id: str) -> None:
            async with limiter:
                out[job_id] = (await broker.cancel(job_id, queue=queue)).value

        async with anyio.create_task_group() as tg:
            for job_id in ids:
                tg.start_soon(cancel, job_id)
        return [out[i] for i in ids]


def _sole(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The one exception a group of one holds (through nested groups), else the group."""
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc
