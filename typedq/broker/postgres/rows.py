"""The rows of the PostgreSQL broker's schema as the seam's values: job records, claims,
schedule states, and the codes its functions answer with."""

from __future__ import annotations

from typing import Any

import msgspec

from ..base import (
    ERROR_HISTORY,
    CancelOutcome,
    ClaimedJob,
    FinishOutcome,
    FireOutcome,
    JobMessage,
    JobRecord,
    JobState,
    RetryOutcome,
    ScheduleState,
    WorkerInfo,
)
from ..memory.listing import CURSOR_LETTERS
from ..records import broker_failure
from .schema import STATE_CODES

__all__ = [
    "CANCEL",
    "CODE",
    "FINISH",
    "FIRE",
    "RETRY",
    "STATES",
    "claimed_jobs",
    "decode_worker",
    "encode",
    "page_cursor",
    "place_text",
    "record_of",
    "schedule_of",
]

encode = msgspec.msgpack.Encoder().encode
decode_message = msgspec.msgpack.Decoder(JobMessage).decode
decode_worker = msgspec.msgpack.Decoder(WorkerInfo).decode

#: Job states by their stored code (``jobs.state``), and each state's code.
STATES = [JobState(name) for name in STATE_CODES]
CODE = {state: code for code, state in enumerate(STATES)}
#: The outcomes of the schema's functions, by the codes they answer with.
FINISH = list(FinishOutcome)
FIRE = [
    FireOutcome.FIRED,
    FireOutcome.STALE,
    FireOutcome.OVERLAP_SKIPPED,
    FireOutcome.HELD,
    FireOutcome.FULL,
]
RETRY = [
    RetryOutcome.RETRIED,
    RetryOutcome.NOT_RETRYABLE,
    RetryOutcome.NOT_FOUND,
    RetryOutcome.IN_FLOW,
]
CANCEL = [
    CancelOutcome.CANCELLED,
    CancelOutcome.REQUESTED,
    CancelOutcome.ALREADY_FINAL,
    CancelOutcome.NOT_FOUND,
]


def claimed_jobs(rows: list[Any]) -> list[ClaimedJob]:
    """The rows of a claim as ClaimedJobs, in claim order."""
    rows.sort(key=lambda row: row["n"])
    return [
        ClaimedJob(
            message=decode_message(row["message"]),
            token=row["token"],
            attempt=row["attempt"],
            enqueued_at=row["enqueued_at"],
            stalls=row["stalls"],
            run_at=row["run_at"],
        )
        for row in rows
    ]


def schedule_of(row: Any) -> ScheduleState:
    return ScheduleState(
        name=row["name"],
        digest=row["digest"],
        last_tick_us=row["last_tick_us"],
        last_job=row["last_job"],
        last_fired_us=row["last_fired_us"],
        fired=row["fired"],
        skipped=row["skipped"],
    )


def place_text(value: float, integral: bool) -> str:
    return repr(int(value)) if integral else repr(value)


def page_cursor(state: JobState, row: Any) -> str:
    """The cursor of the page that starts after ``row``'s place (``a``, ``b``, ``id``),
    in ``state``'s listing order (``page_jobs``, ``count_fingerprints``)."""
    integral = state is not JobState.SCHEDULED and state is not JobState.ACTIVE
    return f"{CURSOR_LETTERS[state]}{place_text(row['a'], integral)}:{row['b']}:{row['id']}"


def record_of(row: Any) -> JobRecord:
    """A job's row as its snapshot; a failure record the broker wrote itself (a cancel,
    a stall) is encoded here from its parts."""
    error: bytes | None = row["error"]
    errors: tuple[bytes, ...] = tuple(row["errors"] or ())
    kind: str | None = row["br_kind"]
    if kind is not None:
        record = encode(
            broker_failure(
                "stalled" if kind == "stalled" else "cancelled",
                row["br_message"],
                attempt=row["attempt"],
                failed_at=row["finished_at"],
                worker_id=None if kind == "cancelled" else row["worker_id"],
            )
        )
        error = record
        if kind == "stalled":
            errors = (*errors, record)[-ERROR_HISTORY:]
    return JobRecord(
        message=decode_message(row["message"]),
        state=STATES[row["state"]],
        attempt=row["attempt"],
        enqueued_at=row["enqueued_at"],
        run_at=row["run_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        result=row["result"],
        error=error,
        progress=row["progress"],
        stalls=row["stalls"],
        cancel_requested=row["cancel_requested"],
        worker_id=row["worker_id"],
        errors=errors,
    )
