"""``typedq verify``'s checks (typedq.verify) on every broker: an old release's app
enqueues jobs and records its schemas; a new release's app is verified against what
the broker holds.

Runs once per broker; the command line itself is tests/process/test_cli_verify.py.
"""

from __future__ import annotations

import msgspec
import pytest

from typedq import App, Producer, Run, Signal
from typedq.broker.base import JobMessage
from typedq.broker.capabilities import FingerprintCounts, supports
from typedq.broker.capability_defaults import CapabilityDefaults
from typedq.broker.memory import MemoryBroker
from typedq.broker.runs import AppendOutcome, RunAppend, RunSignal, SignalOutcome
from typedq.durable.log import StepCompleted, StepScheduled, encode_entries
from typedq.names import new_job_id
from typedq.serde import codec_for
from typedq.verify import count_exact, count_fingerprints, count_runs, verify

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class OrderV1(msgspec.Struct, frozen=True):
    id: int


class OrderV2(msgspec.Struct, frozen=True):
    id: int
    note: str = ""


class OrderV3(msgspec.Struct, frozen=True):
    id: int
    amount: int


class Done(msgspec.Struct, frozen=True):
    ok: bool


def old_app(name: str, url: str) -> App:
    app = App(name, broker=url)

    @app.task(queue="orders")
    async def place(order: OrderV1) -> Done:
        return Done(True)

    return app


def new_app(name: str, url: str, model: type[msgspec.Struct]) -> App:
    app = App(name, broker=url)

    async def place(order: OrderV2) -> Done:  # the model is swapped below
        return Done(True)

    place.__annotations__["order"] = model
    app.task(queue="orders")(place)
    return app


async def test_a_compatible_release_passes(app_name: str, broker_url: str) -> None:
    old = old_app(app_name, broker_url)
    async with old:
        await old.tasks["place"].enqueue_many([OrderV1(i) for i in range(3)])
        report = await verify(new_app(app_name, broker_url, OrderV2), old.broker)
    by_fp = {row.fingerprint: row for row in report.rows}
    v1, v2 = codec_for(OrderV1).fingerprint, codec_for(OrderV2).fingerprint
    assert by_fp[v1].jobs == 3
    assert by_fp[v1].verdict == "compatible"
    assert by_fp[v1].source == "registry"
    assert by_fp[v1].first_seen > 0
    assert (by_fp[v2].jobs, by_fp[v2].source, by_fp[v2].verdict) == (0, "current", "compatible")
    assert (report.scanned, report.capped, report.exit_code) == (3, False, 0)


async def test_an_incompatible_release_names_the_field(app_name: str, broker_url: str) -> None:
    old = old_app(app_name, broker_url)
    async with old:
        await old.tasks["place"].enqueue(OrderV1(1))
        report = await verify(new_app(app_name, broker_url, OrderV3), old.broker)
    (row,) = [r for r in report.rows if r.fingerprint == codec_for(OrderV1).fingerprint]
    assert (row.jobs, row.verdict) == (1, "incompatible")
    assert row.reason == "field `amount` became required"
    assert report.exit_code == 1


async def test_a_registry_record_without_jobs_still_counts(app_name: str, broker_url: str) -> None:
    """An old producer still running may enqueue again: its schema is checked though
    no job carries it now, until the operator forgets it."""
    old = old_app(app_name, broker_url)
    async with old:
        report = await verify(new_app(app_name, broker_url, OrderV3), old.broker)
        assert report.exit_code == 1
        assert await old.broker.forget_schemas([("place", codec_for(OrderV1).fingerprint)]) == [
            True
        ]
        report = await verify(new_app(app_name, broker_url, OrderV3), old.broker)
    assert report.exit_code == 0


