"""Shared models, builders and fakes for the contract and runtime suites.

Models live at module level so ``@app.task`` can resolve handler annotations. The one
fake, :class:`FaultyBroker`, wraps a real broker (memory or Redis) and adds the
faults of a network: stalled renewals (so a worker really loses its lease), lost
requests and lost replies.
"""

from __future__ import annotations

import abc
import contextlib
import inspect
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import msgspec
import pydantic

from typedq import App, BrokerUnavailable, JobState
from typedq.broker import broker_from_url
from typedq.broker.base import (
    Broker,
    BrokerSettings,
    ClaimedJob,
    Completion,
    Failure,
    FinishOutcome,
    JobMessage,
    JobRecord,
    LeaseStatus,
    Retention,
)
from typedq.names import new_job_id

#: Upper bound on any single test body: a bug fails the test instead of hanging it.
TEST_DEADLINE = 20.0
#: The repository root: worker processes run there, so the ``tests.*`` apps import.
ROOT = Path(__file__).resolve().parent.parent


def spawn_worker(
    target: str,
    broker_url: str,
    *,
    concurrency: int,
    grace: float | None = None,
    env: Mapping[str, str] | None = None,
    output: BinaryIO | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``python -m typedq worker TARGET --broker URL`` in the repository root.

    ``TYPEDQ_BROKER`` is removed from the child's environment, so only ``broker_url``
    counts.

    :param env: extra environment variables for the child (the test apps read theirs)
    :param output: an open file for the child's stdout and stderr (it keeps its own
        descriptor: the caller may close it at once); by default both are discarded
    """
    environ = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    environ.pop("TYPEDQ_BROKER", None)
    args = [sys.executable, "-m", "typedq", "worker", target]
    args += ["--concurrency", str(concurrency), "--broker", broker_url]
    if grace is not None:
        args += ["--grace", str(grace)]
    return subprocess.Popen(
        args,
        env=environ,
        cwd=ROOT,
        stdout=subprocess.DEVNULL if output is None else output,
        stderr=subprocess.DEVNULL if output is None else subprocess.STDOUT,
    )


def stop_workers(procs: Iterable[subprocess.Popen[bytes]], *, timeout: float = 10.0) -> None:
    """SIGTERM every live worker process, then SIGKILL any not gone within ``timeout``."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class In(msgspec.Struct, frozen=True):
    n: int


class Out(msgspec.Struct, frozen=True):
    n: int


class HeldTask:
    """A task ``work`` of ``app`` whose job ``In(0)`` runs until :attr:`release` is set
    (:attr:`long_started` tells it began); every other job returns at once. :attr:`started`
    lists the ``n`` of each job started, in order."""

    def __init__(self, app: App) -> None:
        self.started: list[int] = []
        self.long_started = anyio.Event()
        self.release = anyio.Event()

        @app.task
        async def work(x: In) -> Out:
            self.started.append(x.n)
            if x.n == 0:
                self.long_started.set()
                await self.release.wait()
            return Out(x.n)

        self.work = work


class PIn(pydantic.BaseModel):
    name: str
    qty: int


class POut(pydantic.BaseModel):
    label: str


class Big(msgspec.Struct):
    blob: str


class CardDeclined(msgspec.Struct, frozen=True):
    code: str


class OutOfStock(pydantic.BaseModel):
    sku: str


class Undeclared(msgspec.Struct, frozen=True):
    why: str


def msg(
    *,
    queue: str = "q",
    task: str = "t",
    payload: bytes = b"\xc0",
    job_id: str | None = None,
    priority: int = 0,
    delay: float = 0.0,
    eta: float = 0.0,
) -> JobMessage:
    """A raw envelope for broker-level tests (the broker never looks inside ``payload``)."""
    return JobMessage(
        id=job_id or new_job_id(),
        task=task,
        queue=queue,
        payload=payload,
        priority=priority,
        delay=delay,
        eta=eta,
    )


@contextlib.asynccontextmanager
async def connected(
    app_name: str,
    broker_url: str,
    *,
    lease: float = 30.0,
    max_stalls: int = 3,
    retention: Retention | None = None,
    max_queue_length: int = 0,
    deadline: float = TEST_DEADLINE,
) -> AsyncIterator[Broker]:
    """A connected broker of a fresh App, with the test body bounded in time
    (``deadline`` seconds)."""
    app = App(
        app_name,
        broker=broker_url,
        lease=lease,
        max_stalls=max_stalls,
        retention=retention,
        max_queue_length=max_queue_length,
    )
    with anyio.fail_after(deadline):
        async with app:
            yield app.broker


async def one(broker: Broker, job_id: str) -> JobRecord:
    """The job's record; fails the test if it is gone."""
    (record,) = await broker.get([job_id])
    assert record is not None, f"job {job_id} is gone"
    return record


async def claim_one(
    broker: Broker, queue: str = "q", *, lease: float = 30.0, worker_id: str = "w1"
) -> ClaimedJob:
    jobs = await broker.claim([queue], 1, worker_id=worker_id, lease=lease)
    assert len(jobs) == 1, f"expected one claimable job in {queue!r}, got {len(jobs)}"
    return jobs[0]


