"""Bulk actions by filter (typedq.bulk, ``typedq jobs``) on every broker: which jobs a
filter matches (state, task, error type, since, payload fields), the actions on the
matches alone, a page at a time, dry runs, and the one-line errors of a bad filter."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence

import anyio
import msgspec
import pydantic
import pytest

from tests.support import TEST_DEADLINE
from typedq import App, JobFailed, JobState, Reject
from typedq.bulk import BulkQuery, JobFilter
from typedq.errors import ConfigError

pytestmark = [pytest.mark.anyio, pytest.mark.core_store]


class Address(msgspec.Struct, frozen=True):
    city: str
    zip: int


class Order(msgspec.Struct, frozen=True):
    n: int
    tenant: str
    urgent: bool = False
    address: Address | None = None


class Note(pydantic.BaseModel):
    n: int
    label: str


class CardDeclined(Exception):
    pass


class OutOfStock(Exception):
    pass


def make_app(name: str, url: str) -> App:
    app = App(name, broker=url)

    @app.task(queue="orders", retries=0)
    async def charge(order: Order) -> None:
        if order.n % 3 == 0:
            raise CardDeclined(f"card of order {order.n}")
        if order.n % 3 == 1:
            raise OutOfStock(f"order {order.n}")

    @app.task(queue="orders", retries=0)
    async def annotate(note: Note) -> None:
        raise CardDeclined(note.label)

    @app.task(queue="orders")
    async def hold(order: Order) -> None:
        raise Reject("never run in these tests")

    return app


@pytest.fixture
async def app(broker_url: str, app_name: str) -> AsyncIterator[App]:
    the_app = make_app(app_name, broker_url)
    with anyio.fail_after(TEST_DEADLINE):
        async with the_app:
            yield the_app


async def run_to_the_end(app: App, orders: list[Order], notes: Sequence[Note] = ()) -> None:
    """Enqueue the orders (and notes) and run them all: n % 3 == 2 completes, the
    others fail (CardDeclined for 0, OutOfStock for 1)."""
    jobs = list(await app.tasks["charge"].enqueue_many(orders))
    jobs += list(await app.tasks["annotate"].enqueue_many(list(notes)))
    async with app.worker(concurrency=8):
        for job in jobs:
            with contextlib.suppress(JobFailed):
                await job.result(timeout=10)


def query(app: App, **kw: object) -> BulkQuery:
    return BulkQuery(app.client, app.queues, JobFilter(**kw), tasks=app.tasks)  # type: ignore[arg-type]


def orders(n: int, tenant: str = "acme", **kw: object) -> list[Order]:
    return [Order(i, tenant, **kw) for i in range(n)]  # type: ignore[arg-type]


async def test_filters_by_task_error_type_and_payload_fields(app: App) -> None:
    await run_to_the_end(
        app,
        orders(9, "acme") + [Order(i, "zeta", urgent=True) for i in range(9, 18)],
        [Note(n=1, label="x")],
    )
    # 18 orders: 12 failed (6 CardDeclined, 6 OutOfStock); 1 note failed.
    assert await query(app).count() == 13
    assert await query(app, task="charge").count() == 12
    assert await query(app, task="annotate").count() == 1
    assert await query(app, error_type="CardDeclined").count() == 7
    qualified = f"{__name__}.CardDeclined"
    assert await query(app, error_type=qualified).count() == 7
    assert await query(app, error_type="contract.test_bulk.CardDeclined").count() == 7
    assert await query(app, error_type="Declined").count() == 0  # whole name parts only
    assert await query(app, task="charge", where=("tenant=zeta",)).count() == 6
    assert await query(app, task="charge", where=("urgent=true",)).count() == 6
    both = ("tenant=zeta", "n=9")
    assert await query(app, task="charge", where=both).count() == 1
    assert await query(app, task="charge", where=("tenant=zeta", "n=1")).count() == 0
    assert await query(app, task="annotate", where=("n=1", "label=x")).count() == 1
    assert await query(app, state=JobState.COMPLETED, task="charge").count() == 6

    preview = await query(app, task="charge", error_type="OutOfStock").preview(limit=2)
    assert preview.total == 6
    assert len(preview.jobs) == 2
    assert {j.error.error_type for j in preview.jobs if j.error} == {f"{__name__}.OutOfStock"}


async def test_nested_fields_and_optional_values(app: App) -> None:
    await run_to_the_end(
        app,
        [Order(0, "a", address=Address("Paris", 75001)), Order(3, "a"), Order(6, "b")],
    )
    assert await query(app, task="charge", where=("address.city=Paris",)).count() == 1
    assert await query(app, task="charge", where=("address.zip=75001",)).count() == 1
    assert await query(app, task="charge", where=("address=null",)).count() == 2
    # A missing nested model matches no value of its fields.
    assert await query(app, task="charge", where=("address.city=Lyon",)).count() == 0


async def test_retry_acts_on_the_matches_alone_page_by_page(app: App) -> None:
    await run_to_the_end(app, orders(30))
    broker = app.broker
    assert (await broker.counts("orders"))[JobState.FAILED] == 20
    q = query(app, task="charge", error_type="CardDeclined")
    seen: list[int] = []
    report = await q.apply("retry", size=3, progress=lambda r, bound: seen.append(r.examined))
    assert report.matched == report.done == 10
    assert report.outcomes == {"retried": 10}
    assert report.examined == 20  # every failed job looked at once
    assert seen == sorted(seen)
    assert len(seen) >= 7  # 20 failed jobs in pages of 3
    counts = await broker.counts("orders")
    assert counts[JobState.FAILED] == 10
    assert counts[JobState.WAITING] == 10
    # Idempotent: a second run finds nothing left to do.
    again = await q.apply("retry")
    assert (again.matched, again.done) == (0, 0)
    left = await query(app).preview(limit=100)
    assert {j.error.error_type for j in left.jobs if j.error} == {f"{__name__}.OutOfStock"}


async def test_dry_run_counts_and_changes_nothing(app: App) -> None:
    await run_to_the_end(app, orders(12))
    before = await app.broker.counts("orders")
    report = await query(app, error_type="OutOfStock").apply("remove", dry_run=True)
    assert report.dry_run
    assert (report.matched, report.done, report.outcomes) == (4, 0, {})
    assert await app.broker.counts("orders") == before


async def test_remove_and_cancel_by_payload_field(app: App) -> None:
    await run_to_the_end(app, orders(6))
    removed = await query(app, task="charge", where=("n=3",)).apply("remove")
    assert (removed.matched, removed.done, removed.outcomes) == (1, 1, {"removed": 1})
    assert (await app.broker.counts("orders"))[JobState.FAILED] == 3

    hold = app.tasks["hold"]
    await hold.enqueue_many([Order(i, "acme" if i % 2 else "zeta") for i in range(10)])
    await hold.enqueue_many([Order(i, "zeta") for i in range(10, 13)], delay=3600)
    cancel = query(app, state=JobState.WAITING, task="hold", where=("tenant=zeta",))
    report = await cancel.apply("cancel", size=2)
    assert (report.matched, report.done, report.outcomes) == (5, 5, {"cancelled": 5})
    counts = await app.broker.counts("orders")
    assert counts[JobState.WAITING] == 5
    assert counts[JobState.SCHEDULED] == 3
    assert counts[JobState.CANCELLED] == 5
    scheduled = query(app, state=JobState.SCHEDULED, task="hold")
    assert (await scheduled.apply("cancel")).done == 3


async def test_since_counts_from_the_finish_time_and_stops_at_older_jobs(app: App) -> None:
    await run_to_the_end(app, orders(6))  # 4 failed
    (first,) = await app.broker.get(
        [(await app.broker.list_jobs("orders", JobState.FAILED, limit=1))[0]]
    )
    assert first is not None
    middle = first.finished_at + 1e-6
    await run_to_the_end(app, [Order(i, "late") for i in range(100, 106)])  # 4 more
    q = query(app, since=3600.0)
    assert await q.count() == 8

    async def fixed() -> float:
        return middle

    later = query(app, since=1.0)
    later.cutoff = fixed  # type: ignore[method-assign]
    preview = await later.preview(limit=10)
    assert preview.total == 4
    late = query(app, task="charge", where=("tenant=late",))
    assert {j.id for j in preview.jobs} == {j.id for j in (await late.preview()).jobs}
    # The final states are ordered newest first: the walk stops at the first older job
    # (pages of 2: the fifth job examined is older, and the walk ends with its page).
    examined = [seen async for _, seen, _ in later.pages(size=2)]
    assert sum(examined) == 6


async def test_a_bad_filter_is_one_line(app: App) -> None:
    with pytest.raises(ConfigError, match="--where needs exactly one --task"):
        query(app, where=("n=1",))
    with pytest.raises(ConfigError, match=r"Order \(task 'charge'\) has no field 'nope'; its "
                       r"fields: n, tenant, urgent, address"):  # fmt: skip
        query(app, task="charge", where=("nope=1",))
    with pytest.raises(ConfigError, match="has no field 'street'; its fields: city, zip"):
        query(app, task="charge", where=("address.street=x",))
    with pytest.raises(ConfigError, match=r"n is int; 'abc' is not one"):
        query(app, task="charge", where=("n=abc",))
    with pytest.raises(ConfigError, match=r"n is int; 'x' is not one"):
        query(app, task="annotate", where=("n=x",))
    with pytest.raises(ConfigError, match="is not field=value"):
        query(app, task="charge", where=("tenant",))
    with pytest.raises(ConfigError, match="address is a model; name one of its fields"):
        query(app, task="charge", where=("address=1",))  # only null names a model's value
    with pytest.raises(ConfigError, match="'nope' is not a task of app"):
        query(app, task="nope")
    with pytest.raises(ConfigError, match=r"task 'charge' stores its jobs in orders, not in "
                       r"the queues asked \(other\)"):  # fmt: skip
        BulkQuery(app.client, ["other"], JobFilter(task="charge"), tasks=app.tasks)
    with pytest.raises(ConfigError, match="cannot retry waiting jobs; retry applies to"):
        await query(app, state=JobState.WAITING).apply("retry")


class Interrupted(Exception):
    pass


async def test_an_interrupted_run_resumed_acts_on_what_still_matches(app: App) -> None:
    await run_to_the_end(app, orders(60))  # 40 failed: 20 CardDeclined, 20 OutOfStock
    q = query(app, error_type="CardDeclined")

    def stop_after_two_pages(report: object, bound: int) -> None:
        if getattr(report, "examined", 0) >= 10:
            raise Interrupted

    with pytest.raises(Interrupted):
        await q.apply("retry", size=5, progress=stop_after_two_pages)
    counts = await app.broker.counts("orders")
    first = counts[JobState.WAITING]
    assert 0 < first < 20  # some retried, not all
    resumed = await q.apply("retry", size=5)
    assert resumed.matched == resumed.done == 20 - first
    counts = await app.broker.counts("orders")
    assert counts[JobState.WAITING] == 20  # each retried once: 20 in all
    assert counts[JobState.FAILED] == 20
    assert await q.count() == 0


async def test_a_partitioned_task_is_walked_in_every_partition(
    broker_url: str, app_name: str
) -> None:
    app = App(app_name, broker=broker_url)

    @app.task(queue="split", partitions=3, retries=0)
    async def split(order: Order) -> None:
        raise CardDeclined(str(order.n))

    with anyio.fail_after(TEST_DEADLINE):
        async with app:
            jobs = await split.enqueue_many(orders(30))
            async with app.worker(concurrency=8):
                for job in jobs:
                    with pytest.raises(JobFailed):
                        await job.result(timeout=10)
            q = BulkQuery(app.client, app.queues, JobFilter(task="split"), tasks=app.tasks)
            assert q.queues == ["split.p0", "split.p1", "split.p2"]
            report = await q.apply("retry", size=4)
            assert (report.matched, report.done) == (30, 30)
            waiting = [(await app.broker.counts(p))[JobState.WAITING] for p in q.queues]
            assert sum(waiting) == 30
            assert all(waiting)  # every partition held some
