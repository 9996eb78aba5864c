"""Typed (de)serialization of payloads and results: msgpack via msgspec.

A :class:`Codec` is keyed on its target type, like ``msgspec.msgpack.Decoder[T]`` or
``pydantic.TypeAdapter[T]``: ``codec_for(SendInvoice).decode(data)`` returns a
validated ``SendInvoice``. Both msgspec Structs and Pydantic models are supported,
and ``None`` for tasks that return nothing. This module knows no transport.
"""

from __future__ import annotations

import hashlib
import json
import types
import typing
from collections.abc import Iterable
from functools import cached_property
from typing import Any, Generic, TypeAlias, TypeVar, cast

import msgspec
import pydantic

from .errors import ConfigError, EncodeError, InvalidPayload, PayloadTooLarge

__all__ = [
    "Codec",
    "Model",
    "codec_for",
    "is_input_type",
    "is_model_type",
    "list_item",
    "optional_model",
]

#: What may cross the queue as a task's input (and, or ``None``, its output).
Model: TypeAlias = msgspec.Struct | pydantic.BaseModel

T = TypeVar("T")

_encoder = msgspec.msgpack.Encoder()
_any_decoder = msgspec.msgpack.Decoder()
_NONE = _encoder.encode(None)


def is_model_type(tp: object) -> bool:
    """True for a msgspec Struct or Pydantic model class."""
    return isinstance(tp, type) and issubclass(tp, msgspec.Struct | pydantic.BaseModel)


def optional_model(tp: object) -> type[Any] | None:
    """The model of ``Model | None`` (or ``Optional[Model]``), else ``None``."""
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return None
    args = typing.get_args(tp)
    models = [a for a in args if a is not type(None)]
    if len(args) == 2 and len(models) == 1 and is_model_type(models[0]):
        return cast(type[Any], models[0])
    return None


def list_item(tp: object) -> tuple[type[Any], bool] | None:
    """For ``list[M]``: ``(M, False)``; for ``list[Ok[M] | Failed]`` (a collecting fan-in's
    input, :mod:`typedq.fanin`): ``(M, True)``; anything else: ``None``."""
    if typing.get_origin(tp) is not list:
        return None
    (arg,) = typing.get_args(tp) or (None,)
    if is_model_type(arg):
        return cast(type[Any], arg), False
    from .fanin import Failed, Ok

    if typing.get_origin(arg) in (typing.Union, types.UnionType):
        members = typing.get_args(arg)
        oks = [m for m in members if typing.get_origin(m) is Ok]
        if len(members) == 2 and Failed in members and len(oks) == 1:
            (inner,) = typing.get_args(oks[0])
            if is_model_type(inner):
                return cast(type[Any], inner), True
    return None


def is_input_type(tp: object) -> bool:
    """What a task may take: a model, ``list[Model]`` or ``list[Ok[Model] | Failed]``."""
    return is_model_type(tp) or list_item(tp) is not None


_raw_list = msgspec.msgpack.Decoder(list[msgspec.Raw])
_raw_outcomes = msgspec.msgpack.Decoder(list[tuple[str, msgspec.Raw]])


