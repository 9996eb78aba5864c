"""Schema compatibility: what the schema registry keeps, and whether a model decodes
what an older schema wrote.

:func:`schema_record` is what a producer or worker records for one task (the broker's
schema registry, :mod:`typedq.broker.schemas`). :func:`check` compares an old JSON
Schema (the writer's: what old payloads look like) with a new one (the reader's: the
model that will decode them) and answers compatible or not, with a reason naming the
field, as ``typedq verify`` shows it. The rules follow what msgspec and Pydantic
actually accept when decoding (tests/unit/test_compat.py holds them to it):

- a field the reader requires that the writer may leave out: ``became required``;
- a field the writer may send that the reader does not know, while the reader forbids
  extra fields (``additionalProperties: false``: msgspec ``forbid_unknown_fields``,
  Pydantic ``extra="forbid"``): ``removed``;
- a value the writer may send that the reader's type refuses: ``type of `x` changed``
  (an integer still fits a number; ``null`` needs the reader to allow it; every enum
  value the writer may send must still be allowed; a bound the reader tightened, a
  pattern or format it added refuses some old values);
- objects, arrays, maps and unions are compared member by member, through ``$ref``.

A check is one-sided and conservative: ``compatible`` means every payload the old
schema allows decodes with the new one (as far as the schemas tell); anything the rules
cannot compare is ``unknown``, never guessed compatible. Knows no broker.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec.inspect as mi
import pydantic

from .broker.schemas import SchemaRecord
from .serde import Codec

__all__ = ["Verdict", "check", "decoding_schema", "schema_record"]


def schema_record(task: str, input_codec: Codec[Any], output_codec: Codec[Any]) -> SchemaRecord:
    """What a process records for ``task`` in the broker's schema registry: the input
    schema (of the fingerprint its jobs carry) and the output schema, each as
    :func:`decoding_schema` has it."""
    return SchemaRecord(
        task=task,
        fingerprint=input_codec.fingerprint,
        input_schema=_dump(decoding_schema(input_codec)),
        output_schema=_dump(decoding_schema(output_codec)),
    )


def decoding_schema(codec: Codec[Any]) -> dict[str, Any]:
    """The codec's JSON Schema with what msgpack tells apart and msgspec's JSON Schema
    does not: msgspec (0.23) writes ``datetime`` and ``time`` as a bare string, but
    msgpack carries a datetime as a timestamp that a ``str`` field refuses, so here they
    get their ``format`` (``date-time``, ``time``), as Pydantic writes them. The schema
    :func:`check` compares; the fingerprint stays the codec's own."""
    schema = codec.json_schema
    tp: Any = codec.type
    if isinstance(tp, type) and issubclass(tp, pydantic.BaseModel):
        return schema
    try:
        info = mi.type_info(tp)
    except Exception:
        return schema  # not msgspec's to describe (a fan-in's outcomes): as it is
    out = copy.deepcopy(schema)
    _Formats(out).walk(out, info, set())
    return out


class _Formats:
    """Adds the formats msgspec leaves out, walking its schema and its type info together."""

    def __init__(self, root: dict[str, Any]) -> None:
        self.defs: dict[str, Any] = root.get("$defs", {})

    def _node(self, node: Any) -> Any:
        ref = node.get("$ref") if isinstance(node, dict) else None
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return self.defs.get(ref[len("#/$defs/") :], node)
        return node

    def walk(self, node: Any, info: mi.Type, seen: set[int]) -> None:
        node = self._node(node)
        if not isinstance(node, dict):
            return
        if isinstance(info, mi.Metadata):
            self.walk(node, info.type, seen)
        elif isinstance(info, (mi.DateTimeType, mi.TimeType)):
            if node.get("type") == "string" and "format" not in node:
                node["format"] = "date-time" if isinstance(info, mi.DateTimeType) else "time"
        elif isinstance(info, mi.UnionType):
            members = [self._node(m) for m in node.get("anyOf", [])]
            for member_info in info.types:
                kind = _kind(member_info)
                matches = [m for m in members if isinstance(m, dict) and m.get("type") == kind]
                if kind is not None and len(matches) == 1:
                    self.walk(matches[0], member_info, seen)
        elif isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType)):
            self.walk(node.get("items"), info.item_type, seen)
        elif isinstance(info, mi.TupleType):
            for item, item_info in zip(node.get("prefixItems", []), info.item_types, strict=False):
                self.walk(item, item_info, seen)
        elif isinstance(info, mi.DictType):
            self.walk(node.get("additionalProperties"), info.value_type, seen)
        elif isinstance(info, mi.StructType) and id(node) not in seen:
            seen.add(id(node))
            if info.array_like:
                items = node.get("prefixItems", [])
                for item, field in zip(items, info.fields, strict=False):
                    self.walk(item, field.type, seen)
            else:
                properties = node.get("properties", {})
                for field in info.fields:
                    if field.encode_name in properties:
                        self.walk(properties[field.encode_name], field.type, seen)


