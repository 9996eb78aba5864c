"""The job context: what a handler may ask about the job it runs.

A handler receives it when it declares a second parameter::

    @app.task
    async def resize(image: Image, ctx: JobContext) -> Thumb:
        await ctx.progress({"done": 0.5})
        pool = ctx.get(db)          # a resource the worker opened (typedq.resources)
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Generic, Never, Protocol

import anyio
import anyio.from_thread
import msgspec
import pydantic
from typing_extensions import TypeVar

from .errors import ConfigError
from .resources import Resource, ResourceError, Resources, current_resources

__all__ = ["JobContext"]

T = TypeVar("T")
#: What the job's task emits (``@app.task(emits=Token)``: ``JobContext[Token]``). A bare
#: ``JobContext`` is ``JobContext[Never]``: its ``emit`` takes nothing, so mypy refuses
#: an emit from a handler that did not declare what it emits.
TEmit_contra = TypeVar(
    "TEmit_contra",
    bound=msgspec.Struct | pydantic.BaseModel,
    contravariant=True,
    default=Never,
)


class _Emits(Protocol):
    async def emit(self, item: Any, /) -> None: ...


_encode = msgspec.msgpack.Encoder().encode


class JobContext(Generic[TEmit_contra]):
    """Facts about the running job, progress reporting and cooperative cancellation.

    Generic in what the task emits (``ctx: JobContext[Token]`` in a handler of
    ``@app.task(emits=Token)``: :meth:`emit`, docs/streams.md).

    :ivar job_id: the job's id
    :ivar task: the task's name
    :ivar queue: the queue it came from
    :ivar attempt: 1 for the first run, 2 for the first retry, ...
    :ivar enqueued_at: when it was enqueued (broker clock, epoch seconds)
    :ivar worker_id: the worker running it (``"local"`` when the task is called directly)
    :ivar scheduled_for: the tick (epoch seconds, broker clock) of the schedule that
        enqueued the job (``app.schedule``), or None for a job not made by a schedule

    :param resources: the opened resources :meth:`get` reads; by default those of the
        worker running this code (none outside a worker)
    """

    __slots__ = (
        "_emitter",
        "_report",
        "_resources",
        "attempt",
        "enqueued_at",
        "job_id",
        "last_progress",
        "queue",
        "scheduled_for",
        "task",
        "worker_id",
    )

    def __init__(
        self,
        *,
        job_id: str,
        task: str,
        queue: str,
        attempt: int,
        enqueued_at: float,
        worker_id: str = "local",
        report: Callable[[bytes], Coroutine[Any, Any, None]] | None = None,
        resources: Resources | None = None,
        scheduled_for: float | None = None,
        emitter: _Emits | None = None,
    ) -> None:
        self.job_id = job_id
        self.task = task
        self.queue = queue
        self.attempt = attempt
        self.enqueued_at = enqueued_at
        self.worker_id = worker_id
        self.scheduled_for = scheduled_for
        self.last_progress: Any = None
        self._report = report
        self._emitter = emitter
        # Captured now, in the task that runs the attempt: a sync handler's thread then
        # reads the same resources without needing the worker's context.
        self._resources = resources if resources is not None else current_resources()

    def get(self, resource: Resource[T]) -> T:
        """The value of a resource the worker opened: ``pool = ctx.get(db)`` (typed by
        the handle ``@app.resource`` returned). Works in sync handlers too.

        :raises ResourceError: outside a worker (a direct call: pass a context made by
            ``typedq.testing.job_context(provide(db, fake))``), or a resource the
            worker's app does not have
        """
        if self._resources is None:
            raise ResourceError(
                f"resource {resource.name!r} is not open: job {self.job_id!r} "
                f"({self.task}) does not run in a worker, and resources are opened by "
                "workers (typedq worker, app.worker(), typedq.testing.run_worker); in a "
                "direct call pass a context with a test double: await "
                f"{self.task}(payload, typedq.testing.job_context(typedq.testing.provide("
                f"{resource.name}, value)))"
            )
        return self._resources.get(resource)

    async def progress(self, value: Any) -> None:
        """Record progress (any msgpack-serializable value); readable with ``Job.info()``."""
        self.last_progress = value
        if self._report is not None:
            await self._report(_encode(value))

    def report_progress(self, value: Any) -> None:
        """``progress`` for sync handlers running in a worker thread."""
        self.last_progress = value
        if self._report is not None:
            anyio.from_thread.run(self._report, _encode(value))

    async def emit(self, item: TEmit_contra) -> None:
        """Add ``item`` to the job's stream (``job.stream()`` at the producer), in order.

        Returns at once (the worker sends items in batches), unless 5,000 items are
        still unsent: then it waits for room (back-pressure). Items a run emitted are
        stored before its job settles.

        :raises TypeError: ``item`` is not an instance of the task's ``emits`` model
        :raises ConfigError: the task declares no ``emits=``
        """
        if self._emitter is None:
            raise self._no_stream()
        await self._emitter.emit(item)

    def emit_sync(self, item: TEmit_contra) -> None:
        """``emit`` for sync handlers running in a worker thread."""
        if self._emitter is None:
            raise self._no_stream()
        anyio.from_thread.run(self._emitter.emit, item)

    def _no_stream(self) -> ConfigError:
        return ConfigError(
            f"task {self.task!r} called ctx.emit but declares no stream: register it with "
            "@app.task(emits=Model) (and annotate the context JobContext[Model])"
        )

    @staticmethod
    def check_cancelled() -> None:
        """In a sync handler: raise if the attempt was cancelled, timed out, lost its
        lease or is being shut down.

        Threads cannot be interrupted, so long sync handlers call this between steps.
        A handler that does not is still bounded: its timeout ends the attempt (the
        thread runs on, holding its slot, and its result is discarded), and shutdown
        abandons it after a bounded wait. Does nothing outside a worker thread.
        """
        try:
            anyio.from_thread.check_cancelled()
        except RuntimeError:
            return  # not in a worker thread: nothing to check