async def test_jobs_of_an_unrecorded_fingerprint_are_unknown(
    app_name: str, broker_url: str
) -> None:
    old = old_app(app_name, broker_url)
    async with old:
        await old.tasks["place"].enqueue(OrderV1(1))
        await old.broker.forget_schemas([("place", codec_for(OrderV1).fingerprint)])
        report = await verify(new_app(app_name, broker_url, OrderV2), old.broker)
    (row,) = [r for r in report.rows if r.fingerprint == codec_for(OrderV1).fingerprint]
    assert (row.jobs, row.verdict, row.source) == (1, "unknown", "jobs")
    assert report.exit_code == 2
    assert "no recorded schema" in report.note


async def test_jobs_of_a_removed_task_are_incompatible(app_name: str, broker_url: str) -> None:
    old = old_app(app_name, broker_url)
    other = App(app_name, broker=broker_url)

    @other.task(queue="orders")
    async def refund(order: OrderV1) -> Done:
        return Done(True)

    async with old:
        await old.tasks["place"].enqueue(OrderV1(1))
        report = await verify(other, old.broker)
    (row,) = [r for r in report.rows if r.task == "place"]
    assert (row.verdict, row.reason) == (
        "incompatible",
        "task `place` is not in the app; jobs carry it",
    )


async def test_the_sample_scan_is_bounded_and_says_so(app_name: str, broker_url: str) -> None:
    """The scan of a broker that cannot count jobs itself (count_fingerprints: ids and
    records read) stops at its sample; the broker's own count has no such bound."""
    old = old_app(app_name, broker_url)
    async with old:
        place = old.tasks["place"]
        await place.enqueue_many([OrderV1(i) for i in range(30)])
        await place.enqueue_many([OrderV1(i) for i in range(5)], delay=600)
        key = ("place", codec_for(OrderV1).fingerprint)
        counts, read, capped = await count_fingerprints(old.broker, ["orders"], sample=10)
        assert (counts[key], read, capped) == (10, 10, True)
        counts, read, capped = await count_fingerprints(old.broker, ["orders"], sample=1000)
        assert (counts[key], read, capped) == (35, 35, False)
        counts, read = await count_exact(old.broker, ["orders"])
        assert (dict(counts), read) == ({key: 35}, 35)
        report = await verify(new_app(app_name, broker_url, OrderV2), old.broker, sample=10)
    assert (report.exact, report.capped, report.scanned) == (True, False, 35)
    (row,) = [r for r in report.rows if (r.task, r.fingerprint) == key]
    assert (row.jobs, row.at_least) == (35, False)


async def test_a_rare_old_fingerprint_among_many_jobs_is_counted_exactly(
    app_name: str, broker_url: str
) -> None:
    """Issue 28: the count is the broker's, over every job, not a sample: two jobs of an
    old schema behind 1,500 of the current one (one waiting last in line, one retrying)
    are both counted, whatever ``sample`` says. The sample scan found one of them."""
    old = old_app(app_name, broker_url)
    v1, v2 = codec_for(OrderV1).fingerprint, codec_for(OrderV2).fingerprint

    def current(n: int, delay: float = 0.0) -> list[JobMessage]:
        # The new release's jobs, as its producers enqueue them (same broker).
        payload = codec_for(OrderV2).encode(OrderV2(1))
        return [
            JobMessage(
                id=new_job_id(),
                task="place",
                queue="orders",
                payload=payload,
                fingerprint=v2,
                delay=delay,
            )
            for _ in range(n)
        ]

    async with old:
        await old.broker.enqueue(current(1500))
        await old.tasks["place"].enqueue(OrderV1(-1))
        await old.tasks["place"].enqueue(OrderV1(-2), delay=600)
        await old.broker.enqueue(current(200, delay=600))
        report = await verify(new_app(app_name, broker_url, OrderV2), old.broker, sample=100)
    rows = {r.fingerprint: r for r in report.rows}
    assert (rows[v1].jobs, rows[v1].at_least) == (2, False)
    assert (rows[v2].jobs, rows[v2].at_least) == (1700, False)
    assert (report.exact, report.capped, report.scanned) == (True, False, 1702)


