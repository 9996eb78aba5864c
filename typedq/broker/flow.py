"""Workflows as the broker sees them: jobs linked by a flow record, handed off on completion.

A broker knows no models, so a flow is described to it as envelopes (:class:`FlowSpec`):
``members`` (a fan-out, claimable at once) and ``steps`` (single tasks run one after the
other). The flow's own job — what ``flow.enqueue()`` returns a ``Job`` for — is the last
step, so its id is known up front and ``Job.result()`` waits on it with
``wait_finished`` like on any job: no polling.

Ids are derived from the flow id ``F`` (:func:`step_id`, :func:`member_id`): member ``i``
is ``F.m<i>``, step ``k`` is ``F.<k>``, and the last step is ``F`` itself.

Every job is created at enqueue, in one atomic call: the members (``waiting``), then the
steps. (On Redis a large fan-out is the exception: a Lua script blocks Redis while it
runs, so its members are staged and then released in bounded chunks after the flow is
stored, see :mod:`typedq.broker.redis.staging`; its callback still fires once, after the
last member settled.) A step whose input is not known yet is *held*: stored as ``scheduled`` with
``run_at = HELD_AT`` (far past any real time, so never promoted) and an empty payload.
Each job carries its link to the flow (flow id and position); the broker keeps a flow
record while the flow runs: the member count still running, each member's result (or
failure) by index, and the first member failure.

The hand-off happens in the completion path of the broker (the Lua completion script
on Redis, the same synchronous section on the embedded broker), atomically with the
step's own transition:

- step ``k`` completes: its result bytes become the payload bytes of step ``k+1``
  (results and payloads are both the msgpack of the model), which moves from held to
  ``waiting``. The Redis envelope body is ``[task, payload, ...]``, so the held job
  keeps a head and a tail around its payload and the script splices the result in
  (``head .. bin(result) .. tail``) without decoding anything.
- member ``i`` settles (completed, failed, cancelled, or removed): its result is stored
  under ``i`` and the counter is decremented; the call that brings it to zero builds the
  fan-in payload — a msgpack array of the members' result bytes, in input order — and
  releases step 0 with it. That happens once, because a member settles once (fenced by
  its lease token). With no steps after the fan-out, step 0 is a *collector*: never
  claimed, completed by the broker with that array as its result.
- collecting policy (``FlowSpec.collect``): each array element is ``["ok", result]`` or
  ``["failed", FailureRecord]`` (``typedq.workflow.Ok`` / ``Failed``), and the callback
  runs whatever the members' fate.
- default policy: once every member has settled, any member failure fails the rest of
  the flow with the first failed member's (by index) record and final state.
- a step fails or is cancelled: every held step after it ends in the same state with
  the same FailureRecord; later steps never run.
- the flow's own job is cancelled (``job.cancel()``): every job of the flow that has
  not finished is cancelled (a running one gets a cancel request).
- a job of the flow is removed before it finished: a member settles as failed, a step
  (the flow's own job too) fails the rest, with reason ``flow_broken``. Nothing waits
  forever. A purge deletes every job of its state before the flows react (on Redis: a
  job of the reacting flow in the purged state is deleted, not ended), so the outcome
  and the count do not depend on the order of deletion.

Retry (``Broker.retry``) of a step that failed or was cancelled, in a flow that has ended,
resumes the flow: the later steps its end stopped (still held: never released) are held
again and the flow record is made again, in the same atomic call; the step's completion
then hands off as the first time. A fan-out member, a step that never ran, or a job of a
running flow answers ``RetryOutcome.IN_FLOW`` and is left as it is.

The flow record is deleted when the flow ends; the jobs themselves are bounded by the
ordinary result retention. A fan-out of 0 members fans in at enqueue (payload ``[]``).
"""

from __future__ import annotations

from typing import Final

import msgspec

from ..fanin import collect_element, fan_in_payload, msgpack_array_header, msgpack_bin
from .base import JobMessage

__all__ = [
    "FLOW_BROKEN_MESSAGE",
    "HELD_AT",
    "FlowSpec",
    "FlowState",
    "collect_element",
    "fan_in_payload",
    "id_taken",
    "member_id",
    "msgpack_array_header",
    "msgpack_bin",
    "step_id",
    "waits_for",
]

#: ``run_at`` (epoch seconds) of a held step: beyond any ETA a job may have.
HELD_AT: Final = 9_000_000_000.0

FLOW_BROKEN_MESSAGE: Final = "a job of this flow was removed before it finished"


class FlowSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One flow to store: its id, its fan-out members and its steps, as envelopes.

    :ivar id: the flow's job id (= the id of the last step)
    :ivar members: the fan-out's envelopes (ids :func:`member_id`); empty for a chain
    :ivar fan_out: True when the flow starts with a fan-out (possibly of 0 members)
    :ivar steps: the single steps in order (ids :func:`step_id`); without a fan-out,
        ``steps[0]`` carries the input payload, every later step an empty one
    :ivar collector: the last step is a collector (a bare fan-out): never run, completed
        by the broker with the members' results
    :ivar collect: the collecting fan-in policy (see the module docstring)
    """

    id: str
    steps: tuple[JobMessage, ...]
    members: tuple[JobMessage, ...] = ()
    fan_out: bool = False
    collector: bool = False
    collect: bool = False


class FlowState(msgspec.Struct, frozen=True, kw_only=True):
    """A flow's shape and where it stands (``typedq inspect``).

    :ivar id: the flow's id (its own job's)
    :ivar steps: single steps (the last is the flow's own job, or its collector)
    :ivar members: fan-out members
    :ivar pending: members not settled yet; -1 once the flow has ended
    :ivar completed: members settled completed while the flow runs (counted by the
        broker as they settle, so reading them costs nothing per member); ``failed`` and
        ``cancelled`` likewise; all three are 0 once the flow has ended
    """

    id: str
    steps: int
    members: int
    pending: int
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


def waits_for(flow: FlowState, job_id: str, run_at: float) -> str:
    """What a held step waits on, for people (``typedq inspect``, the dashboard):
    ``"waiting for step 1 (F.1) of flow F"`` or ``"waiting for the fan-out (10 members)
    of flow F"``; ``""`` for a job that is not a held step of ``flow``.

    A held step's state is ``scheduled`` (the states are the six of the spec, and a held
    step behaves like one: not claimable, counted as pending); its ``run_at`` is
    :data:`HELD_AT`, which is how it is told apart from a delayed job.
    """
    if run_at < HELD_AT:
        return ""
    index = next((k for k in range(flow.steps) if step_id(flow.id, k, flow.steps) == job_id), -1)
    if index < 0:
        return ""
    if index == 0:
        return f"waiting for the fan-out ({flow.members} members) of flow {flow.id}"
    before = step_id(flow.id, index - 1, flow.steps)
    return f"waiting for step {index - 1} ({before}) of flow {flow.id}"


def id_taken(job_id: str, flow_id: str) -> str:
    """The refusal of a flow one of whose derived ids another job already has."""
    return (
        f"job id {job_id!r} of flow {flow_id!r} is taken by another job: nothing of the flow "
        "was stored; enqueue it under another id"
    )


def step_id(flow_id: str, index: int, steps: int) -> str:
    """The job id of step ``index`` of ``steps``: the last step is the flow's own job."""
    return flow_id if index == steps - 1 else f"{flow_id}.{index}"


def member_id(flow_id: str, index: int) -> str:
    """The job id of fan-out member ``index``."""
    return f"{flow_id}.m{index}"
