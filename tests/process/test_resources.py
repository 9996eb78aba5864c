"""Resources: opened once per worker before claiming, read by handlers, closed at shutdown."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import msgspec
import pytest

from typedq import (
    App,
    ConfigError,
    JobContext,
    JobFailed,
    JobState,
    Resource,
    ResourceError,
    Resources,
)
from typedq.testing import job_context, provide, run_worker

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


class Order(msgspec.Struct):
    order_id: int


class Done(msgspec.Struct):
    seen: str


class Pool:
    """Stands for a connection pool: something opened once and shared by jobs."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.closed = False


async def test_opened_in_order_before_claiming_and_closed_in_reverse_after_jobs() -> None:
    app = App("res-order")
    events: list[str] = []
    release = anyio.Event()
    started = anyio.Event()
    job_ids: list[str] = []

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        events.append("open db")
        pool = Pool("db://")
        try:
            yield pool
        finally:
            # Shutdown closes resources only once in-flight jobs have settled.
            assert await handle.job(job_ids[0]).status() is JobState.COMPLETED
            pool.closed = True
            events.append("close db")

    @app.resource
    @contextlib.asynccontextmanager
    async def cache() -> AsyncIterator[dict[str, str]]:
        events.append("open cache")
        yield {"greeting": "hello"}
        events.append("close cache")

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        events.append("job")
        started.set()
        await release.wait()
        return Done(seen=f"{ctx.get(db).dsn} {ctx.get(cache)['greeting']}")

    async with app:
        job = await handle.enqueue(Order(order_id=1))
        job_ids.append(job.id)
        async with app.worker():
            await started.wait()
            assert events == ["open db", "open cache", "job"]
            release.set()  # the job finishes during the graceful shutdown below
        assert events == ["open db", "open cache", "job", "close cache", "close db"]
        assert await job.result(timeout=5) == Done(seen="db:// hello")


async def test_a_resource_builds_on_those_opened_before_it() -> None:
    app = App("res-deps")

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        yield Pool("db://")

    @app.resource
    @contextlib.asynccontextmanager
    async def repo(opened: Resources) -> AsyncIterator[str]:
        yield f"repo on {opened.get(db).dsn}"

    @app.resource
    async def too_early(opened: Resources) -> AsyncIterator[str]:
        yield opened.get(late)  # registered after it: not open yet

    @app.resource
    async def late() -> AsyncIterator[str]:
        yield "late"  # pragma: no cover  # opening stops at too_early

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        return Done(seen=ctx.get(repo))

    with pytest.raises(ResourceError) as caught:
        async with run_worker(app):
            pass  # pragma: no cover
    message = str(caught.value)
    assert message.startswith("resource 'late' (app 'res-deps') is not open in worker ")
    assert message.endswith(
        ", while opening 'too_early' (open: db, repo); register it on the app this worker "
        "runs (@app.resource) before the resources that use it, or give a test double with "
        "typedq.testing.provide"
    )

    # With a double for db, repo builds on the double.
    async with run_worker(
        app, resources=[provide(db, Pool("fake://")), provide(too_early, "x")]
    ) as harness:
        job = await handle.enqueue(Order(order_id=1))
        await harness.idle()
        assert await job.result(timeout=5) == Done(seen="repo on fake://")


class Client:
    """An async context manager class, like httpx.AsyncClient: registered as it is."""

    def __init__(self, base_url: str = "https://api.example") -> None:
        self.base_url = base_url
        self.open = False

    async def __aenter__(self) -> Client:
        self.open = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.open = False


async def test_an_async_context_manager_class_or_partial_is_a_resource() -> None:
    app = App("res-class")
    client = app.resource(Client)
    other = app.resource(
        functools.partial(Client, base_url="https://other.example"), name="other_api"
    )
    assert (client.name, other.name) == ("Client", "other_api")
    seen: list[Client] = []

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        seen.extend([ctx.get(client), ctx.get(other)])
        assert all(c.open for c in seen)
        return Done(seen=" ".join(c.base_url for c in seen))

    async with run_worker(app) as harness:
        job = await handle.enqueue(Order(order_id=1))
        await harness.idle()
        assert await job.result(timeout=5) == Done(seen="https://api.example https://other.example")
    assert not any(c.open for c in seen)


async def test_sync_handlers_read_resources_from_their_thread() -> None:
    app = App("res-sync")

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        yield Pool("sync://")

    @app.task
    def handle(order: Order, ctx: JobContext) -> Done:
        return Done(seen=ctx.get(db).dsn)

    async with run_worker(app) as harness:
        job = await handle.enqueue(Order(order_id=1))
        await harness.idle()
        assert await job.result(timeout=5) == Done(seen="sync://")


