"""``typedq worker --processes N``: one supervisor process and N worker processes.

A Python worker process uses one core at most (the GIL); a machine with more cores runs
one worker process per core. The supervisor starts each child as ``python -m typedq
worker ...`` with the same options (a fresh interpreter: nothing is forked from a
running event loop, nothing is pickled), then:

- forwards SIGTERM and SIGINT to every child, so the CLI's shutdown rules apply to each:
  the first signal stops claiming and lets running jobs finish within ``--grace``, the
  second skips the grace, the third exits at once (the jobs come back by lease expiry);
  the supervisor exits once every child has;
- restarts a child that dies (a crash, SIGKILL by the OOM killer, status 75: it gave up
  waiting for an unreachable broker) with exponential backoff, 0.5 s doubling to 30 s,
  back to 0.5 s once a child has run for a minute; the other children run on;
- stops everything, instead of restarting in a loop, when a child's first process exits
  with status 2 (a user mistake the child has already explained in one line: a bad
  option or broker URL, credentials the broker refuses). The same status from a
  restarted child is restarted with backoff like a crash: the command worked in that
  slot before, so what changed is outside it, and the healthy children run on;
- with ``--metrics-port``, serves ``/metrics`` for the whole group: each child serves
  its own series on a loopback port, and the supervisor's endpoint adds them up at
  scrape time (counters and histograms summed, ``typedq_worker_in_flight`` summed, the
  queue gauges, which every child reads from the same broker, taken once).

A child whose supervisor died without a word (SIGKILL) gets SIGTERM from the kernel
(Linux: ``PR_SET_PDEATHSIG``; elsewhere it notices its parent process id change) and
shuts down gracefully.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc

from .clock import SYSTEM_CLOCK, Clock, move_on_after

__all__ = [
    "METRICS_PORT_FILE_ENV",
    "SUPERVISOR_ENV",
    "UNREACHABLE",
    "USAGE_ERROR",
    "GroupCollector",
    "Supervisor",
    "merge_expositions",
    "stop_with_parent",
    "watch_parent",
    "write_metrics_port",
]

log = logging.getLogger("typedq.supervisor")

#: Set in each child's environment to the supervisor's pid (the child watches it).
SUPERVISOR_ENV = "TYPEDQ_SUPERVISOR_PID"

#: Set in a child's environment when the group serves metrics: the file the child writes
#: its metrics port to (it listens on a free loopback port).
METRICS_PORT_FILE_ENV = "TYPEDQ_METRICS_PORT_FILE"

#: Restart backoff: first pause, cap, and how long a child must run to reset it.
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE_AFTER = 60.0

#: Exit status of a child that explained a user mistake (the CLI's rule): not retried.
USAGE_ERROR = 2
#: Exit status of a worker that gave up waiting for an unreachable broker (sysexits'
#: EX_TEMPFAIL): transient, so restarted with backoff.
UNREACHABLE = 75

#: Series every child reads from the broker: the same value in each, reported once.
_SHARED_GAUGES = ("typedq_queue_jobs", "typedq_queue_oldest_waiting_seconds")


@dataclass
class _Child:
    """One slot of the group: the process that runs in it now, and its history."""

    index: int
    port_file: str | None = None
    process: anyio.abc.Process | None = None
    started: float = 0.0
    restarts: int = 0
    backoff: float = BACKOFF_FIRST
    codes: list[int] = field(default_factory=list)


class Supervisor:
    """Run ``processes`` copies of a worker command and keep them running.

    :param command: the child's command line without metrics options, e.g.
        ``[sys.executable, "-m", "typedq", "worker", "billing:app", "--concurrency", "16"]``
    :param processes: how many children (>= 1)
    :param metrics_port: serve the group's ``/metrics`` on this port (0: a free one);
        ``None``: no metrics
    :param metrics_host: the address of that endpoint (default: this machine only)
    :param clock: what the restart backoff reads and waits on (how long a child ran, the
        pause before its restart); tests pass a :class:`~typedq.clock.VirtualClock`
    """

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.command = list(command)
        self.children = [_Child(i) for i in range(processes)]
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host
        self.clock = clock
        self.signals = 0
        self.fatal: str | None = None
        self._stopping = anyio.Event()
        self._server: Any = None
        self._port_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def stopping(self) -> bool:
        """True once a signal or a fatal child exit started the shutdown."""
        return self._stopping.is_set()

    async def run(self) -> int:
        """Run until every child has exited after a shutdown; returns the exit status."""
        if self.metrics_port is not None:
            self._port_dir = tempfile.TemporaryDirectory(prefix="typedq-metrics-")
            for child in self.children:
                child.port_file = os.path.join(self._port_dir.name, f"child-{child.index}.port")
            self._serve_metrics()
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._listen_for_signals, tg.cancel_scope)
                async with anyio.create_task_group() as children:
                    for child in self.children:
                        children.start_soon(self._keep_running, child)
                tg.cancel_scope.cancel()
        finally:
            if self._server is not None:
                self._server.shutdown()
            if self._port_dir is not None:
                self._port_dir.cleanup()
        return self._exit_code()

    # -- children ----------------------------------------------------------------------

    def _child_command(self, child: _Child) -> list[str]:
        command = list(self.command)
        if child.port_file is not None:
            command += ["--metrics-port", "0", "--metrics-host", "127.0.0.1"]
        return command

    async def _keep_running(self, child: _Child) -> None:
        env = {**os.environ, SUPERVISOR_ENV: str(os.getpid())}
        if child.port_file is not None:
            env[METRICS_PORT_FILE_ENV] = child.port_file
        while not self._stopping.is_set():
            child.started = self.clock.monotonic()
            if child.port_file is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(child.port_file)  # the last run's port: gone with it
            process = await anyio.open_process(
                self._child_command(child),
                stdin=subprocess.DEVNULL,
                stdout=None,
                stderr=None,
                env=env,
                # Its own process group: a Ctrl-C in the terminal reaches the supervisor
                # only, which passes it on once (a child must not count it twice).
                start_new_session=True,
            )
            child.process = process
            log.info("worker process %d started (pid %d)", child.index, process.pid)
            code = await process.wait()
            child.process = None
            child.codes.append(code)
            ran = self.clock.monotonic() - child.started
            if self._stopping.is_set():  # a shutdown: this exit was asked for
                return
            if code == USAGE_ERROR and len(child.codes) == 1:
                self.fatal = (
                    f"worker process {child.index} (pid {process.pid}) exited with status 2 "
                    "(its error is above): stopping every worker process instead of restarting"
                )
                log.error("%s", self.fatal)
                self._stop_all(signal.SIGTERM)
                return
            if ran >= STABLE_AFTER:
                child.backoff = BACKOFF_FIRST
            pause = child.backoff
            child.backoff = min(child.backoff * 2, BACKOFF_MAX)
            child.restarts += 1
            log.warning(
                "worker process %d (pid %d) %s after %.1fs; restarting it in %.1fs "
                "(restart %d; its unsettled jobs come back when their leases expire)",
                child.index,
                process.pid,
                _exit_text(code),
                ran,
                pause,
                child.restarts,
            )
            with move_on_after(self.clock, pause):
                await self._stopping.wait()

    def _stop_all(self, signum: signal.Signals) -> None:
        self._stopping.set()
        for child in self.children:
            if child.process is not None and child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # exited in the meantime
                    child.process.send_signal(signum)

    async def _listen_for_signals(self, scope: anyio.CancelScope) -> None:
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as received:
            async for signum in received:
                self.signals += 1
                name = signal.Signals(signum).name
                running = sum(1 for c in self.children if c.process is not None)
                log.info(
                    "%s: passing it on to %d worker processes (%s signal: %s)",
                    name,
                    running,
                    _ORDINALS.get(self.signals, f"{self.signals}th"),
                    _MEANING.get(self.signals, "exit at once"),
                )
                self._stop_all(signal.Signals(signum))

    def _exit_code(self) -> int:
        if self.fatal is not None:
            return USAGE_ERROR
        last = [child.codes[-1] for child in self.children if child.codes]
        if any(code == 130 for code in last):
            return 130
        return 0 if all(code == 0 for code in last) else 1

    # -- metrics -----------------------------------------------------------------------

    def _serve_metrics(self) -> None:
        from .errors import ConfigError

        try:
            from .metrics import serve_registry
        except ConfigError:  # the extra is missing: say which option needs it, in one line
            raise ConfigError(
                "--metrics-port needs prometheus-client: pip install 'typedq[metrics]'"
            ) from None
        from prometheus_client import CollectorRegistry  # type: ignore[import-not-found, unused-ignore]  # optional extra

        registry = CollectorRegistry()
        registry.register(GroupCollector(self))
        assert self.metrics_port is not None
        port, server = serve_registry(registry, self.metrics_port, self.metrics_host)
        self._server = server
        log.info(
            "serving the metrics of %d worker processes on http://%s:%d/metrics",
            len(self.children),
            self.metrics_host,
            port,
        )

    def child_metrics_ports(self) -> list[int]:
        """The loopback ports of the children that run now and serve metrics."""
        ports = []
        for child in self.children:
            if child.process is None or child.port_file is None:
                continue
            try:
                with open(child.port_file) as f:
                    ports.append(int(f.read()))
            except (OSError, ValueError):  # not listening yet
                continue
        return ports


_ORDINALS = {1: "first", 2: "second", 3: "third"}
_MEANING = {
    1: "stop claiming, let running jobs finish within --grace",
    2: "skip the grace, hand running jobs back",
}


class GroupCollector:
    """A prometheus_client collector that sums the children's ``/metrics`` at scrape time.

    Counters, histograms and ``typedq_worker_in_flight`` are summed per label set; the
    queue gauges (each child reads the same broker) are taken from the first child that
    reports them; the children's own ``process_*`` and ``python_*`` series are left out
    (they describe one process each). ``typedq_worker_processes`` counts the children
    that answered, ``typedq_worker_restarts_total`` the restarts so far.
    """

    def __init__(self, supervisor: Supervisor, timeout: float = 2.0) -> None:
        self.supervisor = supervisor
        self.timeout = timeout

    def _scrape(self, port: int) -> str | None:
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as reply:
                text: str = reply.read().decode("utf-8")
                return text
        except OSError as exc:  # a child starting, restarting or gone: skip it this time
            log.debug("metrics of the worker process on port %d unavailable: %s", port, exc)
            return None

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily  # type: ignore[import-not-found, unused-ignore]  # optional extra

        ports = self.supervisor.child_metrics_ports()
        with ThreadPoolExecutor(max_workers=max(1, len(ports))) as pool:
            texts = [t for t in pool.map(self._scrape, ports) if t is not None]
        yield from merge_expositions(texts)
        alive = GaugeMetricFamily(
            "typedq_worker_processes", "Worker processes of this supervisor that answered"
        )
        alive.add_metric([], len(texts))
        yield alive
        restarts = CounterMetricFamily(
            "typedq_worker_restarts", "Worker processes this supervisor restarted"
        )
        restarts.add_metric([], sum(c.restarts for c in self.supervisor.children))
        yield restarts


def merge_expositions(texts: Sequence[str]) -> list[Any]:
    """Add up several processes' text expositions into metric families (see GroupCollector)."""
    from prometheus_client.metrics_core import Metric  # type: ignore[import-not-found, unused-ignore]  # optional extra
    from prometheus_client.parser import text_string_to_metric_families  # type: ignore[import-not-found, unused-ignore]  # optional extra

    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        seen_shared: set[str] = set()
        for family in text_string_to_metric_families(text):
            if family.name.startswith(("process_", "python_")):
                continue
            shared = family.name in _SHARED_GAUGES
            if shared and family.name in values and family.name not in seen_shared:
                continue  # another child's copy of the same broker reading
            seen_shared.add(family.name)
            if family.name not in merged:
                merged[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            sums = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                sums[key] = sums.get(key, 0.0) + sample.value
    out = []
    for name, metric in merged.items():
        for (sample_name, labels), value in values[name].items():
            metric.add_sample(sample_name, dict(labels), value)
        out.append(metric)
    return out


def stop_with_parent(expected: int) -> bool:
    """In a child: have the kernel send SIGTERM to this process when its supervisor dies.

    A supervisor killed with SIGKILL cannot pass a signal on; with this, its children
    still get one and shut down gracefully. Linux only (``prctl(PR_SET_PDEATHSIG)``);
    returns False elsewhere (the caller then falls back on :func:`watch_parent`).
    A supervisor already gone (the parent is no longer ``expected``) gets SIGTERM sent now.
    """
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0) != 0:
        return False
    if os.getppid() != expected:
        os.kill(os.getpid(), signal.SIGTERM)
    return True


