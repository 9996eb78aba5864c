"""``typedq worker MODULE:APP``: a worker process (the parser is in :mod:`typedq.cli`).

It connects first. A broker that does not answer yet (Redis restarting, starting
after the worker, a network blip) is waited for as a running worker rides out an outage:
retried with a backoff of 0.5 s doubling to 5 s, logged once when the wait begins, when
its reason changes and once a minute, for as long as it takes (or ``--wait-for-broker
SECONDS``, after which the worker exits with status 75, a transient failure the
supervisor restarts). A mistake the user must fix (a bad URL, credentials Redis refuses,
an app that does not import) is one line and exit status 2. Without a broker
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
import math
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import anyio

from ..app import App
from ..broker import redact_url
from ..client import DEFAULT_BROKER_ENV, Client
from ..errors import BrokerUnavailable, ConfigError, TypedqError
from ..supervisor import (
    SUPERVISOR_ENV,
    UNREACHABLE,
    stop_with_parent,
    watch_parent,
    write_metrics_port,
)
from ..task import check_queues
from ..worker import Worker
from .common import load_app, metrics_module

__all__ = ["broker_address", "exit_past_threads", "worker_command"]

log = logging.getLogger("typedq.cli")

#: Backoff between connection tries while waiting for the broker: first pause and cap
#: (the cap of a running worker's retries too).
CONNECT_FIRST = 0.5
CONNECT_MAX = 5.0
#: While the wait goes on unchanged, one reminder line this often (seconds).
WAIT_REMINDER = 60.0


def worker_command(args: argparse.Namespace) -> int:
    """``typedq worker``: run every task of ``args.app`` until signalled; the exit status."""
    try:
        app = load_app(args.app)
        if args.broker:
            app.use_broker(args.broker)
        url = app.client.url
        queues = _queues(args)
        if queues and not args.allow_unknown_queue:
            # Before anything starts (--processes children included): a typo'd queue
            # would run nothing, quietly.
            check_queues(app.tasks.values(), queues, app=app.name, insist="--allow-unknown-queue")
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
        # An unreachable broker is transient, not a mistake to fix: a distinct status,
        # which the supervisor (and systemd's Restart=on-failure) restarts.
        return UNREACHABLE if isinstance(error, BrokerUnavailable) else 2


def _supervise(args: argparse.Namespace, url: str) -> int:
    """``--processes N``: run N copies of this worker command under a supervisor."""
    from ..supervisor import Supervisor, child_command

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
            ("--prefetch", args.prefetch),
            ("--queues", args.queues or None),
            ("--allow-unknown-queue", "" if args.allow_unknown_queue else None),
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
        metrics_host=args.metrics_host,
    )
    return anyio.run(supervisor.run)


def _queues(args: argparse.Namespace) -> list[str] | None:
    """``--queues a,b`` as a list (None: every queue of the app)."""
    return [q for q in args.queues.split(",") if q] if args.queues else None


def _single(exc: BaseException) -> BaseException:
    """The one exception inside (nested) exception groups of one, or ``exc`` itself."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


async def _run_worker(app: App, args: argparse.Namespace) -> int:
    worker = app.worker(
        concurrency=args.concurrency,
        prefetch=args.prefetch,
        queues=_queues(args),
        grace=args.grace,
        allow_unknown_queues=args.allow_unknown_queue,
    )
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
    from prometheus_client import CollectorRegistry, ProcessCollector  # type: ignore[import-not-found, unused-ignore]  # optional extra

    from ..metrics import Metrics

    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    metrics = Metrics(registry)
    metrics.attach(worker)
    port, server = metrics.serve(args.metrics_port, args.metrics_host)
    log.info("serving metrics on http://%s:%d/metrics", args.metrics_host, port)
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
    """Connect ``client``; while the broker is unreachable, wait for it (see
    :class:`_BrokerWait`) for ``wait`` seconds (``inf``: for as long as it takes)."""
    waiting = _BrokerWait(client.url, wait)
    async with contextlib.AsyncExitStack() as stack:
        while True:
            try:
                await stack.enter_async_context(client)
                break
            except BrokerUnavailable as exc:
                await anyio.sleep(waiting.failed(exc))
        waiting.reached()
        yield


class _BrokerWait:
    """The start-up wait for an unreachable broker: the backoff, and the log lines.

    One line when the wait begins, one when its reason changes, one reminder per
    :data:`WAIT_REMINDER` seconds, one when the broker answers; never the credentials
    (the broker's messages are scrubbed, and the address is host and port only).
    """

    def __init__(self, url: str, wait: float) -> None:
        self.url = url
        self.address = broker_address(url)
        self.wait = wait
        self.began = time.monotonic()
        self.delay = CONNECT_FIRST
        self.tries = 0
        self.reason = ""
        self.reminded = self.began

    def failed(self, exc: BrokerUnavailable) -> float:
        """Count a failed try; return the pause before the next one, or raise the
        one-line :class:`BrokerUnavailable` once ``wait`` is spent."""
        self.tries += 1
        now = time.monotonic()
        waited = now - self.began
        left = self.wait - waited
        reason = str(exc).rstrip(".")
        if left <= 0:
            raise BrokerUnavailable(self._gave_up(reason, waited)) from None
        if self.tries == 1:
            bound = (
                "for as long as it takes (--wait-for-broker SECONDS sets a bound)"
                if math.isinf(self.wait)
                else f"for up to {self.wait:g}s (--wait-for-broker)"
            )
            log.warning(
                "waiting for the broker at %s: %s; retrying with a backoff of up to %gs, %s",
                self.address,
                reason,
                CONNECT_MAX,
                bound,
            )
            self.reminded = now
        elif reason != self.reason:
            log.warning("still waiting for the broker at %s: now %s", self.address, reason)
            self.reminded = now
        elif now - self.reminded >= WAIT_REMINDER:
            log.warning(
                "still waiting for the broker at %s after %.0fs (%d tries): %s",
                self.address,
                waited,
                self.tries,
                reason,
            )
            self.reminded = now
        self.reason = reason
        pause, self.delay = self.delay, min(self.delay * 2, CONNECT_MAX)
        return min(pause, left)

    def reached(self) -> None:
        if self.tries:
            log.info(
                "reached the broker at %s after %.1fs (%d failed tries)",
                self.address,
                time.monotonic() - self.began,
                self.tries,
            )

    def _gave_up(self, reason: str, waited: float) -> str:
        if self.wait > 0:
            gave_up = f"gave up after {self.tries} tries in {waited:.1f}s: "
            fix = "start it, check the URL (--broker or $TYPEDQ_BROKER), or wait longer"
        else:
            gave_up = ""
            fix = (
                "start it, check the URL (--broker or $TYPEDQ_BROKER), or leave out "
                "--wait-for-broker 0 to wait for it"
            )
        return f"cannot reach the broker {redact_url(self.url)}: {gave_up}{reason}; {fix}"


def broker_address(url: str) -> str:
    """Where the broker of ``url`` is, without the scheme or credentials: ``host:port``
    (several, comma-separated, for a Cluster), or a Unix socket's path."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return netloc or parts.path or redact_url(url)


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
