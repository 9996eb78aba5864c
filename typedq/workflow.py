"""Typed workflows: chains, fan-out and fan-in, handed off inside the broker.

::

    flow = parse.then(enrich).then(store)          # Chain[RawDoc, Stored]
    job = await flow.enqueue(RawDoc(...))          # Job[Stored]
    fan = await resize.map(images).enqueue()       # Job[list[Thumb]], in input order
    job = await resize.map(images).then(make_album).enqueue()   # make_album: list[Thumb]
    job = await resize.map(images).collect(report).enqueue()    # report: list[Ok[Thumb] | Failed]

mypy accepts ``a.then(b)`` only when ``b``'s input type is ``a``'s output type, a fan-in
callback only when its input is ``list[Out]`` (``collect``: ``list[Ok[Out] | Failed]``),
and types the flow's ``Job`` with the last step's output. Callers mypy does not check get
a :class:`~typedq.errors.ConfigError` when the flow is built.

A flow is stored in one broker call (every job of it at once, see
:mod:`typedq.broker.flow` for the representation and the guarantees; on Redis a large
fan-out is stored in bounded steps, :mod:`typedq.broker.redis.staging`); its ``Job`` is the
last step's, so ``job.result()`` waits for the whole flow and ``job.cancel()`` cancels
what has not finished. Failure policy: a step that fails (after its retries) fails the
flow with its FailureRecord, and later steps never run; ``then`` after a fan-out fails
the flow once every member has settled if any member failed (the first failed member's
record, by input order); ``collect`` runs the callback whatever the members' fate.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar, cast

import msgspec
import pydantic

from .broker.base import JobMessage
from .broker.flow import FlowSpec, member_id, step_id
from .errors import ConfigError
from .fanin import Failed, Ok
from .job import Job
from .limits import limit_key
from .names import check_job_id, new_job_id
from .serde import Codec, codec_for, is_model_type, list_item

if TYPE_CHECKING:
    from .client import Client
    from .task import TaskBase

__all__ = ["Chain", "FanOut", "Flow"]

_Model = msgspec.Struct | pydantic.BaseModel
_Input = msgspec.Struct | pydantic.BaseModel | Sequence[msgspec.Struct | pydantic.BaseModel]

A = TypeVar("A", bound=_Input)
#: A step's output, as the next step's input (or, in a list, a fan-in callback's).
M = TypeVar("M", bound=_Model)
B = TypeVar("B", bound=msgspec.Struct | pydantic.BaseModel | None)
TIn = TypeVar("TIn", bound=_Input)
TOut = TypeVar("TOut")


def _describe(task: TaskBase[Any, Any]) -> str:
    return f"task {task.name!r}"


def _check_next(prev: TaskBase[Any, Any], task: TaskBase[Any, Any]) -> None:
    """``task`` may take ``prev``'s output as its input (for callers mypy does not check)."""
    if task.input.type != prev.output.type:
        raise ConfigError(
            f"{_describe(task)} takes {task.input.name} but {_describe(prev)} returns "
            f"{prev.output.name}: a chain step's input must be the previous step's output"
        )


def _check_fan_in(member: TaskBase[Any, Any], task: TaskBase[Any, Any], *, collect: bool) -> None:
    item = list_item(task.input.type)
    want = f"list[Ok[{member.output.name}] | Failed]" if collect else f"list[{member.output.name}]"
    if item != (member.output.type, collect):
        raise ConfigError(
            f"{_describe(task)} takes {task.input.name} but a fan-in of {_describe(member)} "
            f"gives {want}: use a callback whose input is {want}"
        )


def _client(tasks: Iterable[TaskBase[Any, Any]]) -> Client:
    clients = {id(t._owner.client): t._owner.client for t in tasks}
    if len(clients) != 1:
        raise ConfigError("every task of a flow must belong to the same App (or Client)")
    return next(iter(clients.values()))


def _check_held(task: TaskBase[Any, Any]) -> None:
    """A step whose input is an earlier step's result is stored before its input exists,
    and the broker never decodes a result: a limit keyed on the input cannot apply."""
    for what, limit in (("rate_limit", task.rate_limit), ("concurrency", task.concurrency)):
        if limit is not None and limit.key is not None:
            raise ConfigError(
                f"{_describe(task)} has a {what} keyed on its input, so it cannot run after "
                "another step of a flow (its key would come from a result the broker does "
                "not decode): use it as the first step or a fan-out, or a limit without key="
            )


class _Given(NamedTuple):
    """A payload known at enqueue: its bytes and the limit and fair keys it gives."""

    payload: bytes
    rate_key: str
    concurrency_key: str
    fair_key: str = ""
    fair_weight: int = 0


