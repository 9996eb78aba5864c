"""Resources: what a worker opens once at start and its handlers share, typed.

A resource is an async generator (or a function returning an async context manager)
registered with ``@app.resource``; the decorator returns a typed handle, and handlers
read the opened value through their job context::

    @app.resource
    async def db() -> AsyncIterator[Pool]:
        pool = await create_pool(DSN)
        try:
            yield pool                  # the value handlers get
        finally:
            await pool.close()          # runs at worker shutdown

    @app.task
    async def charge(order: Order, ctx: JobContext) -> Receipt:
        pool = ctx.get(db)              # mypy: Pool

A worker opens its app's resources in registration order before it claims any job and
closes them in reverse order after its in-flight jobs have settled. A factory may take
one parameter, the resources opened before it, to build on them
(``async def repo(opened: Resources)`` reads ``opened.get(db)``). A resource that fails
to open stops the worker from starting (:class:`ResourceError`). Tests replace a
resource with a double: ``typedq.testing.run_worker(app, resources=[provide(db, fake)])``
in a worker, ``typedq.testing.job_context(provide(db, fake))`` in a direct call.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import anyio

from .errors import ConfigError, TypedqError

__all__ = [
    "Provided",
    "Resource",
    "ResourceError",
    "Resources",
    "current_resources",
    "open_resources",
    "provide",
]

log = logging.getLogger("typedq.resources")

T = TypeVar("T")

#: Seconds each resource may take to close at shutdown before the worker moves on.
CLOSE_TIMEOUT = 30.0


class ResourceError(TypedqError):
    """A resource could not be opened, or was asked for where it is not open."""


class Resource(Generic[T]):
    """A typed handle on a resource registered with ``@app.resource``.

    Handlers pass it to :meth:`~typedq.JobContext.get` and get the opened value, typed
    ``T``. Handles compare by identity.

    :ivar name: the resource's name (its factory's ``__name__``)
    :ivar app: the name of the app it is registered on
    """

    __slots__ = ("_factory", "_takes_opened", "app", "name")

    def __init__(self, factory: Callable[..., Any], *, name: str, app: str) -> None:
        self._factory = factory
        self._takes_opened = _required_params(factory) == 1
        self.name = name
        self.app = app

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, app={self.app!r})"

    def _open(self, opened: Resources) -> contextlib.AbstractAsyncContextManager[T]:
        """A context manager that opens the resource; its value is what handlers get.

        :param opened: the resources opened before this one (for a factory that takes them)
        """
        args = (opened,) if self._takes_opened else ()
        if inspect.isasyncgenfunction(self._factory):
            return contextlib.asynccontextmanager(self._factory)(*args)
        manager = self._factory(*args)
        if not (hasattr(manager, "__aenter__") and hasattr(manager, "__aexit__")):
            raise ResourceError(
                f"resource {self.name!r}: its factory returned {type(manager).__qualname__}, "
                "not an async context manager; make it an async generator that yields the "
                "value, or decorate it with @contextlib.asynccontextmanager"
            )
        return cast(contextlib.AbstractAsyncContextManager[T], manager)


def _required_params(fn: Callable[..., Any]) -> int:
    """How many parameters a call must pass (-1 when one must be passed by keyword)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0  # a builtin or C callable: assume it takes nothing, as declared
    required = [p for p in parameters if p.default is p.empty]
    if any(p.kind is p.KEYWORD_ONLY for p in required):
        return -1
    return len([p for p in required if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)])


def _takes_resources(fn: Callable[..., Any]) -> bool:
    """Whether a factory's one parameter is (or may be: unannotated) the opened Resources."""
    first = next(iter(inspect.signature(fn).parameters.values()))
    annotation = first.annotation
    if isinstance(annotation, str):  # `from __future__ import annotations`
        return annotation.rpartition(".")[2] == "Resources"
    return annotation is first.empty or annotation is Resources


def check_factory(fn: Callable[..., Any]) -> str:
    """Check a resource factory at registration; returns its name.

    :raises ConfigError: not callable with no argument or with the opened resources alone,
        or a coroutine function (which could open the resource but never close it)
    """
    if not callable(fn):
        raise ConfigError(f"@app.resource decorates a function, got {fn!r}")
    # A functools.partial has no __name__: name it after the function it wraps.
    name: str = (
        getattr(fn, "__name__", None)
        or getattr(getattr(fn, "func", fn), "__name__", None)
        or repr(fn)
    )
    required = _required_params(fn)
    if required not in (0, 1) or (required == 1 and not _takes_resources(fn)):
        params = ", ".join(inspect.signature(fn).parameters)
        raise ConfigError(
            f"resource {name!r} takes parameters ({params}); a resource factory takes none, "
            "or one: the resources opened before it (opened: Resources)"
        )
    if inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"resource {name!r} is an async function that returns its value, so it could "
            "never be closed; make it yield the value (an async generator) and close it "
            "after the yield"
        )
    return name


