"""Reading a handler's signature: its input and output models, and whether it takes a
:class:`~typedq.context.JobContext`, checked when ``@app.task`` registers it."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .serde import is_input_type, is_model_type, optional_model

__all__ = ["count_params", "handler_types"]


def count_params(fn: Callable[..., Any]) -> int:
    """How many positional parameters ``fn`` takes (a handler: 1, or 2 with a context)."""
    return len(
        [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    )


def handler_types(fn: Callable[..., Any]) -> tuple[type[Any], type[Any]]:
    """The (input, output) model types from a handler's annotations, checked."""
    where = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ConfigError(f"cannot resolve the annotations of handler {where}: {exc}") from exc
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if not 1 <= len(params) <= 2:
        raise ConfigError(
            f"handler {where} must take the input model, and optionally a JobContext: "
            f"it takes {len(params)} positional parameters"
        )
    input_type = hints.get(params[0].name)
    if not is_input_type(input_type):
        raise ConfigError(
            f"handler {where}: parameter {params[0].name!r} is annotated {input_type!r}, "
            "but must be a msgspec.Struct or pydantic.BaseModel subclass, or a list of one "
            "(list[Model], or list[Ok[Model] | Failed] for a collecting fan-in)"
        )
    if "return" not in hints:
        raise ConfigError(f"handler {where} needs a return annotation (a model, or None)")
    output_type: Any = hints["return"]
    if output_type is None:
        output_type = type(None)
    if not (
        output_type is type(None)
        or is_model_type(output_type)
        or optional_model(output_type) is not None
    ):
        raise ConfigError(
            f"handler {where} returns {output_type!r}; it must return a msgspec.Struct or "
            "pydantic.BaseModel subclass, None, or Model | None"
        )
    assert input_type is not None
    return input_type, output_type