class _SamplingBroker(MemoryBroker):
    """An embedded broker without ``FingerprintCounts`` (as a third-party backend may
    be): verify falls back to the sample scan."""

    count_fingerprints = CapabilityDefaults.count_fingerprints


async def test_without_broker_counts_verify_reads_a_sample(app_name: str) -> None:
    broker = _SamplingBroker()
    assert not supports(broker, FingerprintCounts)
    old = App(app_name, broker=broker)

    @old.task(queue="orders")
    async def place(order: OrderV1) -> Done:
        return Done(True)

    async with old:
        await place.enqueue_many([OrderV1(i) for i in range(30)])
        report = await verify(new_app(app_name, "memory://", OrderV2), broker, sample=10)
    (row,) = [r for r in report.rows if r.fingerprint == codec_for(OrderV1).fingerprint]
    assert (row.jobs, row.at_least) == (10, True)
    current = [r for r in report.rows if r.source == "current"]
    assert [r.at_least for r in current] == [True]
    assert (report.exact, report.capped, report.scanned) == (False, True, 10)


async def test_a_stale_stub_is_checked_against_the_app(app_name: str, broker_url: str) -> None:
    stubs = Producer(app_name, broker=broker_url)
    stubs.task("place", OrderV1, Done, queue="orders")
    stubs.task("gone", OrderV1, Done, queue="orders")
    app = new_app(app_name, broker_url, OrderV3)
    async with app:
        report = await verify(app, app.broker, against=stubs)
    rows = {r.task: r for r in report.rows if r.source == "stub"}
    assert rows["place"].reason == "field `amount` became required"
    assert rows["gone"].verdict == "incompatible"
    assert rows["gone"].reason == "the stub's task `gone` is not in the app"


# -- durable runs: what they hold is checked as jobs are --------------------------------


class Approval(msgspec.Struct, frozen=True):
    ok: bool


class ApprovalV2(msgspec.Struct, frozen=True):
    ok: bool
    by: str  # required: an old sender's payloads lack it


class DoneV2(msgspec.Struct, frozen=True):
    ok: bool
    count: int  # required: an old release's results lack it


APPROVAL = Signal("verify-approval", ApprovalV2)  # the new release's signal


def durable_app(name: str, url: str, model: type[msgspec.Struct]) -> App:
    """An app whose durable function ``onboard`` takes ``model``."""
    app = App(name, broker=url)

    async def onboard(run: Run, order: OrderV1) -> Done:  # the model is swapped below
        await run.wait_for(APPROVAL)
        return Done(True)

    onboard.__annotations__["order"] = model
    app.durable(queue="orders")(onboard)
    return app


async def test_a_run_input_of_an_old_fingerprint_is_checked(app_name: str, broker_url: str) -> None:
    """A run keeps its input's fingerprint; the registry records the durable function's
    schemas as ``run:<name>``; verify counts running runs per fingerprint and checks
    them by the same rules as jobs: compatible, then incompatible."""
    old = durable_app(app_name, broker_url, OrderV1)
    async with old:
        await old.durables["onboard"].start(OrderV1(1), run_id="r1")
        await old.durables["onboard"].start(OrderV1(2), run_id="r2")
        fine = await verify(durable_app(app_name, broker_url, OrderV2), old.broker)
        broken = await verify(durable_app(app_name, broker_url, OrderV3), old.broker)
    key = ("run:onboard", codec_for(OrderV1).fingerprint)
    rows = {(r.task, r.fingerprint): r for r in fine.rows}
    assert (rows[key].jobs, rows[key].verdict, rows[key].source) == (2, "compatible", "registry")
    assert fine.runs == 2
    assert fine.exit_code == 0
    rows = {(r.task, r.fingerprint): r for r in broken.rows}
    assert (rows[key].jobs, rows[key].verdict) == (2, "incompatible")
    assert rows[key].reason == "field `amount` became required"
    assert broken.exit_code == 1


