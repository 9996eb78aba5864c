"""One job as inspection shows it: :class:`JobView` (a row of a listing) and
:class:`JobDetail` (the job in full), built from the broker's records, with the stored
msgpack decoded to plain data. Used by :class:`typedq.inspector.Inspector`, the dashboard
and the bulk actions' preview (:mod:`typedq.bulk`); draws nothing."""

from __future__ import annotations

from typing import Any

import msgspec

from ..broker.base import JobRecord, JobState
from ..errors import BrokerDataError, FailureRecord
from ..job import decode_failure

__all__ = ["JobDetail", "JobView", "attempt_records", "job_detail", "job_view", "plain_data"]


class JobView(msgspec.Struct, frozen=True, kw_only=True):
    """One job as ``inspect`` shows it."""

    id: str
    task: str
    queue: str
    state: JobState
    attempt: int
    priority: int
    enqueued_at: float
    finished_at: float
    error: FailureRecord | None = None
    #: When a scheduled job is due (0 otherwise), and when the current attempt started.
    run_at: float = 0.0
    started_at: float = 0.0
    #: A held workflow step (state ``scheduled``): what it waits on, e.g. "waiting for
    #: step 1 (F.1) of flow F" (see typedq.broker.flow.waits_for); "" otherwise.
    waits_for: str = ""


class JobDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One job in full (``typedq inspect --job ID``): its view, payload, result, error
    record (the last failed attempt's, with its traceback) and progress. Payload,
    result and progress are the stored msgpack decoded to plain data (as JSON shows
    them); None when absent."""

    job: JobView
    payload: Any = None
    result: Any = None
    progress: Any = None
    stalls: int = 0
    worker_id: str | None = None
    cancel_requested: bool = False
    #: Every failed attempt's record, oldest first (the broker keeps the last 10).
    attempts: list[FailureRecord] = []


def job_view(record: JobRecord) -> JobView:
    """One job as ``inspect`` shows it (also the bulk actions' preview, :mod:`typedq.bulk`)."""
    message = record.message
    error = None
    if record.error is not None:
        error = decode_failure(record.error, message.id)
    return JobView(
        id=message.id,
        task=message.task,
        queue=message.queue,
        state=record.state,
        attempt=record.attempt,
        priority=message.priority,
        enqueued_at=record.enqueued_at,
        finished_at=record.finished_at,
        error=error,
        run_at=record.run_at,
        started_at=record.started_at,
    )


def plain_data(data: bytes | None) -> Any:
    """Stored msgpack as plain data; a note instead when it does not decode (the
    inspector's job view and the dashboard's)."""
    if data is None:
        return None
    try:
        return msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return f"<{len(data)} bytes that are not msgpack>"


def attempt_records(record: JobRecord) -> list[FailureRecord]:
    """Every failed attempt's record of a job, oldest first (unreadable ones left out)."""
    out = []
    for raw in record.errors:
        try:
            out.append(decode_failure(raw, record.message.id))
        except BrokerDataError:
            continue
    return out


def job_detail(record: JobRecord) -> JobDetail:
    """One job in full (``typedq inspect --job ID``)."""
    return JobDetail(
        job=job_view(record),
        payload=plain_data(record.message.payload),
        result=plain_data(record.result),
        progress=plain_data(record.progress),
        stalls=record.stalls,
        worker_id=record.worker_id,
        cancel_requested=record.cancel_requested,
        attempts=attempt_records(record),
    )