async def sleep_until(epoch: float, margin: float = 0.05) -> None:
    """Sleep until wall-clock ``epoch`` (plus a margin): for delays and ETAs that must pass."""
    await anyio.sleep(max(0.0, epoch - time.time()) + margin)


def count(counts: dict[JobState, int], state: JobState) -> int:
    return counts.get(state, 0)


def broker_methods() -> list[str]:
    """Every public method of the broker interface (:class:`Broker`, whose methods the
    capability protocols of typedq.broker.capabilities name too), sorted."""
    return sorted(
        name
        for name, value in inspect.getmembers(Broker)
        if not name.startswith("_") and callable(value)
    )


def _forwarder(name: str) -> Callable[..., Any]:
    """A method that calls the wrapped broker's ``name`` with the same arguments."""
    forward: Callable[..., Any]
    if inspect.iscoroutinefunction(getattr(Broker, name)):

        async def forward_async(self: FaultyBroker, *args: Any, **kwargs: Any) -> Any:
            return await getattr(self.inner, name)(*args, **kwargs)

        forward = forward_async
    else:

        def forward_sync(self: FaultyBroker, *args: Any, **kwargs: Any) -> Any:
            return getattr(self.inner, name)(*args, **kwargs)

        forward = forward_sync
    forward.__name__ = name
    forward.__qualname__ = f"FaultyBroker.{name}"
    forward.__doc__ = f"Forwarded to the wrapped broker's ``{name}``."
    return forward


class FaultyBroker(Broker):
    """Delegates to a real broker, with the faults a network brings, on demand.

    ``hold_renewals()`` blocks ``renew`` like a stalled link: a worker's renewals hang,
    its leases expire for real, and anyone may recover and claim its jobs through
    ``inner``; after ``resume()`` the held renewals reach the broker and learn the lease
    is gone. ``inject(op, times)`` makes the next calls of ``op`` raise
    BrokerUnavailable, either before reaching the broker (a lost request) or after it
    took effect (a lost reply: the ambiguous case a re-send must survive).

    It defines only the methods that have fault points (``claim``, ``renew``,
    ``complete``, ``fail``), ``close`` (which lets held renewals go) and
    ``complete_and_claim`` (a ``complete`` then a ``claim``, so their faults reach a
    worker's refill too); every other method of the interface is generated below as a
    plain forward to ``inner`` (tests/test_broker_seam.py checks each one).
    """

    def __init__(self, inner: Broker) -> None:
        self.inner = inner
        self.settings = inner.settings
        self._resume: anyio.Event | None = None
        self._faults: dict[str, tuple[int, bool]] = {}
        self.raised: Counter[str] = Counter()

    def inject(self, op: str, times: int = 1, *, after_applying: bool = False) -> None:
        self._faults[op] = (times, after_applying)

    def _fault(self, op: str, *, applied: bool) -> None:
        times, after_applying = self._faults.get(op, (0, False))
        if times > 0 and after_applying == applied:
            self._faults[op] = (times - 1, after_applying)
            self.raised[op] += 1
            where = "reply" if applied else "request"
            raise BrokerUnavailable(f"injected fault: the {op} {where} was lost")

    @classmethod
    def for_url(cls, url: str, app_name: str) -> FaultyBroker:
        return cls(broker_from_url(url, BrokerSettings(namespace=app_name)))

    def hold_renewals(self) -> None:
        self._resume = anyio.Event()

    def resume(self) -> None:
        if self._resume is not None:
            self._resume.set()
            self._resume = None

    async def close(self) -> None:
        self.resume()
        await self.inner.close()

    async def claim(
        self,
        queues: Sequence[str],
        limit: int,
        *,
        worker_id: str,
        lease: float,
        claim_id: str | None = None,
    ) -> list[ClaimedJob]:
        self._fault("claim", applied=False)
        claimed = await self.inner.claim(
            queues, limit, worker_id=worker_id, lease=lease, claim_id=claim_id
        )
        self._fault("claim", applied=True)
        return claimed

    async def renew(self, leases: Sequence[tuple[str, str]], lease: float) -> list[LeaseStatus]:
        if self._resume is not None:
            await self._resume.wait()
        self._fault("renew", applied=False)
        return await self.inner.renew(leases, lease)

    async def complete(self, items: Sequence[Completion]) -> list[FinishOutcome]:
        self._fault("complete", applied=False)
        outcomes = await self.inner.complete(items)
        self._fault("complete", applied=True)
        return outcomes

    # Broker's own: this fake's complete, then its claim (with their fault points).
    complete_and_claim = Broker.complete_and_claim

    async def fail(self, items: Sequence[Failure]) -> list[FinishOutcome]:
        self._fault("fail", applied=False)
        outcomes = await self.inner.fail(items)
        self._fault("fail", applied=True)
        return outcomes

    def __getattr__(self, name: str) -> Any:
        # Only for what is not in the broker interface (every interface method is a
        # method of this class): a backend's own helpers, e.g. MemoryBroker.wake.
        return getattr(self.inner, name)


# Every interface method the fake does not define forwards to the wrapped broker, so
# the fake keeps up with a growing interface without restating it.
for _name in broker_methods():
    if _name not in vars(FaultyBroker):
        setattr(FaultyBroker, _name, _forwarder(_name))
abc.update_abstractmethods(FaultyBroker)  # type: ignore[type-abstract]  # now concrete