def _given(task: TaskBase[Any, Any], model: Any) -> _Given:
    rate, conc = task.rate_limit, task.concurrency
    fair_key, fair_weight = task.fair.share(task.name, model) if task.fair else ("", 0)
    return _Given(
        task.input.encode(model),
        limit_key(task.name, rate.key, model) if rate is not None else "",
        limit_key(task.name, conc.key, model) if conc is not None else "",
        fair_key,
        fair_weight,
    )


#: A held step's: no payload yet (and no limit key, see _check_held; no fair key: a
#: held step of a fair task waits as a plain job once released).
_HELD = _Given(b"", "", "")


def _envelope(
    task: TaskBase[Any, Any], flow_id: str, job_id: str, given: _Given = _HELD
) -> JobMessage:
    # A partitioned task's jobs of one flow all go to the partition of the flow's id,
    # so the flow stays on one queue (one slot on Redis Cluster).
    return JobMessage(
        id=job_id,
        task=task.name,
        queue=task.queue_for(flow_id),
        payload=given.payload,
        fingerprint=task.input.fingerprint,
        priority=task.options.priority,
        rate_key=given.rate_key,
        concurrency_key=given.concurrency_key,
        fair_key=given.fair_key,
        fair_weight=given.fair_weight,
    )


def _flow_id(job_id: str | None, last: str) -> str:
    flow_id = new_job_id() if job_id is None else check_job_id(job_id)
    check_job_id(last.replace("{}", flow_id))  # the longest derived id still fits
    return flow_id


def _errors(tasks: Iterable[TaskBase[Any, Any]]) -> tuple[type[Any], ...]:
    seen: dict[type[Any], None] = {}
    for task in tasks:
        seen.update(dict.fromkeys(task.options.errors))
    return tuple(seen)


async def _store(
    spec: FlowSpec,
    client: Client,
    task: str,
    output: Codec[TOut],
    errors: tuple[type[Any], ...],
    within: object | None,
) -> Job[TOut]:
    if within is not None:
        outcome = await client._enqueue_flow_within(within, spec)
    else:
        outcome = await client._enqueue_flow(spec)
    return Job(
        client,
        outcome.id,
        task,
        output,
        errors,
        created=outcome.created,
        queue=spec.steps[-1].queue,
    )


class Chain(Generic[TIn, TOut]):
    """Tasks run one after the other, each taking the previous one's result.

    Made by ``task.then(next)``; ``Chain[TIn, TOut]`` takes the first step's input and
    gives the last step's output.
    """

    __slots__ = ("_steps",)

    def __init__(self, steps: Sequence[TaskBase[Any, Any]]) -> None:
        if len(steps) < 2:
            raise ConfigError("a chain has at least two steps")
        for prev, task in itertools.pairwise(steps):
            _check_next(prev, task)
            _check_held(task)
        _client(steps)
        self._steps = tuple(steps)

    def __repr__(self) -> str:
        return "Chain(" + " -> ".join(t.name for t in self._steps) + ")"

    @property
    def steps(self) -> tuple[TaskBase[Any, Any], ...]:
        """The tasks, in order."""
        return self._steps

    def then(self: Chain[A, M], task: TaskBase[M, B]) -> Chain[A, B]:
        """This chain, then ``task`` on its result."""
        return Chain([*self._steps, task])

    def spec(self, payload: TIn, *, job_id: str | None = None) -> FlowSpec:
        """The flow as the broker stores it (validated and encoded)."""
        first = self._steps[0]
        n = len(self._steps)
        flow_id = _flow_id(job_id, f"{{}}.{n - 2}")
        given = _given(first, payload)
        steps = [
            _envelope(task, flow_id, step_id(flow_id, k, n), given if k == 0 else _HELD)
            for k, task in enumerate(self._steps)
        ]
        return FlowSpec(id=flow_id, steps=tuple(steps))

    async def enqueue(
        self, payload: TIn, *, job_id: str | None = None, within: object | None = None
    ) -> Job[TOut]:
        """Store the whole chain in one broker call; the Job is the last step's.

        :param payload: the first step's input
        :param job_id: the flow's id (idempotent: a flow whose id exists is not stored
            again, ``job.created`` is False)
        :param within: your database connection with a transaction open, as for
            ``task.enqueue``: the flow is stored in that transaction, all of it if and
            only if it commits (the PostgreSQL broker; Unsupported on another)
        """
        last = self._steps[-1]
        spec = self.spec(payload, job_id=job_id)
        return await _store(
            spec, _client(self._steps), last.name, last.output, _errors(self._steps), within
        )


