"""Upcasting: a job of an older input schema turned into the task's current model.

``@task.upcast(FINGERPRINT)`` registers a plain function from the old payload to the
task's current input model; a worker applies it to every job whose envelope carries
that fingerprint (before decoding with the current model), so a breaking change of a
model need not fail the jobs already enqueued, or those producers still deploying the
old release send, with ``schema_mismatch``::

    @place.upcast("8c1f0e5a2b7d4c39")           # the fingerprint `typedq verify` shows
    def from_v1(old: OrderV1) -> Order:          # or (old: dict[str, Any]) for raw data
        return Order(order_id=old.order_id, amount_cents=old.amount * 100)

The old payload is decoded with the function's parameter type: an old model (its
fingerprint must be the one given: a typo is caught at import) or ``dict`` (the raw
msgpack map, no validation). The function must return an instance of the task's input
model; a payload the old model rejects, a function that raises or returns anything
else fails the job with ``schema_mismatch``, naming the upcaster. ``typedq verify``
counts a fingerprint with an upcaster as compatible when the registry's schema of it
fits the upcaster's model.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import msgspec

from .errors import ConfigError, InvalidPayload
from .serde import Codec, codec_for, is_model_type

__all__ = ["Upcaster"]

T = TypeVar("T")

_FINGERPRINT = re.compile(r"[0-9a-f]{16}")
_any_decoder = msgspec.msgpack.Decoder()


class Upcaster(Generic[T]):
    """One registered upcast: from payloads of ``fingerprint`` to the model of ``target``.

    :raises ConfigError: a malformed fingerprint, the current one, an async function, a
        parameter that is neither a model nor a dict, or a model of another fingerprint
    """

    def __init__(self, fingerprint: str, fn: Callable[[Any], T], target: Codec[T]) -> None:
        where = f"upcaster {getattr(fn, '__qualname__', fn)!r}"
        if not _FINGERPRINT.fullmatch(fingerprint):
            raise ConfigError(
                f"{where}: {fingerprint!r} is not a schema fingerprint (16 hex digits, as "
                "`typedq verify` shows)"
            )
        if fingerprint == target.fingerprint:
            raise ConfigError(f"{where}: {fingerprint} is the task's current input schema")
        if not is_model_type(target.type):
            raise ConfigError(f"{where}: only a task whose input is one model can upcast")
        if inspect.iscoroutinefunction(fn):
            raise ConfigError(f"{where}: must be a plain def (it runs as the job is decoded)")
        params = list(inspect.signature(fn).parameters.values())
        if len(params) != 1:
            raise ConfigError(f"{where}: must take one parameter, the old payload")
        try:
            hints = typing.get_type_hints(fn)
        except Exception as exc:
            raise ConfigError(f"{where}: cannot resolve its annotations: {exc}") from exc
        old_type = hints.get(params[0].name, Any)
        self.fingerprint = fingerprint
        self.fn = fn
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.target = target
        #: The old model's codec; None for a function of the raw dict.
        self.old: Codec[Any] | None = None
        if is_model_type(old_type):
            self.old = codec_for(old_type)
            if self.old.fingerprint != fingerprint:
                raise ConfigError(
                    f"{where}: its parameter's model {self.old.name} has fingerprint "
                    f"{self.old.fingerprint}, not {fingerprint}; annotate it with the model "
                    "of that schema (or dict[str, Any])"
                )
        elif not (
            old_type is Any or old_type is dict or typing.get_origin(old_type) in (dict, Mapping)
        ):
            raise ConfigError(
                f"{where}: its parameter must be annotated with the old model or "
                f"dict[str, Any], not {old_type!r}"
            )

    def apply(self, payload: bytes) -> T:
        """The current model's value of an old ``payload``.

        :raises InvalidPayload: the old model rejects it, it is not a map, the function
            raised, or it returned anything but the current model
        """
        if self.old is not None:
            old: Any = self.old.decode(payload)
        else:
            try:
                old = _any_decoder.decode(payload)
            except msgspec.DecodeError as exc:
                raise InvalidPayload(f"not msgpack: {exc}") from None
            if not isinstance(old, dict):
                raise InvalidPayload(f"expected a map, got {type(old).__name__}")
        try:
            value = self.fn(old)
        except Exception as exc:
            raise InvalidPayload(f"{self.name} raised {type(exc).__name__}: {exc}") from exc
        model = self.target.type
        if not isinstance(value, model):
            raise InvalidPayload(
                f"{self.name} returned {type(value).__qualname__}, not {self.target.name}"
            )
        return value
