"""Workflows on the embedded broker (see :mod:`typedq.broker.flow`): chains and fan-outs.

A flow's jobs are ordinary jobs tagged with their flow and place. Held steps are
scheduled but outside the due-time heap, so no clock (however far a test's fake clock
moves) ever promotes them; only a hand-off does. A running flow is a :class:`Flow`,
dropped when the flow ends. The same rules as the Redis twins in ``redis/lua/common/``.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import msgspec

from ...errors import ConfigError, FailureReason, FailureRecord
from ..base import MAX_SPAN_LINKS, EnqueueOutcome, JobMessage, JobState
from ..flow import (
    FLOW_BROKEN_MESSAGE,
    HELD_AT,
    FlowSpec,
    FlowState,
    collect_element,
    fan_in_payload,
    id_taken,
    member_id,
    step_id,
)
from ..records import CANCELLED_WITH_FLOW, broker_failure, parked_trimmed_message
from .jobs import SCHEDULED, Job, encode

if TYPE_CHECKING:
    from .core import JobPath

__all__ = ["Flow", "Flows"]


class Flow:
    """A running workflow; dropped when it ends."""

    __slots__ = (
        "collect",
        "collector",
        "failed",
        "id",
        "links",
        "members",
        "outcomes",
        "remaining",
        "settled",
        "steps",
        "tally",
    )

    def __init__(self, spec: FlowSpec) -> None:
        self.id = spec.id
        self.members = len(spec.members)
        self.steps = len(spec.steps)
        self.collector = spec.collector
        self.collect = spec.collect
        self.remaining = self.members
        #: Per member: its fan-in element (result bytes, or a collect element).
        self.outcomes: list[bytes | None] = [None] * self.members
        self.settled = bytearray(self.members)
        #: Settled members per final state (FlowState.completed/failed/cancelled).
        self.tally: dict[JobState, int] = {}
        #: The first failed member by index: (index, final state, record).
        self.failed: tuple[int, JobState, bytes | None] | None = None
        #: Traced members' process spans by index (the first MAX_SPAN_LINKS), which
        #: the callback's span links to (JobMessage.trace_links).
        self.links: dict[int, str] = {}


def _broken(now: float) -> bytes:
    return encode(broker_failure("flow_broken", FLOW_BROKEN_MESSAGE, attempt=0, failed_at=now))


class Flows:
    """The running flows by id, and the moves that carry a flow from job to job; the
    jobs themselves move through ``broker`` (its lines, final states and wake-ups)."""

    __slots__ = ("broker", "running")

    def __init__(self, broker: JobPath) -> None:
        self.broker = broker
        self.running: dict[str, Flow] = {}

    def enqueue(self, spec: FlowSpec) -> EnqueueOutcome:
        """Store a flow's jobs: members and the first step waiting, the rest held."""
        broker = self.broker
        jobs = broker.table.jobs
        if spec.id in jobs:
            return EnqueueOutcome(spec.id, False)
        messages = [*spec.members, *spec.steps]
        taken = next((m.id for m in messages if m.id in jobs), None)
        if taken is not None:
            raise ConfigError(id_taken(taken, spec.id))
        if broker.settings.max_queue_length:
            adding: dict[str, int] = defaultdict(int)
            for message in messages:
                adding[message.queue] += 1
            broker.table.check_room(adding, broker.queue_cap(adding), "this flow's {extra} jobs")
        now = broker.clock.time()
        flow = self.running[spec.id] = Flow(spec)
        to_waiting = broker.lines.to_waiting
        for index, message in enumerate(spec.members):
            job = self._new_job(message, now, spec.id)
            job.flow_member = index
            to_waiting(job, keep_order=True)
        for index, message in enumerate(spec.steps):
            job = self._new_job(message, now, spec.id)
            job.flow_step = index
            if index == len(spec.steps) - 1:
                job.flow_shape = (len(spec.steps), len(spec.members))
            if index == 0 and not spec.fan_out:
                # (A chain's first step leaves a fair key's weight as it is: on Redis it
                # joins its key's lane only when a claim reaches it, common/claiming.lua
                # divert.)
                to_waiting(job, keep_order=True, again=True)
            else:
                broker.table.move(job, SCHEDULED)  # held
                job.run_at = HELD_AT
        if spec.fan_out and not spec.members:
            self._fan_in(flow, now)
        return EnqueueOutcome(spec.id, True)

    def _new_job(self, message: JobMessage, now: float, flow_id: str) -> Job:
        # A job id taken by an unrelated job is replaced in no case: flow ids are fresh.
        table = self.broker.table
        job = Job(message, now, table.next_order())
        job.flow_id = flow_id
        table.jobs[message.id] = job
        table.counts[message.queue][JobState.WAITING] += 1  # move() subtracts from it
        self.broker.registry.queues.add(message.queue)
        return job

    def note_span(self, job: Job, span: str) -> None:
        """Keep a fan-out member's process span for its callback's links (as flow_settle
        in redis/lua/common/: the first settle of the first MAX_SPAN_LINKS members)."""
        index = job.flow_member
        flow = None if job.flow_id is None else self.running.get(job.flow_id)
        if flow is not None and 0 <= index < MAX_SPAN_LINKS and not flow.settled[index]:
            flow.links[index] = span

    def settled(
        self, job: Job, state: JobState, result: bytes | None, error: bytes | None, now: float
    ) -> None:
        """A job of a flow reached a final state (or was removed): hand off or end."""
        assert job.flow_id is not None
        flow = self.running.get(job.flow_id)
        if flow is None:
            return  # the flow has ended: a late member or a cancelled step
        if job.flow_member >= 0:
            index = job.flow_member
            if flow.settled[index]:
                return  # settled before (a retried member): counted once
            flow.settled[index] = 1
            flow.tally[state] = flow.tally.get(state, 0) + 1
            ok = state is JobState.COMPLETED
            if flow.collect:
                flow.outcomes[index] = collect_element(result if ok else None, error)
            elif ok:
                flow.outcomes[index] = result
            elif flow.failed is None or index < flow.failed[0]:
                flow.failed = (index, state, error)
            flow.remaining -= 1
            if flow.remaining == 0:
                self._fan_in(flow, now)
            return
        if state is JobState.COMPLETED:
            if job.flow_step == flow.steps - 1:
                del self.running[flow.id]
            else:
                self._release(flow, job.flow_step + 1, result or b"\xc0", now)
        elif job.flow_step == flow.steps - 1 and state is JobState.CANCELLED:
            # The flow's own job was cancelled first: cancel everything else. (Removed,
            # it fails the rest with flow_broken like any removed step: a purge that
            # takes a held step and the flow's own job gives one answer in any order.)
            self._end(flow, JobState.CANCELLED, None, now)
        else:
            self._end(flow, state, error, now)

    def removed(self, job: Job) -> None:
        """A deleted job of a flow had not finished (or was parked: its flow waited for
        it): its flow treats it as failed with reason ``flow_broken`` (attempt 0, like
        the Redis twin ``flow_removed``)."""
        if job.flow_id is not None and (not job.state.is_final or job.parked):
            job.parked = False
            now = self.broker.clock.time()
            self.settled(job, JobState.FAILED, None, _broken(now), now)

    def parked_trimmed(self, job: Job, now: float) -> None:
        """Failed-job retention deleted parked ``job`` before an operator retried it: its
        flow, which waited for it, settles it as failed (a member counted once, a step
        ending the flow) with the job's own reason (``schema_mismatch``), error type and
        attempt, and a message that says what happened (the Redis twin:
        ``flow_ops.trim_parked`` in redis/lua/common/flow_settle.lua)."""
        if job.flow_id is None:
            return
        try:
            own = msgspec.msgpack.decode(job.error or b"", type=FailureRecord)
        except (msgspec.DecodeError, msgspec.ValidationError):
            own = FailureRecord(
                reason=FailureReason.SCHEMA_MISMATCH,
                error_type="SchemaMismatch",
                message="",
                attempt=0,
                retryable=False,
            )
        record = FailureRecord(
            reason=own.reason,
            error_type=own.error_type,
            message=parked_trimmed_message(job.message.id, own.message),
            attempt=own.attempt,
            retryable=False,
            failed_at=now,
        )
        self.settled(job, JobState.FAILED, None, encode(record), now)

    def _fan_in(self, flow: Flow, now: float) -> None:
        if flow.failed is not None:
            _, state, error = flow.failed
            self._end(flow, state, error, now)
            return
        payload = fan_in_payload([o or b"\xc0" for o in flow.outcomes])
        flow.outcomes = []
        links = ",".join(flow.links[i] for i in sorted(flow.links))
        self._release(flow, 0, payload, now, links)

    def _release(self, flow: Flow, index: int, payload: bytes, now: float, links: str = "") -> None:
        """Give held step ``index`` its input: waiting now (or, a collector, completed).
        ``links``: the members' spans, for a fan-in callback that carries a trace context."""
        broker = self.broker
        job = broker.table.jobs.get(step_id(flow.id, index, flow.steps))
        if job is None or job.state is not JobState.SCHEDULED:
            self._end(flow, JobState.FAILED, _broken(now), now)
            return
        if flow.collector and index == flow.steps - 1:
            job.result = payload
            broker.to_final(job, JobState.COMPLETED, now)  # the flow's job: ends the flow
            return
        if links and job.message.trace_context:
            job.message = msgspec.structs.replace(job.message, payload=payload, trace_links=links)
        else:
            job.message = msgspec.structs.replace(job.message, payload=payload)
        # At the head of its priority level (the latest released first, like a push at
        # the head of the Redis level list): a flow under way finishes before new work.
        broker.lines.to_waiting(job, keep_order=False, at_head=True, due=now)
        broker.wake()

    def _end(self, flow: Flow, state: JobState, error: bytes | None, now: float) -> None:
        """End a flow that did not complete: every job of it not yet final ends in ``state``
        with ``error`` (None: a cancel record); a running one is asked to cancel."""
        broker = self.broker
        jobs = broker.table.jobs
        self.running.pop(flow.id, None)
        ids = [member_id(flow.id, i) for i in range(flow.members)]
        ids += [step_id(flow.id, k, flow.steps) for k in range(flow.steps)]
        for job_id in ids:
            job = jobs.get(job_id)
            if job is None or job.state.is_final:
                continue
            if job.state is JobState.ACTIVE:
                broker.request_cancel(job)
                continue
            job.error = error or encode(
                broker_failure("cancelled", CANCELLED_WITH_FLOW, attempt=job.attempt, failed_at=now)
            )
            broker.to_final(job, state if error is not None else JobState.CANCELLED, now)

    def retry(self, job: Job) -> bool:
        """A failed or cancelled job of a flow is retried: may it run again? A step that
        ran, of a flow that has ended, resumes the flow (its later steps, ended with it
        and never run, are held again); a fan-out member, a step that never ran, a job
        of a running flow or of a flow whose later steps are gone may not (see the Redis
        twin, ``flow_retry`` in redis/lua/common/)."""
        assert job.flow_id is not None
        if job.parked:
            # Parked: its flow still waits for it (running), it goes on from here.
            job.parked = False
            return job.flow_id in self.running
        if job.flow_member >= 0 or job.flow_id in self.running:
            return False
        if not job.message.payload:
            return False  # held when its flow ended: never ran (a payload is never b"")
        broker = self.broker
        jobs = broker.table.jobs
        own = jobs.get(job.flow_id)
        if own is None or own.flow_shape is None:
            return False
        steps, members = own.flow_shape
        later = [jobs.get(step_id(job.flow_id, k, steps)) for k in range(job.flow_step + 1, steps)]
        held: list[Job] = []
        for step in later:
            if step is None or step.state not in (JobState.FAILED, JobState.CANCELLED):
                return False
            if step.message.payload:
                return False  # ran (released): not a step this flow's end stopped
            held.append(step)
        for step in held:
            broker.finished.by_state[step.state].pop(step.message.id, None)
            step.error = None
            step.finished_at = 0.0
            broker.table.move(step, JobState.SCHEDULED)
            step.run_at = HELD_AT
        flow = Flow(FlowSpec(id=job.flow_id, steps=tuple(self._steps(job.flow_id, steps))))
        flow.members = members
        self.running[job.flow_id] = flow
        return True

    def _steps(self, flow_id: str, steps: int) -> list[JobMessage]:
        out = []
        for k in range(steps):
            step = self.broker.table.jobs.get(step_id(flow_id, k, steps))
            assert step is not None
            out.append(step.message)
        return out

    def state(self, flow_id: str) -> FlowState | None:
        """A flow's progress, by its id or the id of one of its jobs."""
        jobs = self.broker.table.jobs
        job = jobs.get(flow_id)
        if job is not None and job.flow_id is not None:
            flow_id = job.flow_id
        flow = self.running.get(flow_id)
        if flow is not None:
            return FlowState(
                id=flow_id,
                steps=flow.steps,
                members=flow.members,
                pending=flow.remaining,
                completed=flow.tally.get(JobState.COMPLETED, 0),
                failed=flow.tally.get(JobState.FAILED, 0),
                cancelled=flow.tally.get(JobState.CANCELLED, 0),
            )
        own = jobs.get(flow_id)
        if own is None or own.flow_shape is None:
            return None
        return FlowState(id=flow_id, steps=own.flow_shape[0], members=own.flow_shape[1], pending=-1)