async def test_a_resource_that_fails_to_open_stops_the_worker_and_closes_the_others() -> None:
    app = App("res-fail")
    events: list[str] = []

    @app.resource
    async def first() -> AsyncIterator[str]:
        events.append("open first")
        yield "first"
        events.append("close first")

    async def connect() -> str:
        raise OSError("connection refused")

    @app.resource
    async def broken() -> AsyncIterator[str]:
        yield await connect()

    @app.task
    async def handle(order: Order) -> None:
        events.append("job")  # pragma: no cover  # the worker never starts

    async with app:
        await handle.enqueue(Order(order_id=1))
        with pytest.raises(ResourceError) as caught:
            async with app.worker():
                pytest.fail("the worker must not start")  # pragma: no cover
        assert str(caught.value) == (
            "could not open resource 'broken': OSError: connection refused"
        )
        assert events == ["open first", "close first"]
        assert (await app.broker.counts("default"))[JobState.WAITING] == 1  # nothing claimed


async def test_an_open_error_is_described_on_one_line() -> None:
    app = App("res-describe")

    async def connect() -> str:
        async with anyio.create_task_group() as tg:
            tg.start_soon(refuse)
        return "never"

    async def refuse() -> None:
        raise TimeoutError  # no message: its type says it all

    @app.resource
    async def grouped() -> AsyncIterator[str]:
        yield await connect()

    async def parse() -> str:
        raise ValueError("bad DSN\n  expected postgres://...")

    @app.resource
    async def multiline() -> AsyncIterator[str]:
        yield await parse()

    @app.task
    async def handle(order: Order) -> None:
        pass  # pragma: no cover

    with pytest.raises(ResourceError) as caught:
        async with run_worker(app):
            pass  # pragma: no cover
    assert str(caught.value) == "could not open resource 'grouped': TimeoutError"
    del app._resources["grouped"]
    with pytest.raises(ResourceError) as caught:
        async with run_worker(app):
            pass  # pragma: no cover
    assert str(caught.value) == (
        "could not open resource 'multiline': ValueError: bad DSN expected postgres://..."
    )


async def test_stop_while_a_resource_hangs_opening_stops_the_worker() -> None:
    app = App("res-hang")
    events: list[str] = []
    opening = anyio.Event()

    @app.resource
    async def first() -> AsyncIterator[str]:
        yield "first"
        events.append("close first")

    @app.resource
    async def hangs() -> AsyncIterator[str]:
        opening.set()
        await anyio.sleep_forever()  # a database that never answers
        yield "never"

    @app.task
    async def handle(order: Order) -> None:
        pass  # pragma: no cover  # the worker never starts

    worker = app.worker()

    async def stop_when_opening() -> None:
        await opening.wait()
        worker.stop()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stop_when_opening)
        with pytest.raises(ResourceError) as caught:
            await worker.run()
    assert str(caught.value) == f"worker {worker.id} was stopped while resource 'hangs' was opening"
    assert events == ["close first"]


async def test_direct_call_outside_a_worker_is_a_clear_error() -> None:
    app = App("res-direct")

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        yield Pool("real://")  # pragma: no cover  # a direct call opens nothing

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        return Done(seen=ctx.get(db).dsn)

    with pytest.raises(ResourceError) as caught:
        await handle(Order(order_id=1))
    message = str(caught.value)
    assert message.startswith("resource 'db' is not open: job 'local' (handle) does not run")
    assert "typedq.testing.job_context(typedq.testing.provide(db, value))" in message
    # With a test double, the same direct call works.
    done = await handle(Order(order_id=1), job_context(provide(db, Pool("fake://"))))
    assert done == Done(seen="fake://")


async def test_run_worker_uses_doubles_instead_of_opening() -> None:
    app = App("res-double")
    opened: list[str] = []

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        opened.append("db")  # pragma: no cover  # replaced by the double
        yield Pool("real://")  # pragma: no cover

    @app.resource
    async def http() -> AsyncIterator[str]:
        opened.append("http")
        yield "client"

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        return Done(seen=f"{ctx.get(db).dsn} {ctx.get(http)}")

    async with run_worker(app, resources=[provide(db, Pool("fake://"))]) as harness:
        job = await handle.enqueue(Order(order_id=1))
        await harness.idle()
        assert await job.result(timeout=5) == Done(seen="fake:// client")
    assert opened == ["http"]


async def test_a_resource_of_another_app_fails_the_job_with_a_clear_record() -> None:
    app = App("res-mine")
    other = App("res-other")

    @other.resource
    async def foreign() -> AsyncIterator[str]:
        yield "x"  # pragma: no cover  # never opened: no worker of `other` runs

    @app.task
    async def handle(order: Order, ctx: JobContext) -> Done:
        return Done(seen=ctx.get(foreign))

    async with run_worker(app) as harness:
        job = await handle.enqueue(Order(order_id=1))
        await harness.idle()
        with pytest.raises(JobFailed) as caught:
            await job.result(timeout=5)
    record = caught.value.record
    assert record.error_type == "typedq.resources.ResourceError"
    assert record.message.startswith("resource 'foreign' (app 'res-other') is not open in worker ")
    assert "(open: none); register it on the app this worker runs" in record.message


