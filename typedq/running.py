"""A claimed job this worker runs (:class:`Running`): its claim, the cancel scope its
handler runs in, why it was cancelled, and its handler thread (a sync handler), which may
outlive the attempt. The worker's table of running jobs (:mod:`typedq.worker.jobs`) holds
one per job; :class:`typedq.execution.Executor` runs it."""

from __future__ import annotations

from typing import Any, Literal

import anyio

from .broker.base import ClaimedJob
from .streams import Emitter

__all__ = ["CancelReason", "Running"]

#: Why a running job's scope was cancelled: ``job.cancel()``, a lost lease, or shutdown.
CancelReason = Literal["cancel", "lease_lost", "shutdown"]


class Running:
    """A claimed job this worker runs: its claim, cancel scope, and why it was cancelled.

    It also tracks the attempt's handler thread (sync handlers): ``thread_alive`` stays
    True until the thread really returns, however long after the attempt ended, so the
    worker can count the thread against its concurrency. ``lost`` is set once the broker
    said the lease is gone: only then does the worker stop renewing it.
    """

    __slots__ = (
        "_wake",
        "abandoned",
        "cancel_reason",
        "claimed",
        "emitter",
        "in_handler",
        "lost",
        "scope",
        "thread_alive",
        "thread_result",
    )

    def __init__(self, claimed: ClaimedJob) -> None:
        self.claimed = claimed
        #: The cancel scope its handler runs in, while it runs (None before and after:
        #: a runner's scope goes on to its next job, see :class:`HandlerScope`).
        self.scope: anyio.CancelScope | None = None
        self.cancel_reason: CancelReason | None = None
        #: True while an async handler runs (it can be stopped by cancelling its scope).
        self.in_handler = False
        self.lost = False
        self.abandoned = False
        self.thread_alive = False
        #: What the thread did: (True, value) or (False, exception); None while it runs.
        self.thread_result: tuple[bool, Any] | None = None
        self._wake: anyio.Event | None = None
        #: The attempt's stream emitter (a task with ``emits=``), else None.
        self.emitter: Emitter | None = None

    def cancel(self, reason: CancelReason) -> None:
        """Cancel the attempt's scope (the first reason given is the one that counts)."""
        if self.cancel_reason is None:
            self.cancel_reason = reason
        if self.scope is not None:
            self.scope.cancel()

    def mark_lost(self) -> None:
        """The broker says the lease is gone: stop, write nothing, stop renewing."""
        self.lost = True
        self.cancel("lease_lost")
        self._set_wake()

    def abandon(self) -> None:
        """Shutdown stops waiting for this attempt's thread (it may run on)."""
        self.abandoned = True
        self._set_wake()

    def thread_started(self) -> None:
        self.thread_alive = True
        self.thread_result = None
        self._wake = anyio.Event()

    def thread_skipped(self) -> None:
        """The attempt was cancelled before its thread started the handler."""
        self.thread_alive = False
        self._set_wake()

    def thread_exited(self, result: tuple[bool, Any]) -> None:
        """Called in the event loop once the handler thread has returned."""
        self.thread_alive = False
        self.thread_result = result
        self._set_wake()

    def _set_wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def wait_thread(self) -> None:
        """Until the thread returns, the lease is lost, or shutdown gives up on it."""
        if self._wake is not None and self.thread_alive and not (self.lost or self.abandoned):
            await self._wake.wait()
