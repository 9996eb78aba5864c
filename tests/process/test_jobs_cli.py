"""``typedq jobs`` as a process on Redis: listing by filter, dry runs, bulk retry and
remove, thousands of failed jobs retried while a worker runs (each exactly once, by the
ledger), and the one-line errors of a bad filter."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import anyio
import pytest
import redis

from tests import bulk_app
from tests.netproxy import NetProxy
from tests.redis_harness import RedisProcess, flushall
from tests.support import ROOT, spawn_worker, stop_workers
from typedq import App, JobState

APP = "tests.bulk_app:app"


def jobs(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "typedq", "jobs", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TYPEDQ_BROKER": "", "COLUMNS": "200", "PYTHONPATH": str(ROOT)},
        check=False,
    )


def ledger_url(server: RedisProcess) -> str:
    return f"redis://127.0.0.1:{server.port}/1"


@contextlib.contextmanager
def worker(server: RedisProcess, concurrency: int = 32) -> Iterator[subprocess.Popen[bytes]]:
    log = server.dir / "bulk-worker.log"
    with log.open("wb") as out:
        proc = spawn_worker(
            APP,
            server.url,
            concurrency=concurrency,
            grace=2,
            env={"TYPEDQ_TEST_LEDGER": ledger_url(server)},
            output=out,
        )
    try:
        yield proc
    finally:
        stop_workers([proc])


async def counts(app: App) -> dict[JobState, int]:
    return await app.broker.counts("orders")


async def wait_for(app: App, state: JobState, n: int, stall: float = 30) -> None:
    """Wait until ``n`` jobs are in ``state``; fail when the count stays put for ``stall``
    seconds (a hang), not after a fixed time: 20,000 failures take a worker process ~15 s
    on a quiet 2-core box and over 60 s on a loaded one."""
    seen, since = -1, anyio.current_time()
    # Polling is fine: another process moves the jobs.
    while (now := (await counts(app))[state]) < n:
        if now != seen:
            seen, since = now, anyio.current_time()
        elif anyio.current_time() - since > stall:
            raise TimeoutError(f"{seen} of {n} jobs {state.value}, none more in {stall} s")
        await anyio.sleep(0.05)


def fail_orders(server: RedisProcess, orders: list[bulk_app.Order]) -> None:
    """Enqueue the orders and let a worker process fail each once."""

    async def go() -> None:
        bulk_app.app.use_broker(server.url)
        async with bulk_app.app:
            await bulk_app.charge.enqueue_many(orders)
            with worker(server):
                await wait_for(bulk_app.app, JobState.FAILED, len(orders))

    anyio.run(go)


def state_counts(server: RedisProcess) -> dict[JobState, int]:
    async def go() -> dict[JobState, int]:
        bulk_app.app.use_broker(server.url)
        async with bulk_app.app:
            return await counts(bulk_app.app)

    return anyio.run(go)


@pytest.mark.redis
def test_lists_dry_runs_retries_and_removes_by_filter(redis_server: RedisProcess) -> None:
    flushall(redis_server.port)
    orders = [bulk_app.Order(i, "acme" if i < 20 else "zeta") for i in range(40)]
    orders[25] = bulk_app.Order(25, "zeta", bulk_app.Address("Paris"))
    fail_orders(redis_server, orders)
    target = [APP, "--broker", redis_server.url]

    everything = jobs(*target, "--json")
    assert everything.returncode == 0, everything.stderr
    data = json.loads(everything.stdout)
    assert (data["total"], data["examined"], len(data["jobs"])) == (40, 40, 20)

    zeta = ["--task", "charge", "--error-type", "CardDeclined", "--where", "tenant=zeta"]
    listed = jobs(*target, *zeta, "--limit", "5")
    assert listed.returncode == 0, listed.stderr
    assert (
        "18 matching failed jobs, of task charge, with error CardDeclined, where tenant=zeta "
        "(examined 40)" in listed.stdout
    )
    assert "first 5" in listed.stdout
    assert "CardDeclined: card of order" in listed.stdout
    nested = json.loads(
        jobs(*target, "--task", "charge", "--where", "address.city=Paris", "--json").stdout
    )
    assert [j["id"] for j in nested["jobs"]] != []
    assert nested["total"] == 1
    recent = json.loads(
        jobs(*target, "--since", "1h", "--error-type", "OutOfStock", "--json").stdout
    )
    assert recent["total"] == 4

    dry = jobs(*target, *zeta, "--retry", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "dry run: would retry 18 matching failed jobs" in dry.stdout
    assert state_counts(redis_server)[JobState.FAILED] == 40

    retried = jobs(*target, *zeta, "--retry")
    assert retried.returncode == 0, retried.stderr
    assert "retried 18 of 18 matching failed jobs" in retried.stdout
    after = state_counts(redis_server)
    assert (after[JobState.FAILED], after[JobState.WAITING]) == (22, 18)

    again = jobs(*target, *zeta, "--retry", "--json")
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["matched"], json.loads(again.stdout)["done"]) == (0, 0)

    removed = jobs(*target, "--state", "waiting", "--task", "charge", "--remove", "--json")
    assert removed.returncode == 0, removed.stderr
    report = json.loads(removed.stdout)
    assert (report["matched"], report["done"], report["outcomes"]) == (18, 18, {"removed": 18})
    assert state_counts(redis_server)[JobState.WAITING] == 0

    by_name = jobs(
        "--app",
        "bulkapp",
        "--broker",
        redis_server.url,
        "--queue",
        "orders",
        "--error-type",
        "OutOfStock",
        "--json",
    )
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["total"] == 4


@pytest.mark.redis
@pytest.mark.slow
def test_thousands_retried_in_batches_while_a_worker_runs_each_once(
    redis_server: RedisProcess,
) -> None:
    flushall(redis_server.port)
    total = 3000
    orders = [bulk_app.Order(i, "acme") for i in range(total)]

    async def go() -> dict[str, int]:
        bulk_app.app.use_broker(redis_server.url)
        async with bulk_app.app:
            await bulk_app.charge.enqueue_many(orders)
            with worker(redis_server):
                await wait_for(bulk_app.app, JobState.FAILED, total)
                # The worker keeps running: it takes the retried jobs while the walk goes
                # on; every tenth fails again, back among the failed jobs the walk reads.
                result = await anyio.to_thread.run_sync(
                    lambda: jobs(
                        APP, "--broker", redis_server.url, "--task", "charge", "--retry", "--json"
                    )
                )
                assert result.returncode == 0, result.stderr
                report = json.loads(result.stdout)
                assert (report["matched"], report["done"]) == (total, total)
                assert report["outcomes"] == {"retried": total}
                await wait_for(bulk_app.app, JobState.COMPLETED, total - total // 10)
                await wait_for(bulk_app.app, JobState.FAILED, total // 10)
            final = await counts(bulk_app.app)
            assert final[JobState.WAITING] == final[JobState.ACTIVE] == 0
            assert final[JobState.FAILED] == total // 10
        ledger = redis.Redis.from_url(ledger_url(redis_server))
        try:
            return {k.decode(): int(v) for k, v in ledger.hgetall("runs").items()}  # type: ignore[union-attr]
        finally:
            ledger.close()

    runs = anyio.run(go)
    assert len(runs) == total
    # Each job ran twice: its first run, and once after the one retry.
    assert set(runs.values()) == {2}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([APP, "--where", "n=1"], "--where needs exactly one --task"),
        (
            [APP, "--task", "charge", "--where", "nope=1"],
            "Order (task 'charge') has no field 'nope'; its fields: n, tenant, address",
        ),
        ([APP, "--task", "charge", "--where", "n=abc"], "n is int; 'abc' is not one"),
        ([APP, "--task", "charge", "--where", "n"], "is not field=value"),
        ([APP, "--task", "nope"], "'nope' is not a task of app 'bulkapp'; its tasks: charge"),
        ([APP, "--since", "1y"], "--since '1y' is not a duration"),
        ([APP, "--dry-run"], "--dry-run goes with --retry, --cancel or --remove"),
        ([APP, "--retry", "--state", "waiting"], "cannot retry waiting jobs; retry applies to"),
        (
            ["--app", "x", "--broker", "memory://", "--task", "t", "--where", "n=1"],
            "--where needs the app's tasks (their input models): give MODULE:APP",
        ),
        (["--app", "x"], "give --broker URL (or set TYPEDQ_BROKER) with --app"),
    ],
)
def test_a_bad_filter_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = jobs(*args, "--broker", "memory://") if args[0] == APP else jobs(*args)
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "typedq: error" in line]
    assert len(errors) == 1, result.stderr
    assert message in errors[0]
    assert "Traceback" not in result.stderr


@pytest.mark.anyio
async def test_progress_bar_draws_on_a_terminal() -> None:
    from rich.console import Console

    from typedq.bulk import BulkQuery, JobFilter
    from typedq.cli.jobs import _with_progress

    app = App("bulkbar", broker="memory://")

    @app.task(queue="q")
    async def noop(order: bulk_app.Order) -> None:
        return None

    async with app:
        await noop.enqueue_many(bulk_app.Order(i, "a") for i in range(30))
        screen = io.StringIO()
        console = Console(file=screen, force_terminal=True, width=120)
        query = BulkQuery(app.client, app.queues, JobFilter(state=JobState.WAITING))
        report = await _with_progress(query, "remove", console, dry_run=False, quiet=False)
    assert report.done == 30
    assert "remove waiting jobs" in screen.getvalue()
    assert "30/30" in screen.getvalue()


@pytest.mark.redis
@pytest.mark.slow
def test_an_interrupted_run_is_resumed_by_running_it_again(redis_server: RedisProcess) -> None:
    """Ctrl-C in the middle of a bulk retry: exit status 130, no traceback, some jobs
    retried; the same command again retries the rest, none twice."""
    flushall(redis_server.port)
    total = 20_000
    fail_orders(redis_server, [bulk_app.Order(i, "acme") for i in range(total)])
    # The run talks to Redis through a proxy that holds its requests once its first retry
    # script went through: it stops after its first batch whatever the box's load (a
    # watcher pausing Redis raced the run: on a quiet box the walk could end first; on
    # a loaded one the watcher could be starved until it had, or past the run's timeout).
    procs: list[subprocess.Popen[str]] = []
    proxy = NetProxy(redis_server.port)
    proxy.start()
    # Ctrl-C as the run's next request is held (the proxy sends it, at once: the run's
    # read of that request times out after 5 s, and a loaded box may keep a test's own
    # task from running for that long).
    proxy.hold_after(b"_retry\r\n", on_hold=lambda: procs[0].send_signal(signal.SIGINT))
    args = [sys.executable, "-m", "typedq", "jobs", APP, "--broker", proxy.url()]
    args += ["--task", "charge", "--retry", "--json"]
    env = {**os.environ, "TYPEDQ_BROKER": "", "PYTHONPATH": str(ROOT)}

    # The run starts with SIGINT's default disposition, as from a terminal. A child keeps
    # an ignored SIGINT, and a suite started in the background by a non-interactive shell
    # has it ignored (POSIX): Ctrl-C then did nothing, and the run went on to its end or
    # to its held read's timeout. A handled signal is reset to the default by exec.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            procs.append(
                subprocess.Popen(
                    args,
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        proc = procs[0]
        # Well under a second on a quiet box; 120 s for a loaded one.
        _, stderr = proc.communicate(timeout=120)
    finally:
        proxy.stop()
        for started in procs:
            if started.poll() is None:
                started.kill()
            started.communicate()  # reaps it and closes its pipes
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    first = state_counts(redis_server)
    assert 0 < first[JobState.WAITING] < total
    assert first[JobState.WAITING] + first[JobState.FAILED] == total

    again = jobs(APP, "--broker", redis_server.url, "--task", "charge", "--retry", "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert report["matched"] == report["done"] == first[JobState.FAILED]
    after = state_counts(redis_server)
    assert (after[JobState.WAITING], after[JobState.FAILED]) == (total, 0)
