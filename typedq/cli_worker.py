"""``typedq worker MODULE:APP``: a worker process (the command line is in :mod:`typedq.cli`).

It connects first: an unreachable broker is one line and exit status 2, or, with
``--wait-for-broker SECONDS``, retried with a logged backoff until then. Without a broker
(no ``--broker``, no ``$TYPEDQ_BROKER``) it warns that ``memory://`` is private to the
process. The first SIGTERM or SIGINT starts a graceful shutdown (stop claiming, let
in-flight jobs finish within ``--grace``, then cancel and hand them back; sync handlers'
threads get at most one lease more, then are abandoned); the second names the jobs still
held and skips the waits; the third exits at once with status 130 (the jobs come back by
lease expiry). The process exits even when a sync handler's thread never returns: threads
cannot be stopped, so the worker command ends the process with ``os._exit`` once logs are
flushed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio

from .app import App
from .broker import redact_url
from .cli_common import load_app, metrics_module
from .client import DEFAULT_BROKER_ENV, Client
from .errors import BrokerUnavailable, ConfigError, TypedqError
from .supervisor import SUPERVISOR_ENV, stop_with_parent, watch_parent, write_metrics_port
from .worker import Worker

__all__ = ["exit_past_threads", "worker_command"]

log = logging.getLogger("typedq.cli")


def worker_command(args: argparse.Namespace) -> int:
    """``typedq worker``: run every task of ``args.app`` until signalled; the exit status."""
    try:
        app = load_app(args.app)
        if args.broker:
            app.use_broker(args.broker)
        url = app.client.url
        chosen = args.broker or os.environ.get(DEFAULT_BROKER_ENV)
        if args.processes > 1:
            return _supervise(args, url)  # refuses memory:// in one line
        if url.startswith("memory:") and not chosen:
            log.warning(
                "no broker given: this worker uses memory://, the embedded broker inside "
                "this process, so no other process can enqueue jobs for it. Give "
                "--broker redis://HOST:PORT/DB or set %s (--broker memory:// silences "
                "this warning)",
                DEFAULT_BROKER_ENV,
            )
        log.info("app %r on %s", app.name, redact_url(url))
        return anyio.run(_run_worker, app, args)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        error = _single(exc)
        if isinstance(error, KeyboardInterrupt):
            return 130
        if not isinstance(error, TypedqError):
            raise
        print(f"typedq: error: {error}", file=sys.stderr)
        return 2


def _supervise(args: argparse.Namespace, url: str) -> int:
    """``--processes N``: run N copies of this worker command under a supervisor."""
    from .supervisor import Supervisor, child_command

    if url.startswith("memory:"):
        raise ConfigError(
            "--processes needs a broker the processes share, and memory:// lives inside one "
            "process: give --broker redis://HOST:PORT/DB (or set TYPEDQ_BROKER)"
        )
    command = child_command(
        args.app,
        [
            ("--broker", args.broker),
            ("--concurrency", args.concurrency),
            ("--queues", args.queues or None),
            ("--grace", args.grace),
            ("--wait-for-broker", args.wait_for_broker),
            ("--heartbeat", args.heartbeat),
            ("--log-level", args.log_level),
            ("--log-format", args.log_format),
        ],
    )
    log.info("app %r on %s: %d worker processes", args.app, redact_url(url), args.processes)
    supervisor = Supervisor(
        command,
        args.processes,
        metrics_port=args.metrics_port,
        metrics_addr=args.metrics_addr,
    )
    return anyio.run(supervisor.run)


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _run_worker(app: App, args: argparse.Namespace) -> int:
    queues = [q for q in args.queues.split(",") if q] if args.queues else None
    worker = app.worker(concurrency=args.concurrency, queues=queues, grace=args.grace)
    worker.heartbeat = args.heartbeat
    server = _serve_metrics(worker, args) if args.metrics_port is not None else None
    try:
        return await _run_until_signalled(app, worker, args)
    finally:
        if server is not None:
            server.shutdown()


def _serve_metrics(worker: Worker[Any, Any], args: argparse.Namespace) -> Any:
    """Serve ``/metrics`` for ``worker`` on ``--metrics-port`` (see :mod:`typedq.metrics`)."""
    metrics_module()  # one line when the extra is missing
    from prometheus_client import CollectorRegistry, ProcessCollector

    from .metrics import Metrics

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    metrics = Metrics(registry)
    metrics.attach(worker)
    port, server = metrics.serve(args.metrics_port, args.metrics_addr)
    log.info("serving metrics on http://%s:%d/metrics", args.metrics_addr, port)
    write_metrics_port(port)
    return server


async def _run_until_signalled(app: App, worker: Worker[Any, Any], args: argparse.Namespace) -> int:
    signals = _Signals(worker)
    async with anyio.create_task_group() as tg:
        signals.scope = tg.cancel_scope
        tg.start_soon(signals.listen)
        supervisor = os.environ.get(SUPERVISOR_ENV)
        if supervisor and not stop_with_parent(int(supervisor)):
            tg.start_soon(watch_parent, int(supervisor), lambda: signals.on_signal("orphaned"))
        async with _connected(app.client, args.wait_for_broker):
            # No await between these two lines: a signal handled after this sees a
            # worker whose stop() takes effect (run() sets itself up before awaiting).
            signals.running = True
            await worker.run()  # returns once the shutdown is complete
        tg.cancel_scope.cancel()  # stop listening for signals
    return signals.code


@contextlib.asynccontextmanager
async def _connected(client: Client, wait: float) -> AsyncIterator[None]:
    """Connect ``client``; while the broker is unreachable, retry for ``wait`` seconds
    (one line per try), then give up with one line naming the broker and the fix."""
    deadline = time.monotonic() + wait
    delay = 0.5
    tries = 0
    async with contextlib.AsyncExitStack() as stack:
        while True:
            tries += 1
            try:
                await stack.enter_async_context(client)
                break
            except BrokerUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BrokerUnavailable(_unreachable(client.url, exc, wait, tries)) from None
                pause = min(delay, left)
                log.warning(
                    "try %d: %s; retrying in %.1fs (--wait-for-broker: %.0fs left)",
                    tries,
                    str(exc).rstrip("."),
                    pause,
                    left,
                )
                await anyio.sleep(pause)
                delay = min(delay * 2, 5.0)
        if tries > 1:
            log.info("reached the broker %s on try %d", redact_url(client.url), tries)
        yield


def _unreachable(url: str, exc: BrokerUnavailable, wait: float, tries: int) -> str:
    if wait > 0:
        waited = f"gave up after {tries} tries in {wait:g}s: "
        fix = "start it, check the URL (--broker or $TYPEDQ_BROKER), or wait longer"
    else:
        waited = ""
        fix = (
            "start it, check the URL (--broker or $TYPEDQ_BROKER), or pass "
            "--wait-for-broker SECONDS to wait for it"
        )
    return f"cannot reach the broker {redact_url(url)}: {waited}{str(exc).rstrip('.')}; {fix}"


class _Signals:
    """SIGTERM/SIGINT for ``typedq worker``: the first stops gracefully, the second
    skips the grace, the third exits at once (the jobs come back by lease expiry)."""

    def __init__(self, worker: Worker[Any, Any]) -> None:
        self.worker = worker
        self.scope: anyio.CancelScope | None = None
        #: True once worker.run() has been entered; before that a signal just exits.
        self.running = False
        self.count = 0
        self.code = 0

    async def listen(self) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.on_signal(signal.Signals(signum).name)

    def on_signal(self, name: str) -> None:
        self.count += 1
        worker = self.worker
        if not self.running:
            log.warning("%s: stopped before the worker started (nothing was claimed)", name)
            self.code = 130
            assert self.scope is not None
            self.scope.cancel()
        elif self.count == 1:
            log.info(
                "%s: shutting down gracefully: no new claims; %d running jobs have up to "
                "%.1fs (--grace) to finish. A second signal skips the grace",
                name,
                len(worker.in_flight()),
                worker.grace,
            )
            worker.stop()
        elif self.count == 2:
            jobs = worker.in_flight()
            if jobs:
                log.warning(
                    "second %s: skipping the grace; cancelling and handing back %d jobs "
                    "still running: %s (a sync handler's thread cannot be stopped: its "
                    "job comes back when its lease expires). A third signal exits at once",
                    name,
                    len(jobs),
                    _jobs_text(jobs),
                )
            else:
                log.warning("second %s: skipping the grace; no jobs left to wait for", name)
            worker.stop(force=True)
        else:
            jobs = worker.in_flight()
            log.warning(
                "third %s: exiting now (status 130)%s",
                name,
                f"; {len(jobs)} unsettled jobs come back when their leases expire "
                f"(within {worker.lease:g}s): {_jobs_text(jobs)}"
                if jobs
                else "",
            )
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)


def _jobs_text(jobs: list[tuple[str, str]], most: int = 10) -> str:
    shown = ", ".join(f"{job_id} ({task})" for job_id, task in jobs[:most])
    return shown if len(jobs) <= most else f"{shown} and {len(jobs) - most} more"


def exit_past_threads(code: int) -> int:
    """Return ``code``, or end the process with it if handler threads still run.

    A sync handler that never returns keeps its (non-daemon) thread alive, and the
    interpreter would wait for it forever at exit. The worker has already abandoned
    those jobs (they come back by lease expiry), so flush the logs and leave.
    """
    deadline = time.monotonic() + 1.0
    lingering = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        # Idle pool threads are told to stop when the event loop ends: let them.
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            lingering.append(thread)
    if not lingering:
        return code
    log.warning(
        "exiting with %d handler threads still running (they cannot be stopped)", len(lingering)
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