def _kind(info: mi.Type) -> str | None:
    """The JSON type a union member of ``info`` is written as (msgspec allows one of
    each kind in a union), for the members worth walking into."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, (mi.DateTimeType, mi.TimeType)):
        return "string"
    if isinstance(info, (mi.ListType, mi.SetType, mi.FrozenSetType, mi.VarTupleType, mi.TupleType)):
        return "array"
    if isinstance(info, mi.DictType):
        return "object"
    if isinstance(info, mi.StructType):
        return "object"
    return None


def _dump(schema: Mapping[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Verdict:
    """The answer of :func:`check`: ``compatible``, ``incompatible`` or ``unknown``
    (the rules cannot compare it), with the reason (empty when compatible)."""

    verdict: str
    reason: str = ""

    @property
    def ok(self) -> bool:
        """True when compatible."""
        return self.verdict == "compatible"


COMPATIBLE = Verdict("compatible")


class _Incompatible(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Unknown(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def check(old: Mapping[str, Any], new: Mapping[str, Any]) -> Verdict:
    """Whether what ``old`` (a JSON Schema: the writer's) allows decodes with ``new``
    (the reader's), with the reason naming the first field that does not."""
    try:
        _Compare(old, new).value(old, new, "", set())
    except _Incompatible as exc:
        return Verdict("incompatible", exc.reason)
    except _Unknown as exc:
        return Verdict("unknown", exc.reason)
    return COMPATIBLE


#: Keywords that describe and do not constrain.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "discriminator",
        "$defs",
        "definitions",
        "$schema",
        "$id",
    }
)
#: Keywords the comparison understands (anything else that differs is ``unknown``).
_HANDLED = frozenset(
    {
        "type",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "uniqueItems",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "pattern",
        "format",
        "contentEncoding",
        "contentMediaType",
    }
)
_LOWER = (
    ("minimum", "exclusiveMinimum"),
    ("minLength", None),
    ("minItems", None),
    ("minProperties", None),
)
_UPPER = (
    ("maximum", "exclusiveMaximum"),
    ("maxLength", None),
    ("maxItems", None),
    ("maxProperties", None),
)
#: Keywords whose value must stay as it was (msgpack carries what they describe
#: differently: a datetime as a timestamp, bytes as bin; a new pattern refuses values).
_SAME = ("format", "contentEncoding", "contentMediaType", "pattern", "multipleOf")

_Node = Mapping[str, Any]


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _name(path: str) -> str:
    return f"`{path}`" if path else "the payload"