async def test_signals_a_run_holds_are_decoded_with_the_current_model(
    app_name: str, broker_url: str
) -> None:
    """A signal sent by an old release waits in the run's inbox with no fingerprint:
    verify decodes it with the Signal the release defines under that name."""
    app = durable_app(app_name, broker_url, OrderV1)
    async with app:
        await app.durables["onboard"].start(OrderV1(1), run_id="r1")
        report = await verify(app, app.broker)
        assert not [r for r in report.rows if r.task.startswith("signal:")]
        # An old sender's payload (its model had no `by`), and a current one.
        old = codec_for(Approval).encode(Approval(True))
        new = APPROVAL.encode(ApprovalV2(True, by="ops"))
        assert await app.broker.signal_runs(
            [RunSignal(run_id="r1", signal=APPROVAL.name, payload=new)]
        ) == [SignalOutcome.DELIVERED]
        report = await verify(app, app.broker)
        (row,) = [r for r in report.rows if r.task == "signal:verify-approval"]
        assert (row.fingerprint, row.jobs, row.verdict, row.source) == (
            "-",
            1,
            "compatible",
            "runs",
        )
        await app.broker.signal_runs([RunSignal(run_id="r1", signal=APPROVAL.name, payload=old)])
        report = await verify(app, app.broker)
    (row,) = [r for r in report.rows if r.task == "signal:verify-approval"]
    assert (row.jobs, row.verdict) == (1, "incompatible")
    assert row.reason.startswith("1 of 2 payloads do not decode: ")
    assert "`by`" in row.reason
    assert report.exit_code == 1


async def test_step_results_a_run_recorded_are_decoded_with_the_task_output(
    app_name: str, broker_url: str
) -> None:
    """A replay decodes its steps' recorded results with the task's current output
    model: a result an old release recorded is checked too."""
    app = durable_app(app_name, broker_url, OrderV1)

    @app.task(queue="orders")
    async def score(order: OrderV1) -> DoneV2:
        return DoneV2(True, 1)

    async with app:
        await app.durables["onboard"].start(OrderV1(1), run_id="r1")
        entries = encode_entries(
            [
                StepScheduled(position=0, task="score", digest="0" * 16),
                StepCompleted(position=0, task="score", output=codec_for(Done).encode(Done(True))),
            ]
        )
        assert await app.broker.append_runs(
            [RunAppend(run_id="r1", expected=0, entries=(entries,))]
        ) == [AppendOutcome.APPENDED]
        report = await verify(app, app.broker)
    (row,) = [r for r in report.rows if r.task == "result:score"]
    assert (row.jobs, row.verdict) == (1, "incompatible")
    assert "`count`" in row.reason


async def test_runs_are_paged_and_bounded(app_name: str, broker_url: str) -> None:
    app = durable_app(app_name, broker_url, OrderV1)
    async with app:
        for i in range(7):
            await app.durables["onboard"].start(OrderV1(i), run_id=f"r{i}")
        seen: list[str] = []
        cursor: str | None = None
        while True:
            ids, cursor = await app.broker.page_runs(cursor=cursor, limit=3)
            seen += ids
            if cursor is None:
                break
        assert sorted(set(seen)) == [f"r{i}" for i in range(7)]
        counts = await count_runs(app.broker, app, sample=4)
        assert (counts.read, counts.capped) == (4, True)
        counts = await count_runs(app.broker, app, sample=100)
        assert (counts.read, counts.capped) == (7, False)
        assert await app.broker.cancel_runs(["r0", "r1", "r2"]) == [True] * 3
        # Ended runs never replay: skipped, yet looked at within the bound.
        ended = await count_runs(app.broker, app, sample=100)
        bounded = await count_runs(app.broker, app, sample=3)
    assert counts.fingerprints[("run:onboard", codec_for(OrderV1).fingerprint)] == 7
    assert (ended.read, ended.capped) == (4, False)
    assert ended.fingerprints[("run:onboard", codec_for(OrderV1).fingerprint)] == 4
    assert bounded.read <= 3
    assert bounded.capped