async def watch_parent(expected: int, on_orphaned: Any, interval: float = 1.0) -> None:
    """Call ``on_orphaned()`` once the parent process is no longer ``expected``: the
    fallback of :func:`stop_with_parent` where the kernel cannot tell us."""
    # Polling once a second is the only portable way to learn of a parent's death.
    while os.getppid() == expected:  # noqa: ASYNC110
        await anyio.sleep(interval)
    log.warning("the supervisor (pid %d) is gone: shutting down", expected)
    on_orphaned()


def write_metrics_port(port: int) -> None:
    """In a child of a supervisor that serves metrics: tell it which port this child's
    metrics server got (atomically: the supervisor never reads half a number)."""
    path = os.environ.get(METRICS_PORT_FILE_ENV)
    if not path:
        return
    partial = f"{path}.{os.getpid()}"
    with open(partial, "w") as f:
        f.write(str(port))
    os.replace(partial, path)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == UNREACHABLE:
        return f"gave up waiting for the broker (status {code})"
    return f"exited with status {code}"


def child_command(app: str, options: Iterable[tuple[str, object]]) -> list[str]:
    """``python -m typedq worker APP`` with the given ``(flag, value)`` options
    (``None`` values left out, ``""`` a flag without a value)."""
    command = [sys.executable, "-m", "typedq", "worker", app]
    for flag, value in options:
        if value is None:
            continue
        command += [flag] if value == "" else [flag, str(value)]
    return command