class Codec(Generic[T]):
    """Encodes values of one model type to msgpack bytes and validates them back.

    The type may also be ``list[Model]`` (a msgpack array of the model's encodings) or
    ``list[Ok[Model] | Failed]`` (elements ``["ok", model]`` / ``["failed", record]``).
    """

    # Slots for what encode and decode read (per job, on both sides): once a cached
    # property (json_schema, fingerprint) is stored in an instance's __dict__, reading
    # the attributes kept there costs about three times as much. The __dict__ stays,
    # for the cached properties.
    __slots__ = (
        "__dict__",
        "_decoder",
        "_is_none",
        "_is_pydantic",
        "_items",
        "_model",
        "_optional",
        "_outcomes",
        "max_bytes",
        "type",
    )

    def __init__(self, tp: type[T], *, max_bytes: int | None = None) -> None:
        self.type = tp
        self.max_bytes = max_bytes
        item = list_item(tp)
        #: For a list type: the codec of its items' model, and whether items are outcomes.
        self._items: Codec[Any] | None = None if item is None else codec_for(item[0])
        self._outcomes = item is not None and item[1]
        if item is not None:
            tp = cast(type[T], item[0])
        self._is_none = tp is type(None)
        # `Model | None`: None travels as msgpack nil, anything else as the model.
        inner = optional_model(tp)
        self._optional = inner is not None
        self._model: type[Any] = inner if inner is not None else tp
        self._is_pydantic = is_model_type(self._model) and issubclass(
            self._model, pydantic.BaseModel
        )
        if not (self._is_none or is_model_type(self._model)):
            raise ConfigError(
                f"{tp!r} is not a model: task inputs and outputs must be msgspec.Struct or "
                "pydantic.BaseModel subclasses (outputs may also be None or Model | None)"
            )
        self._decoder: msgspec.msgpack.Decoder[Any] | None = (
            None if self._is_pydantic or self._is_none else msgspec.msgpack.Decoder(self._model)
        )

    @property
    def name(self) -> str:
        """The model's qualified name, as shown in errors and schemas."""
        if self._is_none:
            return "None"
        name = f"{self._model.__module__}.{self._model.__qualname__}"
        if self._items is not None:
            return f"list[Ok[{name}] | Failed]" if self._outcomes else f"list[{name}]"
        return f"{name} | None" if self._optional else name

    def encode(self, value: T) -> bytes:
        """Serialize ``value``; raise EncodeError or PayloadTooLarge naming what is wrong."""
        if self._items is not None:
            return self._encode_list(value)
        if self._is_none or (self._optional and value is None):
            if value is not None:
                raise EncodeError(f"expected None, got {type(value).__qualname__}")
            return _NONE
        if not isinstance(value, self._model):
            raise EncodeError(
                f"expected an instance of {self._model.__qualname__}, got {type(value).__qualname__}"
            )
        try:
            if self._is_pydantic:
                # python mode keeps bytes, datetimes and Decimals as themselves; msgpack
                # carries bytes natively and datetimes as its timestamp extension.
                data = _encoder.encode(cast(pydantic.BaseModel, value).model_dump(mode="python"))
            else:
                data = _encoder.encode(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"cannot encode {self._model.__qualname__}: {exc}") from exc
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise PayloadTooLarge(len(data), self.max_bytes, f"{self._model.__qualname__} payload")
        return data

    def encode_many(self, values: Iterable[T]) -> list[bytes]:
        """:meth:`encode` of each of ``values``, in order (the first bad one raises), in one
        tight loop for a msgspec Struct model (the usual bulk enqueue)."""
        if self._items is not None or self._is_none or self._optional or self._is_pydantic:
            return [self.encode(value) for value in values]
        model, encode, limit = self._model, _encoder.encode, self.max_bytes
        out: list[bytes] = []
        append = out.append
        for value in values:
            if not isinstance(value, model):
                raise EncodeError(
                    f"expected an instance of {model.__qualname__}, got {type(value).__qualname__}"
                )
            try:
                data = encode(value)
            except (TypeError, ValueError, OverflowError) as exc:
                raise EncodeError(f"cannot encode {model.__qualname__}: {exc}") from exc
            if limit is not None and len(data) > limit:
                raise PayloadTooLarge(len(data), limit, f"{model.__qualname__} payload")
            append(data)
        return out

    def decode(self, data: bytes) -> T:
        """Validate ``data`` into the model; raise InvalidPayload naming the bad field."""
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise PayloadTooLarge(len(data), self.max_bytes, f"{self._model.__qualname__} payload")
        if self._items is not None:
            return self._decode_list(data)
        if self._optional and data == _NONE:
            return cast(T, None)
        try:
            if self._decoder is not None:
                # Annotated, not cast(): cast is a call per job on the hot path.
                value: T = self._decoder.decode(data)
                return value
            raw = _any_decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise InvalidPayload(f"{self._model.__qualname__}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise InvalidPayload(f"{self._model.__qualname__}: not msgpack: {exc}") from None
        if self._is_none:
            if raw is not None:
                raise InvalidPayload(f"expected nil, got {type(raw).__name__}")
            return cast(T, None)
        try:
            return cast(T, cast(type[pydantic.BaseModel], self._model).model_validate(raw))
        except pydantic.ValidationError as exc:
            raise InvalidPayload(_pydantic_message(self._model.__qualname__, exc)) from None

    def _encode_list(self, value: object) -> bytes:
        from .fanin import Failed, Ok, collect_element, fan_in_payload

        assert self._items is not None
        if not isinstance(value, list):
            raise EncodeError(f"expected a list for {self.name}, got {type(value).__qualname__}")
        parts: list[bytes] = []
        for item in value:
            if not self._outcomes:
                parts.append(self._items.encode(item))
            elif isinstance(item, Ok):
                parts.append(collect_element(self._items.encode(item.value), None))
            elif isinstance(item, Failed):
                parts.append(collect_element(None, _encoder.encode(item.error)))
            else:
                raise EncodeError(f"expected Ok or Failed items, got {type(item).__qualname__}")
        data = fan_in_payload(parts)
        if self.max_bytes is not None and len(data) > self.max_bytes:
            raise PayloadTooLarge(len(data), self.max_bytes, f"{self.name} payload")
        return data

    def _decode_list(self, data: bytes) -> T:
        from .errors import FailureRecord
        from .fanin import Failed, Ok

        items = self._items
        assert items is not None
        try:
            if not self._outcomes:
                return cast(T, [items.decode(raw) for raw in _raw_list.decode(data)])
            out: list[Ok[Any] | Failed] = []
            for index, (tag, raw) in enumerate(_raw_outcomes.decode(data)):
                if tag == "ok":
                    out.append(Ok(items.decode(raw)))
                elif tag == "failed":
                    out.append(Failed(msgspec.msgpack.decode(raw, type=FailureRecord)))
                else:
                    raise InvalidPayload(f"{self.name}: item {index} has tag {tag!r}")
            return cast(T, out)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise InvalidPayload(f"{self.name}: {exc}") from None

    @cached_property
    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of the model (for producers in other languages)."""
        if self._items is not None:
            inner = dict(self._items.json_schema)
            defs = inner.pop("$defs", None)
            item: dict[str, Any] = inner
            if self._outcomes:
                item = {
                    "anyOf": [
                        {"type": "array", "prefixItems": [{"const": "ok"}, inner]},
                        {"type": "array", "prefixItems": [{"const": "failed"}, {"type": "object"}]},
                    ]
                }
            array: dict[str, Any] = {"type": "array", "items": item}
            if defs is not None:
                array["$defs"] = defs
            return array
        if self._is_none:
            return {"type": "null"}
        if self._optional:
            # Hoist $defs to the root so the model's "#/$defs/..." references still resolve.
            inner = dict(self._model_schema())
            defs = inner.pop("$defs", None)
            schema: dict[str, Any] = {"anyOf": [inner, {"type": "null"}]}
            if defs is not None:
                schema["$defs"] = defs
            return schema
        return self._model_schema()

    def _model_schema(self) -> dict[str, Any]:
        if self._is_pydantic:
            return cast(type[pydantic.BaseModel], self._model).model_json_schema()
        schema: dict[str, Any] = msgspec.json.schema(self._model)
        return schema

    @cached_property
    def fingerprint(self) -> str:
        """16 hex digits identifying the model's schema; travels with every job."""
        canonical = json.dumps(self.json_schema, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _pydantic_message(model: str, exc: pydantic.ValidationError) -> str:
    parts = []
    for err in exc.errors()[:10]:
        loc = ".".join(str(p) for p in err["loc"]) or "$"
        parts.append(f"{err['msg']} - at `$.{loc}`" if loc != "$" else err["msg"])
    more = exc.error_count() - len(parts)
    suffix = f" (+{more} more)" if more > 0 else ""
    return f"{model}: " + "; ".join(parts) + suffix


_codecs: dict[tuple[object, int | None], Codec[Any]] = {}


def codec_for(tp: type[T], *, max_bytes: int | None = None) -> Codec[T]:
    """The (cached) codec of ``tp``."""
    key = (tp, max_bytes)
    codec = _codecs.get(key)
    if codec is None:
        codec = _codecs[key] = Codec(tp, max_bytes=max_bytes)
    return cast(Codec[T], codec)
