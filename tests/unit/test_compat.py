"""Schema compatibility (typedq.compat): each rule of ``typedq verify`` held to what
msgspec and Pydantic actually decode.

Property-style: per rule, an old model and a new one (built for msgspec and for
Pydantic alike), a payload the old schema allows (encoded by the old model's codec, or
written as the old schema lets a producer in another language write it), and the
assertion that the verdict of :func:`typedq.compat.check` on the two schemas agrees with
whether the new model's codec decodes the payload. No broker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec
import pydantic
import pytest

from typedq.compat import check, decoding_schema, schema_record
from typedq.errors import InvalidPayload
from typedq.serde import codec_for

REQUIRED = object()
#: A field's type for one library ("msgspec" or "pydantic").
TypeFor = Callable[[str], Any]


def same(tp: Any) -> TypeFor:
    return lambda lib: tp


def bounded(*, ge: int | None = None, le: int | None = None) -> TypeFor:
    def make(lib: str) -> Any:
        if lib == "msgspec":
            return Annotated[int, msgspec.Meta(ge=ge, le=le)]
        return Annotated[int, pydantic.Field(ge=ge, le=le)]

    return make


def nested(inner: dict[str, tuple[TypeFor, Any]], name: str = "Inner") -> TypeFor:
    return lambda lib: build(lib, name, inner, forbid=False)


def build(lib: str, name: str, fields: dict[str, tuple[TypeFor, Any]], *, forbid: bool) -> Any:
    """A msgspec Struct or Pydantic model with ``fields`` (name -> (type, default))."""
    if lib == "msgspec":
        spec: list[Any] = []
        for fname, (tp, default) in sorted(fields.items(), key=lambda f: f[1][1] is not REQUIRED):
            spec.append((fname, tp(lib)) if default is REQUIRED else (fname, tp(lib), default))
        return msgspec.defstruct(name, spec, forbid_unknown_fields=forbid)
    config = pydantic.ConfigDict(extra="forbid" if forbid else "ignore")
    defs: dict[str, Any] = {
        fname: (tp(lib), ... if default is REQUIRED else default)
        for fname, (tp, default) in fields.items()
    }
    return pydantic.create_model(name, __config__=config, **defs)


@dataclass
class Case:
    """One rule: old and new fields, the payload the old schema allows, and the reason
    expected (empty: compatible)."""

    id: str
    old: dict[str, tuple[TypeFor, Any]]
    new: dict[str, tuple[TypeFor, Any]]
    payload: dict[str, Any]
    reason: str = ""
    forbid: bool = False
    #: Send the payload as written (a producer following the old schema), not through
    #: the old model (whose encoder writes every field).
    raw: bool = False
    libs: tuple[str, ...] = field(default=("msgspec", "pydantic"))


INT, STR, FLOAT, BOOL = same(int), same(str), same(float), same(bool)

CASES = [
    Case("unchanged", {"id": (INT, REQUIRED)}, {"id": (INT, REQUIRED)}, {"id": 1}),
    Case(
        "optional field added",
        {"id": (INT, REQUIRED)},
        {"id": (INT, REQUIRED), "note": (STR, "")},
        {"id": 1},
    ),
    Case(
        "required field added",
        {"id": (INT, REQUIRED)},
        {"id": (INT, REQUIRED), "amount": (INT, REQUIRED)},
        {"id": 1},
        "field `amount` became required",
    ),
    Case(
        "optional field became required",
        {"id": (INT, REQUIRED), "amount": (INT, 0)},
        {"id": (INT, REQUIRED), "amount": (INT, REQUIRED)},
        {"id": 1},
        "field `amount` became required (the old schema lets producers leave it out)",
        raw=True,
    ),
    Case(
        "field removed, extra fields forbidden",
        {"id": (INT, REQUIRED), "x": (INT, 0)},
        {"id": (INT, REQUIRED)},
        {"id": 1, "x": 2},
        "field `x` removed: old jobs carry it and the model forbids extra fields",
        forbid=True,
    ),
    Case(
        "field removed, extra fields ignored",
        {"id": (INT, REQUIRED), "x": (INT, 0)},
        {"id": (INT, REQUIRED)},
        {"id": 1, "x": 2},
    ),
    Case(
        "integer became string",
        {"id": (INT, REQUIRED)},
        {"id": (STR, REQUIRED)},
        {"id": 7},
        "type of `id` changed integer -> string",
    ),
    Case("integer widened to number", {"v": (INT, REQUIRED)}, {"v": (FLOAT, REQUIRED)}, {"v": 3}),
    Case(
        "number narrowed to integer",
        {"v": (FLOAT, REQUIRED)},
        {"v": (INT, REQUIRED)},
        {"v": 1.5},
        "type of `v` changed number -> integer",
    ),
    Case(
        "integer became boolean",
        {"v": (INT, REQUIRED)},
        {"v": (BOOL, REQUIRED)},
        {"v": 5},
        "type of `v` changed integer -> boolean",
    ),
    Case(
        "no longer nullable",
        {"id": (INT, REQUIRED), "ref": (same(int | None), None)},
        {"id": (INT, REQUIRED), "ref": (INT, 0)},
        {"id": 1, "ref": None},
        "`ref` can no longer be null",
    ),
    Case(
        "became nullable",
        {"ref": (INT, REQUIRED)},
        {"ref": (same(int | None), REQUIRED)},
        {"ref": 4},
    ),
    Case(
        "literal value dropped",
        {"kind": (same(Literal["a", "b"]), REQUIRED)},
        {"kind": (same(Literal["a"]), REQUIRED)},
        {"kind": "b"},
        "value 'b' of `kind` is no longer allowed",
    ),
    Case(
        "literal value added",
        {"kind": (same(Literal["a"]), REQUIRED)},
        {"kind": (same(Literal["a", "b"]), REQUIRED)},
        {"kind": "a"},
    ),
    Case(
        "literal widened to string",
        {"kind": (same(Literal["a", "b"]), REQUIRED)},
        {"kind": (STR, REQUIRED)},
        {"kind": "b"},
    ),
    Case(
        "string narrowed to literal",
        {"kind": (STR, REQUIRED)},
        {"kind": (same(Literal["a"]), REQUIRED)},
        {"kind": "zzz"},
        "`kind` became one of ['a']; old values may be others",
    ),
    Case(
        "nested field changed type",
        {"inner": (nested({"z": (INT, REQUIRED)}), REQUIRED)},
        {"inner": (nested({"z": (STR, REQUIRED)}), REQUIRED)},
        {"inner": {"z": 1}},
        "type of `inner.z` changed integer -> string",
    ),
    Case(
        "nested model renamed",
        {"inner": (nested({"z": (INT, REQUIRED)}, "Inner"), REQUIRED)},
        {"inner": (nested({"z": (INT, REQUIRED)}, "Renamed"), REQUIRED)},
        {"inner": {"z": 1}},
    ),
    Case(
        "list items changed type",
        {"xs": (same(list[int]), REQUIRED)},
        {"xs": (same(list[str]), REQUIRED)},
        {"xs": [1, 2]},
        "type of `xs[]` changed integer -> string",
    ),
    Case(
        "list items widened",
        {"xs": (same(list[int]), REQUIRED)},
        {"xs": (same(list[float]), REQUIRED)},
        {"xs": [1, 2]},
    ),
    Case(
        "map values changed type",
        {"m": (same(dict[str, int]), REQUIRED)},
        {"m": (same(dict[str, str]), REQUIRED)},
        {"m": {"a": 1}},
        "type of `m{}` changed integer -> string",
    ),
    Case(
        "lower bound tightened",
        {"n": (bounded(ge=0), REQUIRED)},
        {"n": (bounded(ge=10), REQUIRED)},
        {"n": 5},
        "`n`: minimum tightened",
    ),
    Case(
        "upper bound loosened",
        {"n": (bounded(le=10), REQUIRED)},
        {"n": (bounded(le=100), REQUIRED)},
        {"n": 5},
    ),
    Case(
        "union member dropped",
        {"x": (same(int | str), REQUIRED)},
        {"x": (INT, REQUIRED)},
        {"x": "a"},
        "type of `x` changed string -> integer",
    ),
    Case(
        "union member added",
        {"x": (INT, REQUIRED)},
        {"x": (same(int | str), REQUIRED)},
        {"x": 3},
    ),
    Case(
        "datetime unchanged",
        {"at": (same(datetime), REQUIRED)},
        {"at": (same(datetime), REQUIRED)},
        {"at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)},
    ),
    Case(
        "datetime became string",
        {"at": (same(datetime), REQUIRED)},
        {"at": (STR, REQUIRED)},
        {"at": datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)},
        "format of `at` changed date-time -> none",
    ),
    Case(
        "field order and defaults changed",
        {"a": (INT, REQUIRED), "b": (STR, "x")},
        {"b": (STR, "y"), "a": (INT, REQUIRED)},
        {"a": 1, "b": "z"},
    ),
]


def _payload(lib: str, case: Case, old: Any) -> bytes:
    if case.raw:
        data = msgspec.msgpack.encode(case.payload)
        codec_for(old).decode(data)  # the old schema allows it
        return data
    value = msgspec.convert(case.payload, old) if lib == "msgspec" else old(**case.payload)
    return codec_for(old).encode(value)


@pytest.mark.parametrize("lib", ["msgspec", "pydantic"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_verdict_agrees_with_decoding(lib: str, case: Case) -> None:
    old = build(lib, "Payload", case.old, forbid=False)
    new = build(lib, "Payload", case.new, forbid=case.forbid)
    data = _payload(lib, case, old)
    try:
        codec_for(new).decode(data)
    except InvalidPayload:
        decodes = False
    else:
        decodes = True
    verdict = check(decoding_schema(codec_for(old)), decoding_schema(codec_for(new)))
    assert verdict.ok == decodes, (verdict, decodes)
    assert verdict.reason == case.reason
    assert verdict.verdict == ("compatible" if not case.reason else "incompatible")


def test_a_record_holds_the_schemas_the_fingerprint_is_made_of() -> None:
    model = build("msgspec", "Payload", {"id": (INT, REQUIRED)}, forbid=False)
    record = schema_record("t", codec_for(model), codec_for(type(None)))
    assert record.fingerprint == codec_for(model).fingerprint
    assert json.loads(record.input_schema) == decoding_schema(codec_for(model))
    assert json.loads(record.output_schema) == {"type": "null"}


class Node(msgspec.Struct):
    value: int
    children: list[Node] = []


def test_a_recursive_model_compares() -> None:
    assert check(codec_for(Node).json_schema, codec_for(Node).json_schema).ok


def test_what_the_rules_cannot_compare_is_unknown_not_compatible() -> None:
    old = {"type": "object", "properties": {"a": {"type": "string"}}}
    new = {"type": "object", "properties": {"a": {"type": "string", "if": {"minLength": 3}}}}
    verdict = check(old, new)
    assert verdict.verdict == "unknown"
    assert "`if` of `a`" in verdict.reason
    assert check({"type": "object"}, {"not": {"type": "object"}}).verdict == "unknown"


class MInner(msgspec.Struct):
    z: int


class MPayload(msgspec.Struct):
    a: int
    b: str | None = None
    inner: MInner | None = None
    kind: Literal["x", "y"] = "x"


class PInner(pydantic.BaseModel):
    z: int


class PPayload(pydantic.BaseModel):
    a: int
    b: str | None = None
    inner: PInner | None = None
    kind: Literal["x", "y"] = "x"


def test_moving_a_model_between_msgspec_and_pydantic_is_compatible() -> None:
    m, p = codec_for(MPayload), codec_for(PPayload)
    assert m.fingerprint != p.fingerprint
    assert check(m.json_schema, p.json_schema).ok
    assert check(p.json_schema, m.json_schema).ok
    data = m.encode(MPayload(1, "b", MInner(2), "y"))
    assert p.decode(data) == PPayload(a=1, b="b", inner=PInner(z=2), kind="y")
