"""A pickle pushed into the broker as a payload is rejected as data, never executed (G4)."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import anyio
import msgspec
import pytest

from typedq import App, FailureReason, JobFailed
from typedq.broker.base import JobMessage
from typedq.names import new_job_id

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class Note(msgspec.Struct):
    text: str


class _Exploit:
    """Unpickling this would create the marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


async def test_a_pickle_payload_is_rejected_as_data_and_never_executed(
    broker_url: str, app_name: str
) -> None:
    marker = Path(tempfile.mkdtemp()) / "pwned"
    app = App(app_name, broker=broker_url)

    @app.task
    async def remember(note: Note) -> None:
        raise AssertionError("a pickle must never reach the handler")

    evil = pickle.dumps(_Exploit(str(marker)))
    with anyio.fail_after(20):
        async with app, app.worker(concurrency=1):
            (outcome,) = await app.broker.enqueue(
                [JobMessage(id=new_job_id(), task="remember", queue="default", payload=evil)]
            )
            with pytest.raises(JobFailed) as failure:
                await remember.job(outcome.id).result(timeout=10)
    assert failure.value.reason is FailureReason.INVALID_PAYLOAD
    assert not marker.exists()
    marker.parent.rmdir()
