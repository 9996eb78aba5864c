"""Unique windows and debounce (docs/flow-control.md), on every broker.

The embedded broker runs on a fake clock the test moves (exact times); Redis, Redis
Cluster and PostgreSQL in real time with short windows (their clock is the server's),
asserting times relative to the job's own enqueue time (both read from the broker's clock).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import anyio
import msgspec
import pytest

from tests.support import TEST_DEADLINE
from typedq import App, ConfigError, Debounce, InvalidOption, JobState, QueueFull, Retention
from typedq.broker.base import Broker, BrokerSettings, Completion, Failure
from typedq.broker.memory import MemoryBroker
from typedq.testing import FakeClock

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]

T0 = 1_800_000_000.0


class Doc(msgspec.Struct, frozen=True):
    doc: str
    text: str = ""


class Timeline:
    """An app on the test's broker, and time that passes: the fake clock on the embedded
    broker, real time on Redis (``unit`` seconds per step of the tests' windows)."""

    def __init__(
        self, app_name: str, broker_url: str, retention: Retention | None, cap: int
    ) -> None:
        self.fake = broker_url.startswith("memory")
        self.clock = FakeClock(T0)
        settings = BrokerSettings(
            namespace=app_name, retention=retention or Retention(), max_queue_length=cap
        )
        self.memory = MemoryBroker(settings, clock=self.clock)
        self.app = App(
            app_name,
            broker=self.memory if self.fake else broker_url,
            retention=retention,
            max_queue_length=cap,
        )
        #: One step of the tests' windows: 10 s of fake time, 1 s of real time (the
        #: real-time checks leave a loaded machine most of a step of slack).
        self.unit = 10.0 if self.fake else 1.0

    @property
    def broker(self) -> Broker:
        return self.app.broker

    async def passes(self, steps: float) -> None:
        """Let ``steps`` units of time pass."""
        if self.fake:
            self.clock.advance(steps * self.unit)
            self.memory.wake()
        else:
            await anyio.sleep(steps * self.unit)


@contextlib.asynccontextmanager
async def timeline(
    app_name: str, broker_url: str, retention: Retention | None = None, cap: int = 0
) -> AsyncIterator[Timeline]:
    line = Timeline(app_name, broker_url, retention, cap)
    with anyio.fail_after(TEST_DEADLINE):
        async with line.app:
            yield line


async def run_one(broker: Broker, queue: str, *, fail: bool = False, retry: bool = False) -> str:
    """Claim the one job of ``queue`` and complete it (or fail it: for good, or retried)."""
    (claimed,) = await broker.claim([queue], 1, worker_id="w", lease=30)
    job_id = claimed.message.id
    if fail:
        failure = Failure(
            id=job_id, token=claimed.token, error=b"", retry_delay=0 if retry else None
        )
        await broker.fail([failure])
    else:
        await broker.complete([Completion(job_id, claimed.token, b"")])
    return job_id


# -- unique windows ------------------------------------------------------------------


async def test_unique_dedups_while_pending_and_for_the_window_after_completing(
    app_name: str, broker_url: str
) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="uq", key=lambda d: d.doc, unique_for=2 * line.unit)
        async def index(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        again = await index.enqueue(Doc("a", "other"))
        other = await index.enqueue(Doc("b"))
        assert first.created
        assert not again.created
        assert other.created
        assert again.id == first.id != other.id
        assert first.id != "index:a"  # a fresh id per job, not the key-derived one
        # Running (claimed): still held.
        (claimed,) = await line.broker.claim(["uq"], 1, worker_id="w", lease=30)
        assert claimed.message.id == first.id
        held = await index.enqueue(Doc("a"))
        assert (held.id, held.created) == (first.id, False)
        await line.broker.complete([Completion(first.id, claimed.token, b"")])
        # Completed: held for the window.
        after = await index.enqueue(Doc("a"))
        assert (after.id, after.created) == (first.id, False)
        assert (await after.status()) is JobState.COMPLETED
        await line.passes(3)
        fresh = await index.enqueue(Doc("a"))
        assert fresh.created
        assert fresh.id != first.id
        counts = await line.broker.counts("uq")
        assert counts[JobState.WAITING] == 2  # b and the fresh a


async def test_a_failed_or_cancelled_job_frees_its_key_at_once(
    app_name: str, broker_url: str
) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="uf", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def index(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        assert await run_one(line.broker, "uf", fail=True) == first.id
        second = await index.enqueue(Doc("a"))
        assert second.created
        assert second.id != first.id
        await second.cancel()
        third = await index.enqueue(Doc("a"))
        assert third.created
        assert third.id not in (first.id, second.id)


async def test_a_failed_job_retried_by_an_operator_does_not_take_its_key_back(
    app_name: str, broker_url: str
) -> None:
    """Failing for good freed the key: the operator's retry runs the job again, and the
    key goes to the next enqueue (as it would have without the retry)."""
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="uo", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def index(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        await run_one(line.broker, "uo", fail=True)
        assert [o.value for o in await line.broker.retry([first.id], queue="uo")] == ["retried"]
        assert (await first.status()) is JobState.WAITING
        second = await index.enqueue(Doc("a"))
        assert second.created
        assert second.id != first.id
        # The new job holds the key now.
        third = await index.enqueue(Doc("a"))
        assert (third.id, third.created) == (second.id, False)


async def test_a_job_between_retries_holds_its_key(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="ur", key=lambda d: d.doc, unique_for=timedelta(hours=1), retries=3)
        async def index(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        await run_one(line.broker, "ur", fail=True, retry=True)
        again = await index.enqueue(Doc("a"))
        assert (again.id, again.created) == (first.id, False)
        assert (await again.status()) is JobState.WAITING


async def test_the_window_outlives_retention(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url, Retention(completed_max=1)) as line:
        app = line.app

        @app.task(queue="ut", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def index(d: Doc) -> None:
            pass

        a = await index.enqueue(Doc("a"))
        await run_one(line.broker, "ut")
        await index.enqueue(Doc("b"))
        await run_one(line.broker, "ut")  # retention deletes a
        assert await line.broker.get([a.id]) == [None]
        again = await index.enqueue(Doc("a"))
        assert (again.id, again.created) == (a.id, False)


async def test_a_removed_job_frees_its_key(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="um", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def index(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        assert await line.broker.remove([first.id], queue="um") == [True]
        second = await index.enqueue(Doc("a"))
        assert second.created
        assert second.id != first.id


async def test_a_full_queue_refuses_a_new_key_and_marks_nothing(
    app_name: str, broker_url: str
) -> None:
    async with timeline(app_name, broker_url, cap=1) as line:
        app = line.app

        @app.task(queue="uc", key=lambda d: d.doc, unique_for=timedelta(hours=1))
        async def index(d: Doc) -> None:
            pass

        @app.task(queue="uc", debounce=Debounce(key=lambda d: d.doc, wait=60.0))
        async def render(d: Doc) -> None:
            pass

        first = await index.enqueue(Doc("a"))
        with pytest.raises(QueueFull):
            await index.enqueue(Doc("b"))
        with pytest.raises(QueueFull):
            await render.enqueue(Doc("c"))
        held = await index.enqueue(Doc("a"))  # a held key needs no room
        assert (held.id, held.created) == (first.id, False)
        await run_one(line.broker, "uc")
        second = await index.enqueue(Doc("b"))  # b was never marked
        assert second.created
        counts = await line.broker.counts("uc")
        assert counts[JobState.WAITING] == 1
        assert counts[JobState.COMPLETED] == 1


# -- debounce ----------------------------------------------------------------------------


async def test_debounce_collapses_into_one_job_with_the_last_payload(
    app_name: str, broker_url: str
) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app
        wait = line.unit

        @app.task(queue="db", debounce=Debounce(key=lambda d: d.doc, wait=wait, max_wait=10 * wait))
        async def render(d: Doc) -> None:
            pass

        jobs = [await render.enqueue(Doc("a", f"v{i}")) for i in range(3)]
        other = await render.enqueue(Doc("b", "x"))
        assert [j.created for j in jobs] == [True, False, False]
        assert other.created
        assert {j.id for j in jobs} == {jobs[0].id} != {other.id}
        (record,) = await line.broker.get([jobs[0].id])
        assert record is not None
        assert record.state is JobState.SCHEDULED
        assert render.input.decode(record.message.payload) == Doc("a", "v2")
        # Due `wait` after the last enqueue: at least wait after the first (on Redis, a
        # loaded machine may stretch the gaps between the three enqueues).
        assert record.run_at - record.enqueued_at >= wait
        if line.fake:
            assert record.run_at == record.enqueued_at + wait
        else:
            assert record.run_at - record.enqueued_at < wait + 1.0
        await line.passes(1.5)
        claimed = await line.broker.claim(["db"], 10, worker_id="w", lease=30)
        assert sorted(c.message.id for c in claimed) == sorted([jobs[0].id, other.id])
        payloads = {c.message.id: render.input.decode(c.message.payload) for c in claimed}
        assert payloads[jobs[0].id] == Doc("a", "v2")
        # Claimed: never replaced; the next enqueue is a new job.
        later = await render.enqueue(Doc("a", "v3"))
        assert later.created
        assert later.id != jobs[0].id
        assert (await line.broker.counts("db"))[JobState.SCHEDULED] == 1


async def test_debounce_runs_at_max_wait_after_the_first_enqueue(
    app_name: str, broker_url: str
) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app
        wait = line.unit

        @app.task(
            queue="dm", debounce=Debounce(key=lambda d: d.doc, wait=wait, max_wait=1.5 * wait)
        )
        async def render(d: Doc) -> None:
            pass

        first = await render.enqueue(Doc("a", "v0"))
        await line.passes(0.7)
        second = await render.enqueue(Doc("a", "v1"))
        assert (second.id, second.created) == (first.id, False)
        (record,) = await line.broker.get([first.id])
        assert record is not None
        # min(now + wait, first + max_wait): max_wait wins (0.7 + 1 > 1.5 units).
        assert abs(record.run_at - (record.enqueued_at + 1.5 * wait)) < 1e-5
        assert render.input.decode(record.message.payload) == Doc("a", "v1")


async def test_a_due_debounced_job_is_not_replaced(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app
        wait = line.unit

        @app.task(queue="dd", debounce=Debounce(key=lambda d: d.doc, wait=wait))
        async def render(d: Doc) -> None:
            pass

        first = await render.enqueue(Doc("a", "v0"))
        await line.passes(1.5)  # due, not claimed yet
        second = await render.enqueue(Doc("a", "v1"))
        assert second.created
        assert second.id != first.id
        (record,) = await line.broker.get([first.id])
        assert record is not None
        assert render.input.decode(record.message.payload) == Doc("a", "v0")


# -- bad input ---------------------------------------------------------------------------


async def test_a_bad_key_stores_nothing(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        def boom(d: Doc) -> str:
            raise KeyError(d.doc)

        @app.task(queue="bk", key=boom, unique_for=60)
        async def index(d: Doc) -> None:
            pass

        def nothing(d: Doc) -> Any:
            return None

        @app.task(queue="bk", debounce=Debounce(key=nothing, wait=1.0))
        async def render(d: Doc) -> None:
            pass

        with pytest.raises(InvalidOption, match="key function raised KeyError"):
            await index.enqueue(Doc("a"))
        with pytest.raises(InvalidOption, match="returned NoneType, not a str or an int"):
            await render.enqueue(Doc("a"))
        with pytest.raises(InvalidOption, match="drop delay="):
            await render.enqueue(Doc("a"), delay=5)
        counts = await line.broker.counts("bk")
        assert sum(counts.values()) == 0


async def test_debounce_refuses_a_fixed_job_id(app_name: str, broker_url: str) -> None:
    async with timeline(app_name, broker_url) as line:
        app = line.app

        @app.task(queue="bj", debounce=Debounce(key=lambda d: d.doc, wait=1.0))
        async def render(d: Doc) -> None:
            pass

        with pytest.raises(ConfigError, match="drop job_id="):
            await render.enqueue(Doc("a"), job_id="mine")
        assert sum((await line.broker.counts("bj")).values()) == 0