async def test_an_error_while_closing_is_logged_and_the_others_still_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = App("res-close")
    closed: list[str] = []

    @app.resource
    async def first() -> AsyncIterator[str]:
        yield "first"
        closed.append("first")

    @app.resource
    async def second() -> AsyncIterator[str]:
        yield "second"
        raise RuntimeError("close failed")

    @app.task
    async def handle(order: Order) -> None:
        pass

    with caplog.at_level(logging.WARNING, logger="typedq.resources"):
        async with run_worker(app):
            pass
    assert closed == ["first"]
    assert "resource 'second' raised while closing: RuntimeError: close failed" in caplog.text


async def test_a_factory_that_returns_no_context_manager_is_a_clear_error() -> None:
    app = App("res-bad-factory")

    def plain() -> str:
        return "not a context manager"

    # mypy rejects this registration too (tests/typing_snippets/fail/resource_errors.py).
    bad: Resource[str] = app.resource(plain)  # type: ignore[arg-type]
    assert bad.name == "plain"

    @app.task
    async def handle(order: Order) -> None:
        pass  # pragma: no cover

    with pytest.raises(ResourceError) as caught:
        async with run_worker(app):
            pass  # pragma: no cover
    assert str(caught.value) == (
        "resource 'plain': its factory returned str, not an async context manager; make it "
        "an async generator that yields the value, or decorate it with "
        "@contextlib.asynccontextmanager"
    )


def test_a_worker_is_made_outside_an_event_loop() -> None:
    """Making a worker (at import time, say) needs no running loop: only run() does."""
    app = App("res-no-loop")

    @app.task
    async def handle(order: Order) -> None:
        pass  # pragma: no cover

    worker = app.worker()
    worker.stop()  # before it runs: nothing to cancel yet
    assert worker.running == 0


def test_registration_errors_are_one_clear_line() -> None:
    app = App("res-register")

    async def returns() -> Pool:
        return Pool("x")

    async def takes(dsn: str, user: str) -> AsyncIterator[Pool]:
        yield Pool(dsn)

    async def takes_one(dsn: str) -> AsyncIterator[Pool]:
        yield Pool(dsn)

    async def twice() -> AsyncIterator[str]:
        yield "x"

    with pytest.raises(ConfigError) as caught:
        app.resource(returns)  # type: ignore[arg-type]  # mypy rejects it too
    assert str(caught.value) == (
        "resource 'returns' is an async function that returns its value, so it could never "
        "be closed; make it yield the value (an async generator) and close it after the yield"
    )
    with pytest.raises(ConfigError) as caught:
        app.resource(takes)  # type: ignore[arg-type]  # mypy rejects it too
    assert str(caught.value) == (
        "resource 'takes' takes parameters (dsn, user); a resource factory takes none, or "
        "one: the resources opened before it (opened: Resources)"
    )
    with pytest.raises(ConfigError) as caught:
        app.resource(takes_one)  # type: ignore[arg-type]  # mypy rejects it too
    assert str(caught.value).startswith("resource 'takes_one' takes parameters (dsn); ")
    app.resource(twice)
    with pytest.raises(ConfigError) as caught:
        app.resource(twice)
    assert str(caught.value) == (
        "app 'res-register' already has a resource named 'twice'; rename the function or "
        "pass app.resource(fn, name=...)"
    )
    assert [r.name for r in app.resources] == ["twice"]


def test_cli_worker_whose_resource_fails_exits_2_with_one_line() -> None:
    result = subprocess.run(
        # memory:// named explicitly: the start fails before any job could arrive anyway.
        [
            sys.executable,
            "-m",
            "typedq",
            "worker",
            "tests.resource_app:app",
            "--broker",
            "memory://",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TYPEDQ_BROKER": ""},
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert (
        "typedq: error: could not open resource 'warehouse': ConnectionRefusedError: "
        "warehouse database at db.invalid:5432 refused the connection"
    ) in result.stderr
    assert "Traceback" not in result.stderr
    assert "ExceptionGroup" not in result.stderr


def test_cli_worker_interrupted_while_a_resource_hangs_opening_exits_with_one_line() -> None:
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "typedq",
            "worker",
            "tests.resource_app:hanging_app",
            "--broker",
            "memory://",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TYPEDQ_BROKER": ""},
    )
    try:
        assert worker.stderr is not None
        for line in worker.stderr:  # wait until it hangs opening (no sleeps)
            if "opening resources slow_db" in line:
                break
        worker.send_signal(signal.SIGINT)
        _, rest = worker.communicate(timeout=60)
    finally:
        worker.kill()
    assert worker.returncode == 2, rest
    assert "was stopped while resource 'slow_db' was opening" in rest
    assert "Traceback" not in rest
