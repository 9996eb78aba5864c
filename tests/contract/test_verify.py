"""``typedq verify``'s checks (typedq.verify) on every broker: an old release's app
enqueues jobs and records its schemas; a new release's app is verified against what
the broker holds.

Runs once per broker; the command line itself is tests/process/test_cli_verify.py.
"""

from __future__ import annotations

import msgspec
import pytest

from typedq import App, Producer
from typedq.serde import codec_for
from typedq.verify import count_fingerprints, verify

pytestmark = pytest.mark.anyio


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


async def test_the_scan_is_bounded_and_says_so(app_name: str, broker_url: str) -> None:
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
        report = await verify(new_app(app_name, broker_url, OrderV2), old.broker, sample=10)
    assert report.capped
    assert report.scanned == 10


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
