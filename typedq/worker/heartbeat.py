"""A worker's entry in the broker's worker registry (``typedq inspect --workers``).

The entry is written every ``interval`` seconds and expires after three missed ones, so
a dead worker leaves the listing by itself; a worker that stops removes its own entry.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

import anyio

from ..broker.base import Broker, WorkerInfo
from ..clock import Clock
from ..errors import Unsupported
from ..observe import Observers
from .jobs import RunningJobs

__all__ = ["Heartbeat"]

log = logging.getLogger("typedq.worker")

#: Seconds the last broker call of a stopping worker (leaving the registry) may take.
_UNREGISTER_WAIT = 2.0


class Heartbeat:
    """Keeps a worker listed in the broker's registry while it runs.

    :param broker: the app's broker (a callable: read when the loop starts)
    :param worker_id: the worker's id (the registry's key)
    :param queues: the queues the worker takes jobs from
    :param concurrency: the worker's slots
    :param jobs: the worker's table of running jobs (its ``in_flight``)
    :param clock: what the loop sleeps on and timestamps come from
    """

    def __init__(
        self,
        broker: Callable[[], Broker],
        *,
        worker_id: str,
        queues: list[str],
        concurrency: int,
        jobs: RunningJobs,
        clock: Clock,
    ) -> None:
        self.broker = broker
        self.worker_id = worker_id
        self.queues = queues
        self.concurrency = concurrency
        self.jobs = jobs
        self.clock = clock
        #: Seconds between heartbeats; the entry expires after three missed ones.
        self.interval = 10.0
        #: When the worker started (epoch seconds; 0 until it does).
        self.started_at = 0.0
        #: Told about failed heartbeats (set before the worker starts).
        self.observer: Observers | None = None

    def info(self) -> WorkerInfo:
        """The worker as the broker's worker registry lists it."""
        return WorkerInfo(
            id=self.worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=list(self.queues),
            concurrency=self.concurrency,
            in_flight=len(self.jobs.running),
            started_at=self.started_at,
            heartbeat_at=self.clock.time(),
            version=_version(),
        )

    async def run(self) -> None:
        """Keep the worker in the broker's registry: an entry every ``interval`` seconds
        that expires after three missed ones, removed when this is cancelled (shutdown)."""
        broker = self.broker()
        failing = False
        try:
            while True:
                try:
                    await broker.register_worker(self.info(), ttl=3 * self.interval)
                except Unsupported:
                    return  # a broker without a registry
                except Exception as exc:
                    if self.observer is not None:
                        self.observer.broker_error("heartbeat", exc)
                    # Once per outage: the claim loop already reports an unreachable broker.
                    (log.debug if failing else log.warning)(
                        "worker %s: heartbeat failed (the worker registry may not list it): %s",
                        self.worker_id,
                        exc,
                    )
                    failing = True
                else:
                    failing = False
                await self.clock.sleep(self.interval)
        finally:
            # Real time: this bounds a broker call (network I/O) at shutdown.
            with anyio.move_on_after(_UNREGISTER_WAIT, shield=True):
                try:
                    await broker.unregister_worker(self.worker_id)
                except Exception as exc:
                    log.debug("worker %s: could not leave the registry: %s", self.worker_id, exc)


def _version() -> str:
    from .. import __version__

    return __version__