class _Compare:
    """One comparison of an old (writer's) and a new (reader's) schema document."""

    def __init__(self, old_root: _Node, new_root: _Node) -> None:
        self.roots = (old_root, new_root)

    def _deref(self, node: _Node, side: int) -> _Node:
        """``node`` with its ``$ref`` (and a one-member ``allOf``) resolved; the
        annotations beside a ``$ref`` are kept, the rest of the target wins."""
        for _ in range(64):
            if "$ref" in node:
                ref = node["$ref"]
                if not isinstance(ref, str) or not ref.startswith("#/"):
                    raise _Unknown(f"cannot resolve the reference {ref!r}")
                target: Any = self.roots[side]
                for part in ref[2:].split("/"):
                    if not isinstance(target, Mapping) or part not in target:
                        raise _Unknown(f"cannot resolve the reference {ref!r}")
                    target = target[part]
                rest = {k: v for k, v in node.items() if k != "$ref"}
                node = {**target, **rest}
                continue
            all_of = node.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1:
                rest = {k: v for k, v in node.items() if k != "allOf"}
                node = {**rest, **all_of[0]}
                continue
            return node
        raise _Unknown("references nest too deep")

    def _alternatives(self, node: _Node, side: int) -> list[_Node] | None:
        """The members of a union (``anyOf``, ``oneOf``, a list of types), flattened;
        None for a node that is not one."""
        for key in ("anyOf", "oneOf"):
            members = node.get(key)
            if isinstance(members, list):
                out: list[_Node] = []
                for member in members:
                    member = self._deref(member, side)
                    inner = self._alternatives(member, side)
                    out += inner if inner is not None else [member]
                return out
        types = node.get("type")
        if isinstance(types, list):
            rest = {k: v for k, v in node.items() if k != "type"}
            return [{**rest, "type": t} for t in types]
        return None

    def value(self, old: _Node, new: _Node, path: str, seen: set[tuple[int, int]]) -> None:
        """Raise _Incompatible (or _Unknown) unless every value ``old`` allows fits
        ``new``; ``path`` names the field."""
        old, new = self._deref(old, 0), self._deref(new, 1)
        pair = (id(old), id(new))
        if pair in seen:
            return  # a recursive model: this pair is being compared further up
        seen = seen | {pair}
        if not any(k not in _ANNOTATIONS for k in new):
            return  # the reader takes any value
        if not any(k not in _ANNOTATIONS for k in old):
            raise _Unknown(f"{_name(path)} took any value before")
        olds = self._alternatives(old, 0)
        if olds is not None:
            for member in olds:
                self.value(member, new, path, seen)
            return
        news = self._alternatives(new, 1)
        if news is not None:
            self._into_union(old, news, path, seen)
            return
        self._single(old, new, path, seen)

    def _into_union(
        self, old: _Node, news: list[_Node], path: str, seen: set[tuple[int, int]]
    ) -> None:
        failures: list[_Incompatible | _Unknown] = []
        for member in news:
            try:
                self.value(old, member, path, seen)
            except (_Incompatible, _Unknown) as exc:
                failures.append(exc)
            else:
                return
        old_type = old.get("type")
        if old_type == "null" or old.get("const", 0) is None:
            raise _Incompatible(f"{_name(path)} can no longer be null")
        # The member of the old value's type explains best; else the first.
        for member, failure in zip(news, failures, strict=True):
            if old_type is not None and member.get("type") == old_type:
                raise failure
        unknown = [f for f in failures if isinstance(f, _Unknown)]
        if unknown:
            raise unknown[0]
        kinds = " | ".join(str(m.get("type", "?")) for m in news)
        raise _Incompatible(f"type of {_name(path)} changed {_describe(old)} -> {kinds}")

    def _single(self, old: _Node, new: _Node, path: str, seen: set[tuple[int, int]]) -> None:
        old_enum = _enum(old)
        new_enum = _enum(new)
        if old_enum is not None:
            if new_enum is not None:
                gone = [v for v in old_enum if v not in new_enum]
                if gone:
                    raise _Incompatible(f"value {gone[0]!r} of {_name(path)} is no longer allowed")
                return
            for v in old_enum:
                # Each old value must fit the new type and its bounds.
                self._fits_value(v, new, path)
            return
        if new_enum is not None:
            raise _Incompatible(
                f"{_name(path)} became one of {new_enum!r}; old values may be others"
            )
        old_type, new_type = old.get("type"), new.get("type")
        if not isinstance(old_type, str) or not isinstance(new_type, str):
            raise _Unknown(f"cannot compare the schemas of {_name(path)}")
        if old_type != new_type and not (old_type == "integer" and new_type == "number"):
            if old_type == "null":
                raise _Incompatible(f"{_name(path)} can no longer be null")
            raise _Incompatible(f"type of {_name(path)} changed {old_type} -> {new_type}")
        self._keywords(old, new, path)
        if old_type == "object":
            self._object(old, new, path, seen)
        elif old_type == "array":
            self._array(old, new, path, seen)

    def _fits_value(self, value: object, new: _Node, path: str) -> None:
        """An old enum value against a new non-enum schema: its type and bounds."""
        kind = _json_type(value)
        new_type = new.get("type")
        if new_type != kind and not (kind == "integer" and new_type == "number"):
            raise _Incompatible(f"type of {_name(path)} changed {kind} -> {new_type}")
        probe: dict[str, Any] = {"type": kind}
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            probe.update(minimum=value, maximum=value)
        elif isinstance(value, str):
            probe.update(minLength=len(value), maxLength=len(value))
            if "pattern" in new or "format" in new:
                raise _Unknown(f"cannot tell whether {value!r} fits the pattern of {_name(path)}")
        self._keywords(probe, new, path)

    def _keywords(self, old: _Node, new: _Node, path: str) -> None:
        for key in new:
            if key not in _ANNOTATIONS and key not in _HANDLED and new[key] != old.get(key):
                raise _Unknown(f"cannot compare `{key}` of {_name(path)}")
        for key in _SAME:
            if old.get(key) != new.get(key):
                before, after = old.get(key, "none"), new.get(key, "none")
                raise _Incompatible(f"{key} of {_name(path)} changed {before} -> {after}")
        for plain, exclusive in _LOWER:
            if _bound(new, plain, exclusive, max) > _bound(old, plain, exclusive, max):
                raise _Incompatible(f"{_name(path)}: {plain} tightened")
        for plain, exclusive in _UPPER:
            if _bound(new, plain, exclusive, min, upper=True) < _bound(
                old, plain, exclusive, min, upper=True
            ):
                raise _Incompatible(f"{_name(path)}: {plain} tightened")

    def _object(self, old: _Node, new: _Node, path: str, seen: set[tuple[int, int]]) -> None:
        old_props: Mapping[str, Any] = old.get("properties") or {}
        new_props: Mapping[str, Any] = new.get("properties") or {}
        old_required = set(old.get("required") or ())
        new_extra = new.get("additionalProperties", True)
        old_extra = old.get("additionalProperties")
        prefix = f"{path}." if path else ""
        for field in new.get("required") or ():
            if field not in old_props:
                raise _Incompatible(f"field `{prefix}{field}` became required")
            if field not in old_required:
                raise _Incompatible(
                    f"field `{prefix}{field}` became required (the old schema lets "
                    "producers leave it out)"
                )
        for field, schema in old_props.items():
            if field in new_props:
                self.value(schema, new_props[field], prefix + field, seen)
            elif new_extra is False:
                raise _Incompatible(
                    f"field `{prefix}{field}` removed: old jobs carry it and the model "
                    "forbids extra fields"
                )
            elif isinstance(new_extra, Mapping):
                self.value(schema, new_extra, prefix + field, seen)
        if old_extra is not None and old_extra is not False:
            # The old model kept extra fields (a map, or Pydantic extra="allow").
            if new_extra is False and not old_props and not new_props:
                raise _Incompatible(f"{_name(path)} no longer takes extra keys")
            if new_extra is False:
                raise _Incompatible(
                    f"{_name(path)} forbids extra fields now; the old model allowed them"
                )
            if isinstance(new_extra, Mapping):
                old_values: _Node = old_extra if isinstance(old_extra, Mapping) else {}
                self.value(old_values, new_extra, f"{path}{{}}", seen)

    def _array(self, old: _Node, new: _Node, path: str, seen: set[tuple[int, int]]) -> None:
        old_prefix, new_prefix = old.get("prefixItems"), new.get("prefixItems")
        if old_prefix is not None or new_prefix is not None:
            if old_prefix is None or new_prefix is None or len(old_prefix) != len(new_prefix):
                raise _Incompatible(f"the items of {_name(path)} changed shape")
            for i, (o, n) in enumerate(zip(old_prefix, new_prefix, strict=True)):
                self.value(o, n, f"{path}[{i}]", seen)
            return
        old_items, new_items = old.get("items", {}), new.get("items", {})
        if isinstance(old_items, Mapping) and isinstance(new_items, Mapping):
            self.value(old_items, new_items, f"{path}[]", seen)
        elif old_items != new_items:
            raise _Unknown(f"cannot compare the items of {_name(path)}")


def _enum(node: _Node) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    values = node.get("enum")
    return list(values) if isinstance(values, list) else None


def _describe(node: _Node) -> str:
    return str(node.get("type", "?"))


def _bound(
    node: _Node, plain: str, exclusive: str | None, pick: Any, *, upper: bool = False
) -> float:
    """A node's effective lower (or upper) bound for ``plain``; an exclusive bound counts
    a hair inside its value. No bound: -inf (or +inf)."""
    found: list[float] = []
    if isinstance(node.get(plain), (int, float)):
        found.append(float(node[plain]))
    if exclusive is not None and isinstance(node.get(exclusive), (int, float)):
        value = float(node[exclusive])
        found.append(value - 1e-9 if upper else value + 1e-9)
    if not found:
        return float("inf") if upper else float("-inf")
    return float(pick(found))
