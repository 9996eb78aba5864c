"""The failure records a broker writes itself: jobs cancelled outside a handler, and
jobs whose lease expired too often.

A worker builds the records of the attempts it ran (:mod:`typedq.execution`); a broker
builds these, when no worker is there to do it: a cancel of a waiting or scheduled job,
a cancel requested while a worker handed the job back or was lost, and a job past
``max_stalls``. The memory broker calls :func:`broker_failure`; the Redis broker's Lua
scripts build the same records with ``failure_record`` (in
``redis/lua/common/bookkeeping.lua``) and the messages below
(``tests/redis/test_failure_records.py`` holds the two to the same fields).
"""

from __future__ import annotations

from typing import Literal

from ..errors import FailureReason, FailureRecord

__all__ = [
    "CANCELLED_ON_HAND_BACK",
    "CANCELLED_WITH_FLOW",
    "CANCELLED_WORKER_LOST",
    "RUN_CANCELLED",
    "BrokerFailure",
    "broker_failure",
    "cancelled_while",
    "parked_trimmed_message",
    "stalled_message",
]

#: What a broker finalises a job as: cancelled, or failed because its lease kept expiring.
BrokerFailure = Literal["cancelled", "stalled", "flow_broken"]

_KINDS: dict[BrokerFailure, tuple[FailureReason, str]] = {
    "cancelled": (FailureReason.CANCELLED, "JobCancelled"),
    "stalled": (FailureReason.STALLED, "WorkerLost"),
    "flow_broken": (FailureReason.FLOW_BROKEN, "FlowBroken"),
}

#: A job of a workflow was cancelled because the flow ended (cancelled or failed) first.
CANCELLED_WITH_FLOW = "cancelled with its flow"

#: A cancel was requested while the job ran, and its worker handed it back unrun.
CANCELLED_ON_HAND_BACK = "cancelled while its worker handed it back"
#: A cancel was requested while the job ran, and its lease expired before the worker
#: recorded the cancellation.
CANCELLED_WORKER_LOST = "cancelled; its worker was lost before it confirmed"

#: A durable run was cancelled (``cancel_runs``): the run's failure record.
RUN_CANCELLED = "run cancelled"


def cancelled_while(state: str) -> str:
    """The message of a job cancelled before any worker ran it (``waiting``, ``scheduled``)."""
    return f"cancelled while {state}"


def parked_trimmed_message(job_id: str, message: str) -> str:
    """The message a flow fails with when failed-job retention deleted its parked job
    ``job_id`` before an operator retried it; ``message`` is the job's own failure's
    (the record keeps its reason, ``schema_mismatch``, its error type and attempt). The
    Redis twin spells it in ``redis/lua/common/flow_settle.lua`` (``trim_parked``: the
    library's main chunk has no local left for a constant); the contract test
    ``tests/contract/test_parked_jobs.py`` holds the two to the same text."""
    return (
        f"parked job {job_id} was deleted by failed-job retention before a retry, so its "
        f"flow fails; it had failed with: {message}"
    )


def stalled_message(stalls: int, max_stalls: int) -> str:
    """The message of a job failed because its lease expired more than ``max_stalls`` times."""
    return (
        f"the job's lease expired {stalls} times (worker lost {stalls} times, possible "
        f"poison pill); limit max_stalls={max_stalls}"
    )


def broker_failure(
    kind: BrokerFailure,
    message: str,
    *,
    attempt: int,
    failed_at: float,
    worker_id: str | None = None,
) -> FailureRecord:
    """The record a broker stores when it finalises a job itself (never retryable).

    :param kind: ``cancelled`` (reason ``cancelled``, ``JobCancelled``) or ``stalled``
        (reason ``stalled``, ``WorkerLost``)
    :param message: one of this module's messages
    :param attempt: the job's attempt count when it was finalised
    :param failed_at: epoch seconds (the broker's clock)
    :param worker_id: the worker that last held the job, if one did
    """
    reason, error_type = _KINDS[kind]
    return FailureRecord(
        reason=reason,
        error_type=error_type,
        message=message,
        attempt=attempt,
        retryable=False,
        worker_id=worker_id,
        failed_at=failed_at,
    )