class FanOut(Generic[TOut]):
    """One task over many inputs (``task.map(inputs)``); ``enqueue()`` gives
    ``Job[list[TOut]]``, the results in input order. ``then`` and ``collect`` fan in."""

    __slots__ = ("_payloads", "_task")

    def __init__(self, task: TaskBase[Any, Any], inputs: Iterable[Any]) -> None:
        if not is_model_type(task.output.type):
            raise ConfigError(
                f"{_describe(task)} returns {task.output.name}: a fan-out's task must return a "
                "model (its results travel as a list of them)"
            )
        self._task = task
        # Encoded (checked: model class, size) now: a bad input fails here, not later.
        self._payloads = [_given(task, item) for item in inputs]

    def __repr__(self) -> str:
        return f"FanOut({self._task.name!r} x {len(self._payloads)})"

    def __len__(self) -> int:
        return len(self._payloads)

    def then(self: FanOut[M], task: TaskBase[list[M], B]) -> Flow[B]:
        """Fan in: once every member has settled, ``task`` gets their results in input order.

        If a member failed (after its retries) the flow fails with the first failed
        member's record and ``task`` never runs.
        """
        _check_fan_in(self._task, task, collect=False)
        return Flow(self, [task], collect=False)

    def collect(self: FanOut[M], task: TaskBase[list[Ok[M] | Failed], B]) -> Flow[B]:
        """Fan in every member's outcome: ``task`` runs once all have settled, whatever
        their fate, and gets ``Ok(result)`` or ``Failed(record)`` per member, in input order.
        """
        _check_fan_in(self._task, task, collect=True)
        return Flow(self, [task], collect=True)

    def _members(self, flow_id: str) -> tuple[JobMessage, ...]:
        return tuple(
            _envelope(self._task, flow_id, member_id(flow_id, i), payload)
            for i, payload in enumerate(self._payloads)
        )

    def spec(self, *, job_id: str | None = None) -> FlowSpec:
        """The flow as the broker stores it."""
        flow_id = _flow_id(job_id, f"{{}}.m{max(len(self._payloads) - 1, 0)}")
        collector = _envelope(self._task, flow_id, flow_id)
        return FlowSpec(
            id=flow_id,
            steps=(collector,),
            members=self._members(flow_id),
            fan_out=True,
            collector=True,
        )

    async def enqueue(
        self, *, job_id: str | None = None, within: object | None = None
    ) -> Job[list[TOut]]:
        """Store every member in one broker call; the Job completes with their results.

        A fan-out of 0 inputs completes at once with ``[]``. One that would pass the
        queue's ``max_queue_length`` is refused whole (QueueFull), nothing stored.
        ``within``: as for :meth:`Chain.enqueue`.
        """
        spec = self.spec(job_id=job_id)
        output: Codec[list[TOut]] = codec_for(cast(Any, list)[self._task.output.type])
        return await _store(
            spec, _client([self._task]), self._task.name, output, _errors([self._task]), within
        )


class Flow(Generic[TOut]):
    """A fan-out, its fan-in callback and maybe more steps; ``enqueue()`` gives ``Job[TOut]``."""

    __slots__ = ("_collect", "_fan", "_steps")

    def __init__(
        self, fan: FanOut[Any], steps: Sequence[TaskBase[Any, Any]], *, collect: bool
    ) -> None:
        for prev, task in itertools.pairwise(steps):
            _check_next(prev, task)
        for task in steps:
            _check_held(task)
        _client([fan._task, *steps])
        self._fan = fan
        self._steps = tuple(steps)
        self._collect = collect

    def __repr__(self) -> str:
        names = " -> ".join(t.name for t in self._steps)
        return f"Flow({self._fan!r} -> {names})"

    def then(self: Flow[M], task: TaskBase[M, B]) -> Flow[B]:
        """This flow, then ``task`` on its result."""
        return Flow(self._fan, [*self._steps, task], collect=self._collect)

    def spec(self, *, job_id: str | None = None) -> FlowSpec:
        """The flow as the broker stores it."""
        n = len(self._steps)
        longest = max(f"{{}}.m{max(len(self._fan) - 1, 0)}", f"{{}}.{n - 1}", key=len)
        flow_id = _flow_id(job_id, longest)
        steps = tuple(
            _envelope(task, flow_id, step_id(flow_id, k, n)) for k, task in enumerate(self._steps)
        )
        return FlowSpec(
            id=flow_id,
            steps=steps,
            members=self._fan._members(flow_id),
            fan_out=True,
            collect=self._collect,
        )

    async def enqueue(
        self, *, job_id: str | None = None, within: object | None = None
    ) -> Job[TOut]:
        """Store the whole flow in one broker call; the Job is the last step's.
        ``within``: as for :meth:`Chain.enqueue`."""
        last = self._steps[-1]
        spec = self.spec(job_id=job_id)
        tasks = [self._fan._task, *self._steps]
        return await _store(spec, _client(tasks), last.name, last.output, _errors(tasks), within)
