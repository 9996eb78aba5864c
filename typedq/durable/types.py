"""The typed names of durable runs that are not the replay engine: signals and the errors.

``Signal("approval", Approval)`` is a ``Signal[Approval]``: a named, typed channel into a
run. ``run.wait_for(approval)`` returns an ``Approval``; whoever delivers one encodes it
with :meth:`Signal.encode`, which accepts only an ``Approval`` (the future
``RunHandle.send`` takes a ``Signal[T]`` and a ``T`` the same way).
"""

from __future__ import annotations

import inspect
import typing
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec
import pydantic

from ..errors import ConfigError, TypedqError
from ..names import check_name
from ..serde import Codec, codec_for, is_model_type

__all__ = ["NonDeterministic", "RunTimeout", "Signal", "durable_types", "known_signals"]

#: A signal's payload: a model, as task inputs are.
TPayload = TypeVar("TPayload", bound=msgspec.Struct | pydantic.BaseModel)


class Signal(Generic[TPayload]):
    """A typed channel into durable runs: a name, and the model of its payloads.

    :param name: the signal's name, as the run's log records it (``[A-Za-z0-9_.-]``)
    :param model: the payload's model (a msgspec Struct or a Pydantic model)
    """

    def __init__(self, name: str, model: type[TPayload]) -> None:
        self.name = check_name("signal", name)
        self.model = model
        self.codec: Codec[TPayload] = codec_for(model)
        _signals.add(self)

    def __repr__(self) -> str:
        return f"Signal({self.name!r}, {self.codec.name})"

    def encode(self, payload: TPayload) -> bytes:
        """The payload as the log records it (validated against the model)."""
        return self.codec.encode(payload)

    def decode(self, data: bytes) -> TPayload:
        """A recorded payload, validated back into the model."""
        return self.codec.decode(data)


#: Every Signal this process has created (module-level ones live as long as their module):
#: what tools such as the dashboard offer typed forms for.
_signals: weakref.WeakSet[Signal[Any]] = weakref.WeakSet()


def known_signals() -> dict[str, Signal[Any]]:
    """The signals this process has defined, by name (those of the imported modules).

    A name defined twice with different models is left out: a tool cannot tell which
    model a run of it waits for.
    """
    by_name: dict[str, list[Signal[Any]]] = {}
    for signal in list(_signals):
        by_name.setdefault(signal.name, []).append(signal)
    return {
        name: found[0]
        for name, found in sorted(by_name.items())
        if len({s.model for s in found}) == 1
    }


class RunTimeout(TypedqError, TimeoutError):
    """``run.wait_for(signal, timeout=...)`` ran out before the signal arrived.

    Raised inside the run's function, where it can be caught; the log records the
    timeout, so every replay raises it at the same point.
    """

    def __init__(self, run_id: str, signal: str, deadline: float | None) -> None:
        super().__init__(f"run {run_id}: no signal {signal!r} arrived by its deadline {deadline}")
        self.run_id = run_id
        self.signal = signal
        self.deadline = deadline


class NonDeterministic(TypedqError):
    """A replay asked for something else than the run's log records at that point.

    The message names both, on one line: the call the code makes now and the entry the log
    holds. The usual cause is a code change deployed under running runs; guard such
    changes with ``run.patched("id")``.
    """

    def __init__(self, run_id: str, position: int, wanted: str, recorded: str) -> None:
        super().__init__(
            f"run {run_id} diverged from its log at call #{position}: the code asks for "
            f"{wanted} but the log records {recorded}"
        )
        self.run_id = run_id
        self.position = position
        self.wanted = wanted
        self.recorded = recorded


def durable_types(fn: Callable[..., Any]) -> tuple[type[Any], type[Any]]:
    """The (input, output) models of ``async def f(run: Run, inp: TIn) -> TOut``."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"durable function {where} must be an async def")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigError(f"cannot resolve the annotations of durable {where}: {exc}") from exc
    params = list(inspect.signature(fn).parameters.values())
    if len(params) != 2:
        raise ConfigError(f"durable function {where} must take (run: Run, inp: Model)")
    input_type = hints.get(params[1].name)
    if not is_model_type(input_type):
        raise ConfigError(
            f"durable function {where}: its input {params[1].name!r} must be annotated with "
            "a msgspec.Struct or pydantic.BaseModel subclass"
        )
    output_type: Any = hints.get("return", type(None))
    if output_type is None:
        output_type = type(None)
    if output_type is not type(None) and not is_model_type(output_type):
        raise ConfigError(f"durable function {where} must return a model or None")
    return typing.cast(type[Any], input_type), output_type