@dataclass(frozen=True)
class Provided(Generic[T]):
    """A value standing in for a resource (a test double); made by :func:`provide`."""

    resource: Resource[T]
    value: T


def provide(resource: Resource[T], value: T) -> Provided[T]:
    """Use ``value`` for ``resource`` instead of opening it: a test double, typed by the
    resource (``provide(db, "not a pool")`` is a mypy error)."""
    return Provided(resource, value)


class Resources:
    """The opened resources of a worker (or the doubles of a test), by handle.

    :param values: each resource's opened value
    :param where: what opened them, for error messages (``"worker host.1.ab12cd"``)
    """

    __slots__ = ("_values", "where")

    def __init__(self, values: Mapping[Resource[Any], Any], *, where: str) -> None:
        self._values = dict(values)
        self.where = where

    @classmethod
    def of(cls, provided: Iterable[Provided[Any]], *, where: str) -> Resources:
        """The given doubles as a set of opened resources."""
        return cls({p.resource: p.value for p in provided}, where=where)

    def __contains__(self, resource: object) -> bool:
        return resource in self._values

    def get(self, resource: Resource[T]) -> T:
        """The opened value of ``resource``.

        :raises ResourceError: it is not open here (registered on another app, or not
            given to a test)
        """
        try:
            return cast(T, self._values[resource])
        except KeyError:
            opened = ", ".join(sorted(r.name for r in self._values)) or "none"
            raise ResourceError(
                f"resource {resource.name!r} (app {resource.app!r}) is not open in "
                f"{self.where} (open: {opened}); register it on the app this worker runs "
                "(@app.resource) before the resources that use it, or give a test double "
                "with typedq.testing.provide"
            ) from None


# The resources of the worker whose code runs in this context. A worker sets it for the
# tasks it spawns, so the job context built for each attempt (by the executor, in that
# worker's task tree) finds them without being handed them, and a direct call outside any
# worker finds none.
_current: ContextVar[Resources | None] = ContextVar("typedq_resources", default=None)


def current_resources() -> Resources | None:
    """The resources of the worker running this code, or ``None`` outside a worker."""
    return _current.get()


@contextlib.asynccontextmanager
async def open_resources(
    resources: Sequence[Resource[Any]],
    provided: Mapping[Resource[Any], Any],
    *,
    where: str,
    abort: anyio.CancelScope | None = None,
) -> AsyncIterator[Resources]:
    """Open ``resources`` in order (those in ``provided`` are not opened: their given
    value is used), make them current for the block, close them in reverse order.

    Closing is shielded from cancellation (a worker shuts down while cancelled) and
    bounded by :data:`CLOSE_TIMEOUT` per resource; an error while closing is logged, and
    the other resources are still closed.

    :param abort: a scope whose cancellation stops the opening (a worker stopped while a
        resource hangs opening); it is entered only while opening
    :raises ResourceError: a resource failed to open, or ``abort`` stopped the opening
        (either way those opened before it are closed)
    """
    values: dict[Resource[Any], Any] = dict(provided)
    opened: list[tuple[Resource[Any], contextlib.AbstractAsyncContextManager[Any]]] = []
    try:
        pending = [r for r in resources if r not in values]
        if pending:
            log.info("%s: opening resources %s", where, ", ".join(r.name for r in pending))
        with abort or anyio.CancelScope() as scope:
            for resource in pending:
                try:
                    before = Resources(values, where=f"{where}, while opening {resource.name!r}")
                    manager = resource._open(before)
                    values[resource] = await manager.__aenter__()
                except ResourceError:
                    raise
                except Exception as exc:
                    raise ResourceError(
                        f"could not open resource {resource.name!r}: {_describe(exc)}"
                    ) from exc
                opened.append((resource, manager))
        if scope.cancelled_caught:
            stuck = pending[len(opened)].name
            raise ResourceError(f"{where} was stopped while resource {stuck!r} was opening")
        if opened:
            log.info("%s: opened resources %s", where, ", ".join(r.name for r, _ in opened))
        current = Resources(values, where=where)
        token = _current.set(current)
        try:
            yield current
        finally:
            _current.reset(token)
    finally:
        for resource, manager in reversed(opened):
            await _close(resource, manager, where)


def _describe(exc: BaseException) -> str:
    """``Type: message`` on one line; a group of one error is described by that error."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _close(
    resource: Resource[Any], manager: contextlib.AbstractAsyncContextManager[Any], where: str
) -> None:
    with anyio.move_on_after(CLOSE_TIMEOUT, shield=True) as scope:
        try:
            await manager.__aexit__(None, None, None)
        except Exception as exc:
            log.warning(
                "%s: resource %r raised while closing: %s", where, resource.name, _describe(exc)
            )
    if scope.cancelled_caught:
        log.warning(
            "%s: resource %r did not close within %.0fs; moving on",
            where,
            resource.name,
            CLOSE_TIMEOUT,
        )
